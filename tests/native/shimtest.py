"""Helpers of the native-shim tests: gcc, the daemon stand-in, the verbs client.

Everything is real: the fake verbs provider is a shared library with the
soname libibverbs.so.1 that programs load through LD_LIBRARY_PATH (see
c/fake_verbs.c), the shim is the installed liblaxflow_shim.so under
LD_PRELOAD, and the "daemon" is a real shared-memory segment with a heartbeat
thread, driven through laxflow.protocol.shm as the node daemon drives it.
"""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from laxflow.protocol.shm import CommandKind, Segment

C_DIR = Path(__file__).parent / "c"
_names = itertools.count()


def gcc(out: Path, *args: str) -> Path:
    """Compile with gcc; a failure shows the compiler's message."""
    proc = subprocess.run(["gcc", *args, "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"gcc {' '.join(args)} failed:\n{proc.stderr}")
    return out


@dataclass(frozen=True)
class NativeBin:
    fakelib_dir: Path   # holds the fake libibverbs.so.1
    verbs_client: Path  # c/verbs_client.c, linked with -libverbs


# A live test daemon's staleness window.  Its beat comes from a Python thread
# of the test process, which a garbage collection or a loaded machine can
# stop for a second or more (0.6 s measured mid-suite on 2 cores); a daemon a
# test means to keep alive must not look dead across such a pause.  A test
# that means it to die says so with hang(), which sets a short window.
LIVE_NS = 120_000_000_000


class Daemon:
    """The node daemon's side of the segment, with a heartbeat thread."""

    def __init__(self, stale_ns: int = LIVE_NS, name: str | None = None) -> None:
        self.name = name or f"/lxf-test-{os.getpid()}-{next(_names)}"
        Segment.unlink_name(self.name)
        self.seg = Segment.create(self.name, stale_ns=stale_ns)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.is_set():
            self.seg.heartbeat()
            time.sleep(0.005)

    def stop_heartbeat(self) -> None:
        self._stop.set()
        self._thread.join()

    def hang(self, stale_ns: int) -> None:
        """The daemon stops beating; shims see it dead stale_ns after its last beat."""
        self.seg.stale_ns = stale_ns
        self.stop_heartbeat()

    def close(self) -> None:
        self.stop_heartbeat()
        self.seg.close()


def client_env(native_bin: NativeBin, log: Path | None, shim: Path | None = None,
               shm_name: str | None = None, runtime: Path | None = None, **extra: str) -> dict[str, str]:
    """Environment of a verbs program: the fake provider, its log, the shim
    preloaded (after a sanitizer runtime, which must come first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "FAKEVERBS_", "LD_PRELOAD"))}
    env["LD_LIBRARY_PATH"] = str(native_bin.fakelib_dir)
    if log is not None:
        env["FAKEVERBS_LOG"] = str(log)
    preload = [str(p) for p in (runtime, shim) if p is not None]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    env["LAXFLOW_SHM_NAME"] = shm_name or f"/lxf-absent-{os.getpid()}"
    # Tests that hold gates closed must not race the maximum deferral age on
    # a loaded machine; the tests of that bound set it themselves.
    env["LAXFLOW_MAX_DEFER_MS"] = "600000"
    env.update(extra)
    return env


class Client:
    """A running verbs_client, read line by line."""

    def __init__(self, native_bin: NativeBin, args: list[str], env: dict[str, str], **popen) -> None:
        """popen: more arguments of subprocess.Popen (user=, group=, extra_groups= to run it as another user)."""
        self.proc = subprocess.Popen([str(native_bin.verbs_client), *args], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.out.append(line)
            self.lines.put(line.rstrip("\n"))
        self.lines.put("")  # EOF

    def expect(self, prefix: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line
            if line == "" and self.proc.poll() is not None:
                raise AssertionError(f"client ended before {prefix!r}: {self.proc.stderr.read()}")

    def send(self, line: str = "go") -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def qps(self) -> tuple[int, list[int]]:
        fields = self.expect("QPS ").split()
        return int(fields[1]), [int(x) for x in fields[2:]]

    def plan(self, nqps: int, nphases: int) -> dict[tuple[int, int], int]:
        plan = {}
        for _ in range(nqps * nphases):
            _, qp, phase, nbytes = self.expect("PLAN ").split()
            plan[int(qp), int(phase)] = int(nbytes)
        return plan

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)


def run_client(native_bin: NativeBin, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(native_bin.verbs_client), *args], env=env, capture_output=True, text=True, timeout=60)


def log_by_qp(log: Path) -> dict[str, list[str]]:
    """POST lines of a fake-verbs log grouped per QP, in posting order."""
    per_qp: dict[str, list[str]] = defaultdict(list)
    for line in log.read_text().splitlines():
        if line.startswith("POST "):
            per_qp[line.split()[1]].append(line)
    return dict(per_qp)


def wait_for(cond, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll cond() until true; fail naming what did not happen."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def proc_slot(seg: Segment, pid: int):
    slots = [p for p in seg.raw.procs if p.pid == pid]
    assert slots, f"pid {pid} not attached"
    return slots[0]


def kick_sync(seg: Segment, pid: int) -> None:
    """Return once the shim of pid has run a full release pass after this
    call: two KICK commands, the second sent after the first was taken; the
    progress thread handles a batch before it takes the next."""
    slot = proc_slot(seg, pid)
    for _ in range(2):
        assert seg.send_command(pid, CommandKind.KICK)
        want = slot.cmds.tail
        wait_for(lambda: slot.cmds.head >= want, what="the shim to take a KICK")


def post_count(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.startswith("POST "))


def chains_by_thread(log: Path) -> dict[tuple[str, int], list[tuple[str, ...]]]:
    """Each poster thread's chains on each QP, in order; a chain is the WRs
    of one post_send call (the call counter itself is left out, as threads
    sharing a QP interleave differently from run to run)."""
    calls: dict[tuple[str, str], list[str]] = {}
    for line in log.read_text().splitlines():
        if line.startswith("POST "):
            fields = line.split()
            wr = " ".join(f for f in fields if not f.startswith("call="))
            calls.setdefault((fields[1], fields[2]), []).append(wr)
    out: dict[tuple[str, int], list[tuple[str, ...]]] = {}
    for (qp, _), wrs in calls.items():
        thread = int(wrs[0].split("wr_id=")[1].split()[0]) >> 32
        out.setdefault((qp, thread), []).append(tuple(wrs))
    return out


def flap_stress(native_bin: NativeBin, shim: Path, daemon: Daemon, tmp_path: Path, args: list[str],
                runtime: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
    """Run verbs_client args (NPHASES phases, several threads per QP) under
    the shim while a thread flips every message's gate open and closed at
    random; then open all.  Checks that every chain reached the device
    exactly once, whole, in each thread's order, and that the daemon saw one
    completion per message.  Returns the client's outcome (stderr holds any
    sanitizer report)."""
    import random

    nqps, nphases = int(args[1]), int(args[3])
    ref_log = tmp_path / "reference.log"
    ref = run_client(native_bin, args, client_env(native_bin, ref_log, runtime=runtime, **extra))
    assert ref.returncode == 0, ref.stderr
    log = tmp_path / "shim.log"
    client = Client(native_bin, [*args, "--wait"], client_env(native_bin, log, shim, daemon.name, runtime, **extra))
    pid, qps = client.qps()
    plan = client.plan(nqps, nphases)
    msgs: list[int] = []
    stop = threading.Event()

    def flap() -> None:
        rng = random.Random(5)
        while not stop.is_set():
            for m in list(msgs):
                daemon.seg.set_permit(m, rng.choice([0, 1]))
            time.sleep(0.0002)

    flapper = threading.Thread(target=flap)
    flapper.start()
    try:
        for phase in range(nphases):
            msgs += [daemon.seg.tag_qp(pid, qp, request_id=1000 + qp, stage=3, layer=phase, bytes=plan[qp, phase])
                     for qp in qps]
            client.send()
            client.expect(f"POSTED {phase}", timeout=120)
    finally:
        stop.set()
        flapper.join()
    for m in msgs:
        daemon.seg.set_permit(m, 1)
    rc = client.wait(timeout=180)
    stderr = client.proc.stderr.read()
    assert rc == 0, stderr
    assert chains_by_thread(log) == chains_by_thread(ref_log)
    counters = daemon.seg.counters()
    assert counters["wr_deferred"] == counters["wr_released"] > 0
    events = daemon.seg.drain_events()
    assert sorted(events[events["kind"] == 2]["msg_id"].tolist()) == sorted(msgs)
    return subprocess.CompletedProcess(args, rc, "".join(client.out), stderr)
