"""TCP tagging by the shim: DSCP on the wire (scapy on loopback), accept, thread tags."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from laxflow.protocol.shm import EventKind, Gate

scapy_all = pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, AsyncSniffer  # noqa: E402

LAXFLOW = shutil.which("laxflow") or str(Path(sys.executable).parent / "laxflow")

CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"x" * 3000)
s.close()
"""

SERVER = """
import socket
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
print(ls.getsockname()[1], flush=True)
c, _ = ls.accept()
c.sendall(b"hello" * 600)
c.close()
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root")


def plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}


def capture(port: int, action) -> list:
    """Packets to or from port on lo while action() runs."""
    ready = threading.Event()
    sniffer = AsyncSniffer(
        iface="lo",
        lfilter=lambda p: TCP in p and port in (p[TCP].sport, p[TCP].dport),
        started_callback=ready.set,
        store=True,
    )
    sniffer.start()
    assert ready.wait(5), "sniffer did not start"
    time.sleep(0.05)
    action()
    time.sleep(0.3)
    sniffer.stop()
    return list(sniffer.results)


def serve_once() -> tuple[int, threading.Thread]:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)

    def run() -> None:
        conn, _ = ls.accept()
        while conn.recv(65536):
            pass
        conn.close()
        ls.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return ls.getsockname()[1], t


def client_dscps(prefix: list[str]) -> set[int]:
    port, server = serve_once()
    cmd = [*prefix, sys.executable, "-c", CLIENT, str(port)]
    packets = capture(port, lambda: subprocess.run(cmd, env=plain_env(), check=True, timeout=60))
    server.join(5)
    from_client = [p for p in packets if p[TCP].dport == port]
    assert any(p[TCP].flags.S for p in from_client), "no SYN captured"
    assert sum(len(p[TCP].payload) for p in from_client) >= 3000
    return {p[IP].tos >> 2 for p in from_client}


@needs_root
def test_laxflow_run_dscp_marks_every_client_packet():
    assert client_dscps([LAXFLOW, "run", "--dscp", "46", "--"]) == {46}  # SYN included
    assert client_dscps([]) == {0}


@needs_root
def test_accepted_connection_is_marked():
    server = subprocess.Popen([LAXFLOW, "run", "--dscp", "10", "--", sys.executable, "-c", SERVER],
                              env=plain_env(), stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())

        def talk() -> None:
            with socket.create_connection(("127.0.0.1", port)) as s:
                while s.recv(65536):
                    pass

        packets = capture(port, talk)
    finally:
        server.wait(30)
    data = [p for p in packets if p[TCP].sport == port and len(p[TCP].payload)]
    assert data and {p[IP].tos >> 2 for p in data} == {10}


THREAD_TAG = """
import ctypes, socket, sys
shim = ctypes.CDLL(sys.argv[1])
shim.laxflow_shim_set_tag.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int]
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(4)
def tos_of_connect():
    s = socket.create_connection(ls.getsockname())
    c, _ = ls.accept()
    tos = (s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS), c.getsockopt(socket.IPPROTO_IP, socket.IP_TOS))
    s.close(); c.close()
    return tos
print("untagged", *tos_of_connect())
assert shim.laxflow_shim_set_tag(7, 3, 12, 34) == 0
print("tagged", *tos_of_connect())
assert shim.laxflow_shim_set_tag(7, 3, 12, 64) == -1
shim.laxflow_shim_clear_tag()
print("cleared", *tos_of_connect())
"""


def test_thread_tag_sets_tos_on_connect_and_accept(shim_lib):
    env = plain_env()
    env["LD_PRELOAD"] = str(shim_lib)
    env["LAXFLOW_SHM_NAME"] = f"/lxf-absent-{os.getpid()}"
    out = subprocess.run([sys.executable, "-c", THREAD_TAG, str(shim_lib)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    # the listener and both ends run on the tagging thread
    assert out.splitlines() == ["untagged 0 0", f"tagged {34 << 2} {34 << 2}", "cleared 0 0"]
    env["LAXFLOW_DSCP"] = "8"
    out = subprocess.run([sys.executable, "-c", THREAD_TAG, str(shim_lib)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == [f"untagged {8 << 2} {8 << 2}", f"tagged {34 << 2} {34 << 2}", f"cleared {8 << 2} {8 << 2}"]


ECHO = """
import socket, threading
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
def serve():
    c, _ = ls.accept()
    while (b := c.recv(4096)):
        c.sendall(b[::-1])
    c.close()
threading.Thread(target=serve).start()
s = socket.create_connection(ls.getsockname())
for i in range(50):
    s.sendall(str(i * 7919).encode())
    print(s.recv(4096).decode())
s.close()
"""


def test_socket_program_without_daemon_behaves_identically(shim_lib):
    run = lambda env: subprocess.run([sys.executable, "-c", ECHO], env=env, capture_output=True,  # noqa: E731
                                     timeout=60, check=True)
    ref = run(plain_env())
    env = plain_env()
    env["LD_PRELOAD"] = str(shim_lib)
    env["LAXFLOW_SHM_NAME"] = f"/lxf-absent-{os.getpid()}"
    under = run(env)
    assert (under.stdout, under.stderr) == (ref.stdout, ref.stderr)


@needs_root
def test_listening_socket_marks_the_syn_ack():
    """The listener gets the class before listen(): the SYN-ACK, the first
    packet of an accepted connection, already carries it."""
    server = subprocess.Popen([LAXFLOW, "run", "--dscp", "10", "--", sys.executable, "-c", SERVER],
                              env=plain_env(), stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())

        def talk() -> None:
            with socket.create_connection(("127.0.0.1", port)) as s:
                while s.recv(65536):
                    pass

        packets = capture(port, talk)
    finally:
        server.wait(30)
    syn_acks = [p for p in packets if p[TCP].sport == port and p[TCP].flags.S and p[TCP].flags.A]
    assert syn_acks and {p[IP].tos >> 2 for p in syn_acks} == {10}


FLOW = """
import os, socket, sys
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
s = socket.create_connection(ls.getsockname()); c, _ = ls.accept()
print(os.getpid(), s.fileno(), flush=True)
for line in sys.stdin:
    how, n = line.split(); n = int(n)
    if how == "send":
        s.sendall(b"a" * n)
    elif how == "sendmsg":
        s.sendmsg([b"b" * (n // 2), b"c" * (n - n // 2)])
    elif how == "write":
        os.write(s.fileno(), b"d" * n)
    else:
        os.writev(s.fileno(), [b"e" * (n // 3), b"f" * (n - n // 3)])
    got = 0
    while got < n:
        got += len(c.recv(65536))
    print(s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS), flush=True)
"""


def test_socket_flow_tags_set_the_class_per_message_and_report_bytes(shim_lib, daemon):
    """One persistent connection carries messages of different classes: the
    class follows each message's flow tag (one setsockopt per change), and
    each message is a SUBMIT then a COMPLETION once its bytes are written,
    through send, sendmsg, write and writev."""
    env = plain_env()
    env.update(LD_PRELOAD=str(shim_lib), LAXFLOW_SHM_NAME=daemon.name)
    proc = subprocess.Popen([sys.executable, "-c", FLOW], env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        pid, fd = map(int, proc.stdout.readline().split())
        daemon.seg.drain_events()
        steps = [("send", 12, 3000), ("sendmsg", 34, 2000), ("write", 34, 1000), ("writev", 46, 1500)]
        msgs = []
        for i, (how, dscp, n) in enumerate(steps):
            msgs.append(daemon.seg.tag_socket(pid, fd, request_id=70 + i, stage=3, layer=i, bytes=n, dscp=dscp))
            proc.stdin.write(f"{how} {n}\n")
            proc.stdin.flush()
            assert int(proc.stdout.readline()) == dscp << 2, how
        ev = daemon.seg.drain_events()
        submits = ev[ev["kind"] == EventKind.SUBMIT]
        completions = ev[ev["kind"] == EventKind.COMPLETION]
        assert submits["msg_id"].tolist() == msgs == completions["msg_id"].tolist()
        assert submits["bytes"].tolist() == [n for _, _, n in steps]
        assert set(submits["handle"].tolist()) == {fd} and set(submits["pid"].tolist()) == {pid}
        assert submits["layer"].tolist() == [0, 1, 2, 3]
        c = daemon.seg.counters()
        assert c["sock_msgs"] == 4 and c["sock_tos_set"] == 3  # 12, 34, 46: the repeated 34 set nothing
        # a tag that leaves the class open (-1) takes the permit's DSCP
        m = daemon.seg.tag_socket(pid, fd, request_id=90, stage=1, layer=0, bytes=500, dscp=-1)
        daemon.seg.set_permit(m, Gate.OPEN, dscp=20)
        proc.stdin.write("send 500\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 20 << 2
        daemon.seg.drain_events()
        # an untagged write on the same socket passes through, class kept
        daemon.seg.remove_tag(pid, 2, fd)
        proc.stdin.write("send 100\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 20 << 2
        assert len(daemon.seg.drain_events()) == 0
    finally:
        proc.stdin.close()
        proc.wait(30)


DRAIN = """
import os, socket, sys, time
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
s = socket.create_connection(ls.getsockname()); c, _ = ls.accept()
s.setblocking(False)
sent = got = 0
print(os.getpid(), s.fileno(), flush=True)
for line in sys.stdin:
    cmd = line.split()[0]
    if cmd == "fill":  # the peer reads nothing: bytes stay unacknowledged
        try:
            while True:
                sent += s.send(b"a" * 65536)
        except BlockingIOError:
            pass
    elif cmd == "poke":
        try:
            sent += s.send(b"b")
        except BlockingIOError:
            pass
    elif cmd == "drain":
        while got < sent:
            got += len(c.recv(1 << 20))
        while True:  # until the peer's ACKs are in
            import fcntl, struct, termios
            if struct.unpack("i", fcntl.ioctl(s.fileno(), termios.TIOCOUTQ, b"0000"))[0] == 0:
                break
            time.sleep(0.001)
    elif cmd == "sleep":
        time.sleep(0.05)
    print(s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS), flush=True)
"""


def test_class_change_waits_until_the_connection_drains(shim_lib, daemon):
    """A message in a new class does not re-mark bytes still unacknowledged on the
    connection (they would leave in the new class and reorder at priority queues):
    the change waits for the drain, or LXF_CLASS_DRAIN_NS at most."""
    env = plain_env()
    env.update(LD_PRELOAD=str(shim_lib), LAXFLOW_SHM_NAME=daemon.name)
    proc = subprocess.Popen([sys.executable, "-c", DRAIN], env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)

    def step(cmd: str) -> int:
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        return int(proc.stdout.readline()) >> 2

    try:
        pid, fd = map(int, proc.stdout.readline().split())
        daemon.seg.tag_socket(pid, fd, request_id=1, stage=3, layer=0, bytes=1 << 30, dscp=12)
        assert step("fill") == 12
        daemon.seg.tag_socket(pid, fd, request_id=2, stage=2, layer=0, bytes=1 << 30, dscp=46)
        assert step("poke") == 12  # unacknowledged bytes of the first message: class kept
        assert step("drain") == 12
        assert step("poke") == 46  # drained: the new message's class
        assert step("fill") == 46  # the peer reads nothing again
        daemon.seg.tag_socket(pid, fd, request_id=3, stage=1, layer=0, bytes=1 << 30, dscp=20)
        assert step("poke") == 46
        assert step("sleep") == 46
        assert step("poke") == 20  # still unacknowledged, but put off past the bound: the permit's class wins
    finally:
        proc.stdin.close()
        proc.wait(30)
