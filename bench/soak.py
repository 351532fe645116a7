"""Soak: the loopback cluster under continuous traffic, with -9 kills and restarts.

``python bench/soak.py --minutes 60 --json`` runs, on loopback:

* a ``laxflow coordinator`` process and two ``laxflow daemon`` processes
  (nodes n0 and n1, each with a ports file, reporting to the coordinator);
* a Mooncake target (a plain ``mooncake.engine.TransferEngine`` holding a
  buffer, plus a TCP echo server) under ``laxflow run`` on n1's segment;
* an initiator under ``laxflow run`` on n0's segment: Mooncake TCP through
  ``laxflow.adapters.mooncake`` in a loop (write ``--msg-bytes`` of fresh
  random bytes, read them back into a zeroed buffer, compare), a socket echo
  loop (64 KiB chunks, compared), and a hooks thread that reports a batch to
  n0's daemon every 0.2 s (register_request, batch_formed, layer_begin/end,
  request_done: the stream of reports the coordinator receives).

Every ``--kill-every`` seconds (from warm-up + half of it) a process is killed
with SIGKILL and restarted after ``--down-s``, alternating daemon n0 (the
initiator's: its shim re-attaches to the new segment) and the coordinator
(restarted on the same ports: the daemons reconnect and resync). Daemon n1,
the target and the initiator live through the run, so their memory slope is
measured over the whole run past warm-up.

Every ``--sample-every`` seconds it samples each process's resident memory
and open file descriptors (/proc), the /dev/shm entry count and both segments'
counters (``events_dropped``: the ring drops). At the end it prints one JSON
object (see :func:`report`); errors (a failed or mismatched transfer or echo,
a hooks call that raised, a worker that died) are counted and must be 0.

Everything it starts runs in its own session and is killed, and every segment
and doorbell it made is removed, on any exit (end, failure, Ctrl-C, SIGTERM).
``--role target|initiator`` are the worker processes (internal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
LAXFLOW = str(Path(sys.executable).with_name("laxflow"))
SHM_DIR = Path("/dev/shm")
ECHO_CHUNK = 64 << 10


# ============================================================ worker processes


def _stop_on_eof(stop: threading.Event) -> None:
    """Set ``stop`` when the driver closes our stdin (or SIGTERM arrives)."""
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()


def role_target(msg_bytes: int, slots: int) -> None:
    """The passive side: a Mooncake buffer and a TCP echo server; exits when stdin closes."""
    import numpy as np
    from mooncake.engine import TransferEngine

    stop = threading.Event()
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.zeros(msg_bytes * slots, np.uint8)
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    server = socket.create_server(("127.0.0.1", 0))

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(json.dumps({"port": engine.get_rpc_port(), "addr": buf.ctypes.data, "slots": slots,
                      "echo_port": server.getsockname()[1]}), flush=True)
    _stop_on_eof(stop)
    stop.wait()


def role_initiator(spec: dict) -> None:
    """Mooncake write+read and socket echo loops, byte-verified; a status line on stdout every second."""
    import numpy as np

    import laxflow.adapters.mooncake as mc
    from laxflow.hooks import HooksClient, request_key

    stop = threading.Event()
    _stop_on_eof(stop)
    msg = spec["msg_bytes"]
    st = {"iterations": 0, "bytes_verified": 0, "errors": 0, "error_samples": [], "worst_stall_s": 0.0,
          "stalls_over_1s": 0, "stalls": [], "socket_bytes_verified": 0, "socket_reconnects": 0, "hooks_batches": 0,
          "hooks_errors": 0, "hooks_worst_call_s": 0.0}
    lock = threading.Lock()

    def error(what: str) -> None:
        with lock:
            st["errors"] += 1
            if len(st["error_samples"]) < 20:
                st["error_samples"].append(f"{time.time():.3f} {what}")

    def echo_loop() -> None:
        rng = np.random.default_rng(7)
        conn = None
        while not stop.is_set():
            try:
                if conn is None:
                    conn = socket.create_connection(("127.0.0.1", spec["echo_port"]), timeout=10)
                data = rng.integers(0, 256, ECHO_CHUNK, dtype=np.uint8).tobytes()
                conn.sendall(data)
                got = bytearray()
                while len(got) < len(data):
                    part = conn.recv(len(data) - len(got))
                    if not part:
                        raise ConnectionError("echo server closed the connection")
                    got += part
                if bytes(got) != data:
                    error("socket echo: bytes differ")
                else:
                    with lock:
                        st["socket_bytes_verified"] += len(data)
                time.sleep(0.01)
            except OSError as exc:
                error(f"socket echo: {exc!r}")
                with contextlib.suppress(OSError):
                    conn and conn.close()
                conn = None
                with lock:
                    st["socket_reconnects"] += 1
                time.sleep(0.2)

    def hooks_loop() -> None:
        hooks = HooksClient(spec["hooks"])
        n = 0
        while not stop.is_set():
            n += 1
            rid, bid = f"hk-{n}", f"hb-{n}"
            t0 = time.monotonic()
            try:
                hooks.register_request(rid, deadline=time.time() + 5, prompt_tokens=512)
                hooks.batch_formed(bid, [rid], compute_s=0.01, traffic={"eth0": {rid: 4e6}})
                hooks.layer_begin(bid, 0)
                hooks.layer_end(bid, 0, last=True)
                hooks.request_done(rid)
                with lock:
                    st["hooks_batches"] += 1
            except Exception as exc:  # noqa: BLE001 - hooks must fail open; anything raised is an error
                with lock:
                    st["hooks_errors"] += 1
                error(f"hooks: {exc!r}")
            with lock:
                st["hooks_worst_call_s"] = max(st["hooks_worst_call_s"], time.monotonic() - t0)
            stop.wait(0.2)
        hooks.close()

    eng = mc.TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.zeros(msg, np.uint8)
    dst = np.zeros(msg, np.uint8)
    assert eng.register_memory(src.ctypes.data, msg) == 0
    assert eng.register_memory(dst.ctypes.data, msg) == 0
    target = f"127.0.0.1:{spec['port']}"
    threading.Thread(target=echo_loop, daemon=True).start()
    threading.Thread(target=hooks_loop, daemon=True).start()

    def status() -> str:
        with lock:
            out = dict(st, error_samples=list(st["error_samples"]), stalls=list(st["stalls"]))
        out["gate"] = dict(eng.gate.stats)
        out["adapter"] = dict(eng.stats)
        return json.dumps(out)

    def reporter() -> None:
        while not stop.wait(1.0):
            print(status(), flush=True)

    threading.Thread(target=reporter, daemon=True).start()
    rng = np.random.default_rng(1)
    i = 0
    while not stop.is_set():
        i += 1
        off = (i % spec["slots"]) * msg
        src[:] = rng.integers(0, 256, msg, dtype=np.uint8)
        dst.fill(0)
        key = request_key(f"mc-{i // 64}")
        t0 = time.monotonic()
        try:
            rc_w = eng.transfer_sync_write(target, src.ctypes.data, spec["addr"] + off, msg, request=key,
                                           layer=i % 80)
            rc_r = eng.transfer_sync_read(target, dst.ctypes.data, spec["addr"] + off, msg, request=key,
                                          layer=i % 80)
        except Exception as exc:  # noqa: BLE001 - counted, the loop goes on
            error(f"mooncake iteration {i}: {exc!r}")
            continue
        stall = time.monotonic() - t0
        if rc_w != 0 or rc_r != 0:
            error(f"mooncake iteration {i}: write rc {rc_w}, read rc {rc_r}")
        elif not np.array_equal(src, dst):
            error(f"mooncake iteration {i}: bytes read back differ from bytes written")
        else:
            with lock:
                st["iterations"] += 1
                st["bytes_verified"] += msg
                st["worst_stall_s"] = max(st["worst_stall_s"], stall)
                st["stalls_over_1s"] += stall > 1.0
                if stall > 1.0 and len(st["stalls"]) < 50:
                    st["stalls"].append([round(time.time() - stall, 3), round(stall, 3)])  # wall start, seconds
    print(status(), flush=True)
    eng.close()


# ================================================================== the driver


def _read_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _shm_maps(pid: int) -> int | None:
    """How many mappings of /dev/shm files the process holds (a segment mapped again and again shows here)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return sum(1 for line in f if " /dev/shm/" in line)
    except OSError:
        return None


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


class Child:
    """One process of the cluster, in its own session; restartable with the same arguments."""

    def __init__(self, role: str, args: list[str], log: Path, env: dict | None = None, stdin: bool = False,
                 stdout: bool = False) -> None:
        self.role, self.args, self.log_path, self.env = role, args, log, env
        self.want_stdin, self.want_stdout = stdin, stdout
        self.proc: subprocess.Popen | None = None
        self.incarnations: list[dict] = []  # one per start: pid, started, ended, samples

    def start(self, t0: float) -> subprocess.Popen:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, env=self.env, start_new_session=True,
                                     stdin=subprocess.PIPE if self.want_stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if self.want_stdout else log, stderr=log,
                                     text=self.want_stdout or self.want_stdin)
        log.close()
        self.incarnations.append({"pid": self.proc.pid, "started_s": time.monotonic() - t0, "ended_s": None,
                                  "exit": None, "samples": []})
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self, t0: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._ended(t0)

    def _ended(self, t0: float) -> None:
        inc = self.incarnations[-1]
        if inc["ended_s"] is None:
            inc["ended_s"], inc["exit"] = time.monotonic() - t0, self.proc.returncode

    def terminate(self, t0: float, timeout: float = 15) -> int | None:
        """SIGTERM, wait; SIGKILL the session if it does not exit in time. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._ended(t0)
        return self.proc.returncode

    def reap(self) -> None:
        """Kill whatever is left of every incarnation's session (cleanup path)."""
        for inc in self.incarnations:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(inc["pid"], signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(5)


def _free_port(pair: bool = False) -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if not pair:
                return port
            if port >= 65534:
                continue
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair on loopback")


class Soak:
    """The driver: starts the cluster, kills and restarts, samples, reports. See the module docstring."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.t0 = time.monotonic()
        self.tmp = Path(tempfile.mkdtemp(prefix="laxflow-soak-"))
        tag = f"lxf-soak-{os.getpid()}"
        self.shm = {"n0": f"/{tag}-n0", "n1": f"/{tag}-n1"}
        self.hooks = {n: f"ipc://{self.tmp}/hooks-{n}.sock" for n in self.shm}
        self.coord_port, self.coord_metrics = _free_port(pair=True), _free_port()
        self.coord_address = f"tcp://127.0.0.1:{self.coord_port}"
        self.children: dict[str, Child] = {}
        self.bells: set[str] = set()
        self.shm_before = _shm_entries()
        self.shm_peak = len(self.shm_before)
        self.seg_counters: dict[str, dict[int, dict]] = {n: {} for n in self.shm}  # node -> daemon pid -> counters
        self.view_rebuild_s: list[float | None] = []
        self.daemon_restart_s: list[float | None] = []
        self.wall0 = time.time()  # the initiator reports its stalls in wall-clock time
        self.timeline: list[tuple[float, str]] = []  # (seconds since start, what)
        self.kills = {"daemon": 0, "coordinator": 0}
        self.restarts = {"daemon": 0, "coordinator": 0}
        self.initiator_last: dict = {}
        self.driver_errors: list[str] = []
        self.died: set[str] = set()  # workers found dead (reported once)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def log(self, text: str) -> None:
        if not self.a.json:
            print(f"[soak {time.monotonic() - self.t0:7.1f}s] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------- processes

    def _daemon(self, node: str) -> Child:
        ports = self.tmp / f"ports-{node}.json"
        ports.write_text(json.dumps({"ports": [{"name": "eth0", "gbps": 100}]}))
        cfg = self.tmp / f"config-{node}.json"
        cfg.write_text(json.dumps({"heartbeat_s": 0.2}))
        args = [LAXFLOW, "daemon", "--node", node, "--shm", self.shm[node], "--ports", str(ports),
                "--hooks", self.hooks[node], "--coordinator", self.coord_address, "--config", str(cfg),
                "--log-level", "warning"]
        return Child(f"daemon-{node}", args, self.tmp / f"daemon-{node}.log")

    def _start_daemon(self, node: str) -> float:
        """Start (or restart) a daemon; returns seconds until its segment is live."""
        from laxflow.protocol.shm import Segment, SegmentError

        child = self.children[f"daemon-{node}"]
        t = time.monotonic()
        child.start(self.t0)
        deadline = t + 30
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"daemon {node} exited at start: {child.log_path.read_text()[-2000:]}")
            with contextlib.suppress(SegmentError):
                seg = Segment.attach(self.shm[node])
                try:
                    if seg.live() and seg.raw.header.daemon_pid == child.proc.pid:
                        self.bells.add(seg.bell_path)
                        return time.monotonic() - t
                finally:
                    seg.close(unlink=False)
            time.sleep(0.02)
        raise RuntimeError(f"daemon {node}: segment never went live: {child.log_path.read_text()[-2000:]}")

    def _start_coordinator(self) -> None:
        self.children["coordinator"].start(self.t0)

    def _view_rebuilt(self, timeout: float = 60) -> float | None:
        """Seconds from now until the coordinator's status shows both daemons alive (None: never)."""
        from laxflow.coordinator.client import request_status
        from laxflow.errors import UserError

        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if not self.children["coordinator"].alive():
                return None
            try:
                s = request_status(self.coord_address, timeout_s=0.5)
                if sorted(d.node for d in s.daemons if d.alive) == ["n0", "n1"]:
                    return time.monotonic() - t
            except UserError:
                pass
            time.sleep(0.05)
        return None

    def start(self) -> None:
        coord_args = [LAXFLOW, "coordinator", "--bind", self.coord_address, "--metrics-port",
                      str(self.coord_metrics), "--heartbeat", "0.2", "--dead-after", "1.0", "--log-level", "warning"]
        self.children["coordinator"] = Child("coordinator", coord_args, self.tmp / "coordinator.log")
        for node in self.shm:
            self.children[f"daemon-{node}"] = self._daemon(node)
        self._start_coordinator()
        for node in self.shm:
            self._start_daemon(node)
        if self._view_rebuilt() is None:
            raise RuntimeError("the coordinator never saw both daemons: "
                               + (self.tmp / "coordinator.log").read_text()[-2000:])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAXFLOW_", "LD_PRELOAD"))}
        env["GLOG_minloglevel"] = "2"
        me = [sys.executable, str(HERE)]
        run = [LAXFLOW, "run", "--no-daemon", "--shm-name"]
        target = Child("target", [*run, self.shm["n1"], "--", *me, "--role", "target", "--msg-bytes",
                                  str(self.a.msg_bytes)], self.tmp / "target.log", env=env, stdin=True, stdout=True)
        self.children["target"] = target
        target.start(self.t0)
        line = target.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the target did not start: {target.log_path.read_text()[-3000:]}")
        spec = json.loads(line)
        spec.update(msg_bytes=self.a.msg_bytes, hooks=self.hooks["n0"])
        ienv = dict(env, LAXFLOW_HOOKS=self.hooks["n0"])
        init = Child("initiator", [*run, self.shm["n0"], "--", *me, "--role", "initiator", json.dumps(spec)],
                     self.tmp / "initiator.log", env=ienv, stdin=True, stdout=True)
        self.children["initiator"] = init
        init.start(self.t0)
        threading.Thread(target=self._read_initiator, args=(init.proc,), daemon=True).start()

    def _read_initiator(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                status = json.loads(line)
                with self._lock:
                    self.initiator_last = status

    # -------------------------------------------------------------- sampling

    def sample(self) -> None:
        """One sample of every live process, /dev/shm and the segments' counters."""
        from laxflow.protocol.shm import Segment, SegmentError

        now = time.monotonic() - self.t0
        for child in self.children.values():
            if child.alive():
                pid = child.proc.pid
                rss, fds, maps = _read_kib(pid), _fds(pid), _shm_maps(pid)
                if rss is not None:
                    child.incarnations[-1]["samples"].append((now, rss, fds, maps))
            elif child.role in ("initiator", "target") and not self._stop.is_set() and child.role not in self.died:
                self.died.add(child.role)
                self.driver_errors.append(f"{now:.1f}s: {child.role} exited with {child.proc.returncode}")
        self.shm_peak = max(self.shm_peak, len(_shm_entries()))
        for node, name in self.shm.items():
            with contextlib.suppress(SegmentError):
                seg = Segment.attach(name)
                try:
                    self.seg_counters[node][int(seg.raw.header.daemon_pid)] = seg.counters()
                    self.bells.add(seg.bell_path)
                finally:
                    seg.close(unlink=False)

    def _sampler(self) -> None:
        while not self._stop.wait(self.a.sample_every):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - a sampler failure is reported, the run goes on
                self.driver_errors.append(f"sampler: {exc!r}")

    # ----------------------------------------------------------------- run

    def kill_and_restart(self, what: str) -> None:
        if what == "daemon":
            child = self.children["daemon-n0"]
            child.kill9(self.t0)
            self.timeline.append((round(time.monotonic() - self.t0, 1), "kill -9 daemon n0"))
            self.kills["daemon"] += 1
            self.log(f"killed daemon n0 (pid {child.incarnations[-1]['pid']}) with SIGKILL")
            time.sleep(self.a.down_s)
            took = self._start_daemon("n0")
            self.restarts["daemon"] += 1
            self.daemon_restart_s.append(round(took, 3))
            self.timeline.append((round(time.monotonic() - self.t0, 1), "daemon n0 live again"))
            self.log(f"daemon n0 restarted (pid {child.proc.pid}), segment live after {took:.2f}s")
        else:
            child = self.children["coordinator"]
            child.kill9(self.t0)
            self.timeline.append((round(time.monotonic() - self.t0, 1), "kill -9 coordinator"))
            self.kills["coordinator"] += 1
            self.log(f"killed the coordinator (pid {child.incarnations[-1]['pid']}) with SIGKILL")
            time.sleep(self.a.down_s)
            self._start_coordinator()
            self.restarts["coordinator"] += 1
            took = self._view_rebuilt()
            self.view_rebuild_s.append(None if took is None else round(took, 3))
            self.timeline.append((round(time.monotonic() - self.t0, 1), "coordinator view rebuilt"))
            if took is None:
                self.driver_errors.append("coordinator restarted but never saw both daemons")
            self.log(f"coordinator restarted (pid {child.proc.pid}), view rebuilt in {took}s")

    def run(self) -> dict:
        self.start()
        self.log(f"cluster up in {time.monotonic() - self.t0:.1f}s; running {self.a.minutes} min")
        run_t0 = time.monotonic()
        duration = self.a.minutes * 60
        sampler = threading.Thread(target=self._sampler, daemon=True)
        sampler.start()
        next_kill = self.a.warmup + self.a.kill_every / 2
        order = ["daemon", "coordinator"]
        k = 0
        while (elapsed := time.monotonic() - run_t0) < duration:
            if elapsed >= next_kill and duration - elapsed > self.a.down_s + 5:
                self.kill_and_restart(order[k % 2])
                k += 1
                next_kill += self.a.kill_every
            time.sleep(0.1)
        self.sample()
        self._stop.set()
        self.log("stopping")
        return self.stop()

    def stop(self) -> dict:
        """Orderly end: the initiator's last status, then SIGTERM everything and record exit codes."""
        init = self.children["initiator"]
        with contextlib.suppress(OSError):
            init.proc.stdin.close()
        try:
            init.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.driver_errors.append("initiator did not stop within 60 s of its stdin closing")
        time.sleep(0.2)  # its reader thread takes the last line
        init._ended(self.t0)
        exits = {"initiator": init.proc.returncode}
        target = self.children["target"]
        with contextlib.suppress(OSError):
            target.proc.stdin.close()
        exits["target"] = target.terminate(self.t0, timeout=20)
        for name in ("daemon-n0", "daemon-n1", "coordinator"):
            exits[name] = self.children[name].terminate(self.t0)
        return exits

    def cleanup(self) -> list[str]:
        """Kill every session we started, remove our segments, doorbells and tmp dir; returns what was left."""
        from laxflow.protocol.shm import Segment

        for child in self.children.values():
            child.reap()
        for name in self.shm.values():
            with contextlib.suppress(Exception):
                Segment.unlink_name(name)
        pids = {str(inc["pid"]) for c in self.children.values() for inc in c.incarnations}
        for entry in _shm_entries() - self.shm_before:
            m = re.match(r"laxflow-bell\.(\d+)\.", entry)
            path = str(SHM_DIR / entry)
            if (m and m.group(1) in pids) or path in self.bells:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        shutil.rmtree(self.tmp, ignore_errors=True)
        tag = f"lxf-soak-{os.getpid()}"
        return sorted(e for e in _shm_entries() - self.shm_before
                      if e.startswith(tag) or str(SHM_DIR / e) in self.bells
                      or ((m := re.match(r"laxflow-bell\.(\d+)\.", e)) and m.group(1) in pids))


def _fit_slope(samples: list[tuple]) -> float | None:
    """Least-squares slope of RSS (KiB) over time, in KiB per minute."""
    if len(samples) < 3:
        return None
    ts = [s[0] for s in samples]
    ys = [s[1] for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var * 60


def process_report(child: Child, warmup: float) -> list[dict]:
    """Per incarnation: RSS and fds after warm-up (its own start + warmup) and at its end, growth, slope."""
    out = []
    for inc in child.incarnations:
        samples = inc["samples"]
        past = [s for s in samples if s[0] >= inc["started_s"] + warmup]
        row = {"pid": inc["pid"], "started_s": round(inc["started_s"], 1),
               "ended_s": None if inc["ended_s"] is None else round(inc["ended_s"], 1), "exit": inc["exit"],
               "samples": len(samples), "rss_kib_first": samples[0][1] if samples else None,
               "rss_kib_peak": max((s[1] for s in samples), default=None)}
        if past:
            row.update(rss_kib_warm=past[0][1], rss_kib_end=past[-1][1], rss_growth_kib=past[-1][1] - past[0][1],
                       rss_slope_kib_per_min=None if (sl := _fit_slope(past)) is None else round(sl, 1),
                       fds_warm=past[0][2], fds_end=past[-1][2], fds_max=max(s[2] or 0 for s in past),
                       shm_maps_warm=past[0][3], shm_maps_end=past[-1][3],
                       warm_span_s=round(past[-1][0] - past[0][0], 1))
        else:
            row.update(rss_kib_warm=None, rss_kib_end=samples[-1][1] if samples else None, rss_growth_kib=None,
                       rss_slope_kib_per_min=None, fds_warm=None, fds_end=samples[-1][2] if samples else None,
                       fds_max=None, shm_maps_warm=None, shm_maps_end=samples[-1][3] if samples else None,
                       warm_span_s=0.0)
        out.append(row)
    return out


def report(soak: Soak, exits: dict, leftover: list[str], wall_s: float) -> dict:
    """The JSON object printed at the end.

    iterations, bytes_verified: Mooncake write+read rounds whose bytes read back equal the bytes written
    (msg_bytes each); socket_bytes_verified: echoed bytes compared; hooks_batches, hooks_errors,
    hooks_worst_call_s: the reports stream; errors (must be 0) and error_samples; worst_stall_s,
    stalls_over_1s, stalls ([start s, seconds]) of the Mooncake loop; timeline of kills and recoveries;
    kills, restarts; view_rebuild_s (per coordinator restart: until its status shows both daemons alive);
    daemon_restart_s (until the new segment is live); gate, adapter: the wrapper's counters; ring_drops
    (events_dropped summed over each node's daemon instances) and segment_counters (the last instance's);
    processes: per role, per incarnation, RSS (KiB) and fds and /dev/shm mappings after warm-up and at the
    end, growth and slope (KiB/min, least squares past warm-up); shm: /dev/shm entries at start, peak and
    end, and ours_left (entries this run made still there: must be empty); exit_codes after SIGTERM.
    """
    init = dict(soak.initiator_last)
    ring = {node: sum(c["events_dropped"] for c in by_pid.values()) for node, by_pid in soak.seg_counters.items()}
    last_counters = {node: (list(by_pid.values())[-1] if by_pid else None)
                     for node, by_pid in soak.seg_counters.items()}
    daemon_exit_ok = all(exits.get(n) == 0 for n in ("daemon-n0", "daemon-n1", "coordinator"))
    errors = init.get("errors", 0) + len(soak.driver_errors) + (0 if exits.get("initiator") == 0 else 1)
    shm_after = _shm_entries()
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "minutes": soak.a.minutes, "wall_s": round(wall_s, 1), "warmup_s": soak.a.warmup,
        "kill_every_s": soak.a.kill_every, "down_s": soak.a.down_s, "msg_bytes": soak.a.msg_bytes,
        "iterations": init.get("iterations", 0), "bytes_verified": init.get("bytes_verified", 0),
        "socket_bytes_verified": init.get("socket_bytes_verified", 0),
        "hooks_batches": init.get("hooks_batches", 0), "hooks_errors": init.get("hooks_errors", 0),
        "hooks_worst_call_s": round(init.get("hooks_worst_call_s", 0.0), 3),
        "errors": errors, "error_samples": init.get("error_samples", []) + soak.driver_errors[:20],
        "worst_stall_s": round(init.get("worst_stall_s", 0.0), 3), "stalls_over_1s": init.get("stalls_over_1s", 0),
        "stalls": [[round(t - soak.wall0, 1), d] for t, d in init.get("stalls", [])],  # [start s since start, s]
        "timeline": soak.timeline,
        "kills": soak.kills, "restarts": soak.restarts,
        "view_rebuild_s": soak.view_rebuild_s, "daemon_restart_s": soak.daemon_restart_s,
        "gate": init.get("gate", {}), "adapter": init.get("adapter", {}),
        "ring_drops": ring, "segment_counters": last_counters,
        "processes": {name: process_report(c, soak.a.warmup) for name, c in soak.children.items()},
        "shm": {"start": len(soak.shm_before), "peak": soak.shm_peak, "end": len(shm_after),
                "ours_left": leftover,
                "others_changed": len(shm_after ^ soak.shm_before) - len(leftover)},
        "exit_codes": exits, "clean_exit": daemon_exit_ok,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=2.0, help="how long to run (default 2)")
    p.add_argument("--json", action="store_true", help="print only the JSON object (no progress lines)")
    p.add_argument("--kill-every", type=float, default=None,
                   help="seconds between kills, alternating daemon n0 and the coordinator "
                        "(default: a third of the time past warm-up, at most 180)")
    p.add_argument("--down-s", type=float, default=2.0, help="seconds a killed process stays down (default 2)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds of warm-up before memory is compared (default: a quarter of the run, at most 60)")
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between samples (default 2)")
    p.add_argument("--msg-bytes", type=int, default=1 << 20, help="bytes per Mooncake write and read (default 1 MiB)")
    p.add_argument("--role", choices=("target", "initiator"), help=argparse.SUPPRESS)
    p.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role == "target":
        role_target(a.msg_bytes, slots=8)
        return 0
    if a.role == "initiator":
        role_initiator(json.loads(a.spec))
        return 0
    if not a.minutes > 0:
        p.error(f"--minutes: expected a positive number, got {a.minutes}")
    if not 1 <= a.msg_bytes <= 1 << 30:
        p.error(f"--msg-bytes: expected 1 .. 1 GiB, got {a.msg_bytes}")
    duration = a.minutes * 60
    a.warmup = min(60.0, duration / 4) if a.warmup is None else a.warmup
    a.kill_every = min(180.0, max(10.0, (duration - a.warmup) / 3)) if a.kill_every is None else a.kill_every
    if not a.kill_every > a.down_s:
        p.error(f"--kill-every: expected more seconds than --down-s ({a.down_s}), got {a.kill_every}")

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a shell may start us with it ignored
        signal.signal(sig, interrupted)
    soak = Soak(a)
    wall = time.monotonic()
    exits: dict = {}
    failure = None
    try:
        exits = soak.run()
    except KeyboardInterrupt as exc:
        failure = f"interrupted ({exc or 'Ctrl-C'})"
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, cleanup still runs
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        soak._stop.set()
        leftover = soak.cleanup()
    result = report(soak, exits, leftover, time.monotonic() - wall)
    if failure:
        result["errors"] += 1
        result["error_samples"].append(f"soak failed: {failure}")
    print(json.dumps(result) if a.json else json.dumps(result, indent=2), flush=True)
    return 0 if failure is None and result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
