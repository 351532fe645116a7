"""``laxflow testbed run --scenario contention``: a disaggregated prefill on the fabric.

Hosts (4): h0, h1 prefill ranks (expert parallel pair), h2 a peer holding
reusable KV (stage-1 source), h3 the decode host (stage-3 sink). Per request
and layer: stage-1 read of that layer's reused KV (h2 -> h0, h1), compute (a
sleep), stage-2 all_to_all between h0 and h1, stage-3 write of the layer's KV
(h0, h1 -> h3). The all_to_all meets stage-3 writes at the prefill hosts' NIC
queues and stage-1 reads at the switch ports toward h0 and h1: the
contention of MFS Fig. 5 on a 4-host fabric. Processes: :mod:`worker`.

Modes, run back to back on the same fabric and workload (``modes``):

- ``off``: one class, every connection DSCP 0 (what the fabric does without laxflow).
- ``static``: static per-stage classes from laxflow's DSCP map: stage 2 at
  level 1 (RLI 0, TC 4), stage 1 at level 3 (TC 2), stage 3 at level 5
  (TC 1). Tagged through the real shim (``tagger="shim"``: the per-thread
  tag on the prefill ranks, the static ``LAXFLOW_DSCP`` rule on the KV
  store) or by ``IP_TOS`` (``tagger="sockopt"``). No daemon.
- ``on``: laxflow as deployed. A ``laxflow coordinator`` (in h0's namespace,
  bound to an ``ipc://`` path: namespaces share the file system, so the
  control plane needs no CURVE keys and stays off the measured fabric) and
  one ``laxflow daemon`` per host namespace (its own segment, hooks socket,
  and two ports: ``eth0`` (send) and ``eth0-rx`` (receive) at the line rate,
  their load from the NIC's own byte counters). Every worker runs under the
  shim attached to its host's daemon; each stage's transfer is a message
  through :class:`laxflow.testbed.mfs_io.DaemonIO` (PermitGate submit ->
  permit -> socket flow tag -> send -> complete), submitted to the daemon
  of the host that initiates it: KV writes and the all_to_all on the
  sender's ``eth0``, KV reads on the prefill host's ``eth0-rx`` (one-sided,
  as RDMA READs: the host that computes knows the layer a read's RLI counts
  from; the class travels with the read request). ``eth0-rx`` holds nothing
  back (its queue is the switch port toward the host, which orders reads by
  their DSCP). Requests and batches go through the hooks API, layer progress
  through the shared-memory ring. The permit's DSCP reaches the wire through
  the shim. Connection set-up keeps the stage's static class for what no
  message covers (receivers' ACKs).

Stage 2 is a Gloo all_to_all (torch.distributed over eth0; ``on``: gated and
marked by :class:`laxflow.adapters.gloo.GlooCollectives`) when torch is
installed (``collective="auto"``/``"gloo"``), else the workers' own TCP
exchange tagged stage 2 (``"tcp"``). Stages 1/3 (``transport``): ``tcp``
(default) the workers' own exchange through the PermitGate + socket flow tag
path above; ``mooncake`` real Mooncake transfers (P2P handshake, TCP
transport, no metadata service) through :mod:`laxflow.adapters.mooncake`,
see :mod:`laxflow.testbed.mooncake_traffic`.

TTFT SLO: ``slo_factor`` (default 3, the paper's) x the TTFT measured under
low load: before the modes, ``LOW_LOAD_REQUESTS`` requests run alone on the
fabric (mode ``off``, spaced far apart) and their mean TTFT is the base. The
same SLO then holds for every mode.
Called by the CLI and the tests in the main thread of a root process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from laxflow.errors import UserError
from laxflow.policy.dscp import default_dscp_map
from laxflow.protocol.shm import Segment
from laxflow.testbed.fabric import FabricConfig, Testbed, parse_rate
from laxflow.testbed.mfs_io import RX_PORT
from laxflow.testbed.procs import READY_TIMEOUT_S, readline_within

LOW_LOAD_REQUESTS = 3  # requests of the low-load run that sets the SLO base
STAGE_LEVEL = {2: 1, 1: 3, 3: 5}  # static per-stage RMLQ level of the "static" mode (base class of "on")
MODES = ("off", "static", "on")


@dataclass(frozen=True)
class ScenarioConfig:
    """Sizes per rank and layer; validated once."""

    name: str = "lxfscn"
    rate: str = "100mbit"
    requests: int = 20
    warmup: int = 2  # requests run first and left out of every measurement (the paper clips a warm-up too)
    layers: int = 4
    compute_ms: float = 15.0
    a2a_bytes: int = 150_000
    reuse_bytes: int = 200_000
    kv_bytes: int = 250_000
    interarrival_ms: float = 200.0
    slo_factor: float = 3.0
    tagger: str = "shim"  # or "sockopt"
    modes: tuple[str, ...] = ("off", "static", "on")
    window_bytes: int | None = None  # the daemons' permit window (None: their default, one BDP)
    spare_share: float | None = 0.25  # the daemons' spare-capacity grant (None: strict priority only)
    collective: str = "auto"  # stage 2: gloo (torch installed), tcp (the workers' own exchange), auto
    transport: str = "tcp"  # stages 1 and 3: the workers' own TCP exchange, or Mooncake (mooncake_traffic)
    trace_decisions: bool = False  # "on": record the daemons' KV-write decisions (laxflow.testbed.decision_trace)

    def __post_init__(self) -> None:
        parse_rate(self.rate)
        for field_name in ("requests", "layers", "a2a_bytes", "reuse_bytes", "kv_bytes"):
            if getattr(self, field_name) <= 0:
                raise UserError(f"scenario: {field_name} must be positive, got {getattr(self, field_name)}")
        if self.warmup < 0:
            raise UserError(f"scenario: warmup must be >= 0, got {self.warmup}")
        if self.compute_ms < 0 or self.interarrival_ms <= 0 or self.slo_factor <= 0:
            raise UserError("scenario: compute_ms >= 0, interarrival_ms > 0 and slo_factor > 0 are required")
        if self.tagger not in ("shim", "sockopt"):
            raise UserError(f"scenario: tagger must be shim or sockopt, got {self.tagger!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or "off" not in self.modes or "on" not in self.modes or len(set(self.modes)) != len(self.modes):
            raise UserError(f"scenario: modes must include off and on, each once, from {', '.join(MODES)}; "
                            f"got {','.join(self.modes)!r}")
        if self.collective not in ("auto", "gloo", "tcp"):
            raise UserError(f"scenario: collective must be auto, gloo or tcp, got {self.collective!r}")
        if self.transport not in ("tcp", "mooncake"):
            raise UserError(f"scenario: transport must be tcp or mooncake, got {self.transport!r}")
        if self.transport == "mooncake" and importlib.util.find_spec("mooncake") is None:
            raise UserError("scenario: transport mooncake needs mooncake-transfer-engine-non-cuda "
                            "(pip install 'laxflow[mooncake]')")
        if self.window_bytes is not None and self.window_bytes < 0:
            raise UserError(f"scenario: window_bytes must be >= 0, got {self.window_bytes}")
        if self.spare_share is not None and not 0 < self.spare_share <= 1:
            raise UserError(f"scenario: spare_share must be in (0, 1], or None (testbed run --spare-share 0) for "
                            f"strict priority only, got {self.spare_share}")
        if self.tagger != "shim" and "on" in self.modes:
            raise UserError("scenario: mode on needs tagger shim (the permit's class reaches the wire through it)")

    def low_load(self, warmup: int) -> "ScenarioConfig":
        """This scenario at low load: ``LOW_LOAD_REQUESTS`` requests spaced so they never overlap.

        The spacing is 5 x the sizes' TTFT bound (and never closer than the
        scenario's own); its mean TTFT is the SLO's base, measured on the
        testbed (:func:`low_load_ttft`) and predicted by the simulator model.
        """
        return replace(self, requests=LOW_LOAD_REQUESTS, warmup=warmup,
                       interarrival_ms=max(self.interarrival_ms, 5000 * self.ideal_ttft_s()))

    def ideal_ttft_s(self) -> float:
        """TTFT on an idle fabric: first layer's reuse, every layer's compute and all_to_all, last KV write."""
        bps = parse_rate(self.rate)
        t = lambda n: n * 8 / bps  # noqa: E731
        return t(self.reuse_bytes) + self.layers * (self.compute_ms / 1000 + t(self.a2a_bytes)) + t(self.kv_bytes)


def stage_dscp(mode: str) -> dict[int, int]:
    if mode == "off":
        return {1: 0, 2: 0, 3: 0}
    dscp_map = default_dscp_map(8)
    return {stage: dscp_map.dscp(level) for stage, level in STAGE_LEVEL.items()}


def ack_dscp(mode: str) -> int:
    """Class of the sides that send only acknowledgements and requests (the decode host; a rank's KV reads).

    Their packets clock the bulk flows they answer, so they go in the top
    class whenever classes are used: tiny, and behind the traffic they clock
    they would slow it down (the same in ``static`` and ``on``).
    """
    return 0 if mode == "off" else default_dscp_map(8).dscp(0)


def _worker_env(cfg: ScenarioConfig, static_dscp: int | None, shm: str | None = None) -> dict[str, str] | None:
    if cfg.tagger != "shim":
        return None
    from laxflow.shim import ShimConfig, shim_env

    # Without a daemon: a segment name no daemon owns, the shim runs in its static / per-thread-tag mode only.
    return shim_env(ShimConfig(dscp=static_dscp, shm_name=shm or f"/{cfg.name}-no-daemon-{os.getpid()}"))


class ControlPlane:
    """Coordinator + one node daemon per host, inside the namespaces (mode ``on``)."""

    def __init__(self, tb: Testbed, cfg: ScenarioConfig) -> None:
        self.tb, self.cfg = tb, cfg
        self.dir = tempfile.mkdtemp(prefix=f"laxflow-{cfg.name}-")
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[Any] = []
        self.decisions: list[dict[str, Any]] | None = None  # trace_decisions: every daemon's KV writes at grant
        self.holds: list[dict[str, Any]] | None = None  # and what held each waiting collective at the gate

    def shm(self, host: int) -> str:
        return f"/{self.cfg.name}-h{host}-{os.getpid()}"

    def hooks(self, host: int) -> str:
        return f"ipc://{self.dir}/hooks-h{host}.sock"

    def _start(self, host: int, argv: list[str], tag: str) -> None:
        log = open(os.path.join(self.dir, f"{tag}.log"), "w")
        self.logs.append(log)
        self.procs.append(self.tb.popen_in(host, argv, stdout=log, stderr=subprocess.STDOUT))

    def __enter__(self) -> "ControlPlane":
        lx = [sys.executable, "-c", "from laxflow.cli import main; main()"]
        coord = f"ipc://{self.dir}/coord.sock"
        self._start(0, [*lx, "coordinator", "--bind", coord, "--log-level", "warning"], "coordinator")
        ports = os.path.join(self.dir, "ports.json")
        with open(ports, "w") as f:
            # Both directions of the full-duplex port at the line rate. The load MLU's rho needs comes from
            # the NIC's own byte counters (the daemon runs under `ip netns exec`, which mounts the host
            # namespace's sysfs): counting a socket message's bytes when send() returns would see a burst
            # into the socket buffer as a saturated link.
            stats = "/sys/class/net/eth0/statistics"
            rate = parse_rate(self.cfg.rate) / 8
            json.dump({"ports": [{"name": "eth0", "rate": rate, "counter": f"{stats}/tx_bytes"},
                                 # reads are ordered where they queue, at the switch port toward this
                                 # host, by the DSCP their permits carry: the host classifies, never holds
                                 {"name": RX_PORT, "rate": rate, "counter": f"{stats}/rx_bytes", "window": 1e12}]}, f)
        conf = os.path.join(self.dir, "daemon.json")
        with open(conf, "w") as f:
            # Four "hosts" share this machine's cores: a daemon spinning after each event would take CPU
            # from the job it schedules (a server's daemon has a core to itself and keeps the default).
            conf_raw: dict[str, Any] = {"spin_us": 0}
            if self.cfg.window_bytes is not None:
                conf_raw["window_bytes"] = self.cfg.window_bytes
            conf_raw["spare_share"] = self.cfg.spare_share
            json.dump(conf_raw, f)
        traced = [sys.executable, "-m", "laxflow.testbed.decision_trace"]
        for h in range(self.tb.config.hosts):
            run = [*traced, self._trace(h)] if self.cfg.trace_decisions else [*lx, "daemon"]
            self._start(h, [*run, "--config", conf, "--node", f"h{h}", "--coordinator", coord, "--shm", self.shm(h),
                            "--ports", ports, "--hooks", self.hooks(h), "--metrics-port", "0",
                            "--log-level", "warning"], f"daemon-h{h}")
        deadline = time.monotonic() + 30
        for h in range(self.tb.config.hosts):
            sock = self.hooks(h)[len("ipc://"):]
            while not (os.path.exists(f"/dev/shm{self.shm(h)}") and os.path.exists(sock)):
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                    self.__exit__(None, None, None)
                    raise UserError(f"contention scenario: the daemon of h{h} did not start (logs in {self.dir})")
                time.sleep(0.05)
        return self

    def _trace(self, host: int) -> str:
        return os.path.join(self.dir, f"decisions-h{host}.json")

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()
        for h in range(self.tb.config.hosts):
            Segment.unlink_name(self.shm(h))  # a daemon killed above leaves its segment and doorbell
        if self.cfg.trace_decisions:
            self.decisions, self.holds = [], []
            for h in range(self.tb.config.hosts):
                try:
                    with open(self._trace(h)) as f:
                        trace = json.load(f)
                    self.decisions += [dict(r, node=f"h{h}") for r in trace["at_grant"]]
                    self.holds += [dict(r, node=f"h{h}") for r in trace.get("holds", [])]
                except (OSError, ValueError, KeyError):
                    pass  # a daemon that was killed wrote none: the trace has the others
        if exc[0] is None:
            shutil.rmtree(self.dir, ignore_errors=True)  # kept after a failure: the daemons' logs


def run_mode(tb: Testbed, cfg: ScenarioConfig, mode: str, capture: bool, slo: float) -> dict[str, Any]:
    """One run of the job in ``mode`` under TTFT SLO ``slo`` (s); measurements (and DSCP histogram if ``capture``)."""
    if mode == "on":
        with ControlPlane(tb, cfg) as cp:
            result = _run_job(tb, cfg, mode, capture, cp, slo)
        if cp.decisions is not None:
            result["decisions"] = cp.decisions
            result["a2a_holds"] = cp.holds
        return result
    return _run_job(tb, cfg, mode, capture, None, slo)


def low_load_ttft(tb: Testbed, cfg: ScenarioConfig) -> float:
    """Mean TTFT of ``LOW_LOAD_REQUESTS`` requests that never overlap (mode off): the SLO's base."""
    return _run_job(tb, cfg.low_load(warmup=1), "off", False, None, math.inf)["ttft_mean"]


def collective_kind(cfg: ScenarioConfig) -> str:
    """Stage 2's implementation: Gloo when asked or (auto) when torch is installed."""
    if cfg.collective != "auto":
        return cfg.collective
    return "gloo" if importlib.util.find_spec("torch") is not None else "tcp"


def _run_job(tb: Testbed, cfg: ScenarioConfig, mode: str, capture: bool, cp: ControlPlane | None,
             slo: float) -> dict[str, Any]:
    py = sys.executable
    dscp = stage_dscp(mode)
    kind = collective_kind(cfg)
    common = {"kv_port": 7001, "decode_port": 7002, "a2a_port": 7100, "tagger": cfg.tagger,
              "dscp": {str(k): v for k, v in dscp.items()}, "ack_dscp": ack_dscp(mode), "slo_s": slo if math.isfinite(slo) else 3600.0, "collective": kind,
              "gloo_master": f"{tb.address(0)}:7200"}

    def host_cfg(h: int) -> dict[str, Any]:
        return dict(common, daemon={"shm": cp.shm(h), "hooks": cp.hooks(h)}) if cp else common

    def env(h: int, static: int | None) -> dict[str, str] | None:
        return _worker_env(cfg, static if mode != "off" else None, cp.shm(h) if cp else None)

    if cfg.transport == "mooncake":  # stages 1 and 3 through the Mooncake wrapper (mooncake_traffic)
        from laxflow.testbed import mooncake_traffic

        servers, mc = mooncake_traffic.start_servers(tb, cfg, mode, dscp, lambda h: env(h, ack_dscp(mode)))
        common.update(mc)
    else:
        servers = [
            tb.popen_in(2, [py, "-m", "laxflow.testbed.worker", "kvstore", json.dumps(host_cfg(2))], env=env(2, dscp[1])),
            tb.popen_in(3, [py, "-m", "laxflow.testbed.worker", "decode", json.dumps(host_cfg(3))], env=env(3, ack_dscp(mode))),
        ]
    total = cfg.requests + cfg.warmup
    span = total * cfg.interarrival_ms / 1000 + cfg.ideal_ttft_s() * 4
    ranks = []
    for rank in (0, 1):
        wcfg = dict(host_cfg(rank), rank=rank, peer=tb.address(1 - rank), kvstore=tb.address(2),
                    decode=tb.address(3), layers=cfg.layers, requests=total,
                    compute_s=cfg.compute_ms / 1000, a2a_bytes=cfg.a2a_bytes, reuse_bytes=cfg.reuse_bytes,
                    kv_bytes=cfg.kv_bytes, interarrival_s=cfg.interarrival_ms / 1000)
        renv = env(rank, dscp[2] if kind == "gloo" else None) or dict(os.environ)
        renv["GLOO_SOCKET_IFNAME"] = "eth0"  # Gloo's connections on the fabric, not lo
        # c10d warns on every connect that a namespace's address has no hostname: noise, not a fault
        renv.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        if cfg.transport == "mooncake":
            renv = mooncake_traffic.quiet(renv)
        if cfg.transport == "mooncake":
            wcfg["address"] = tb.address(rank)
        # stages 1 and 3 as Mooncake transfers (testbed run --transport mooncake) or plain sockets
        module, role = (("laxflow.testbed.mooncake_traffic", "mc_prefill") if cfg.transport == "mooncake"
                        else ("laxflow.testbed.worker", "prefill"))
        ranks.append(tb.popen_in(rank, [py, "-m", module, role, json.dumps(wcfg)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=renv))
    cap = None
    try:
        # Each rank says "ready" once connected (and Gloo's group is up); then both get one start time.
        for p in ranks:
            line = readline_within(p, READY_TIMEOUT_S)
            if line.strip() != "ready":
                raise UserError(f"contention scenario ({mode}): a prefill rank did not start "
                                f"(said {line.strip()[-200:]!r})")
        if capture:
            ports = ",".join(tb.switch_port(i) for i in range(tb.config.hosts))
            cap = subprocess.Popen(["ip", "netns", "exec", tb.netns("sw"), py, "-c",
                                    "from laxflow.cli import main; main()", "testbed", "verify-dscp", "--iface", ports,
                                    "--egress-only", "--seconds", f"{span + 6:.1f}", "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert cap.stderr is not None
            if not cap.stderr.readline().startswith("capturing on"):  # its sockets are open from here on
                raise UserError(f"contention scenario: the DSCP capture did not start "
                                f"({cap.stderr.read().strip()[-200:]})")
        start = time.time() + 0.2
        for p in ranks:
            assert p.stdin is not None
            p.stdin.write(f"{start!r}\n")
            p.stdin.flush()
        outs = [json.loads(p.communicate(timeout=span * 10 + 60)[0]) for p in ranks]
        if cfg.transport == "mooncake":
            from laxflow.testbed.mooncake_traffic import verify_writes

            written = verify_writes(servers[1])
    except (ValueError, subprocess.TimeoutExpired, UserError) as exc:
        for p in ranks:
            p.kill()
            p.wait()
        if cap is not None:
            cap.kill()
            cap.wait()
        if isinstance(exc, UserError):
            raise
        raise UserError(f"contention scenario ({mode}): a prefill rank failed ({type(exc).__name__})") from None
    finally:
        for p in servers:
            p.kill()
            p.wait()
    w = cfg.warmup
    ttft = [max(a, b) for a, b in zip(outs[0]["ttft"][w:], outs[1]["ttft"][w:])]
    cct = outs[0]["cct"][w * cfg.layers:] + outs[1]["cct"][w * cfg.layers:]
    result: dict[str, Any] = {"cct_mean": statistics.fmean(cct), "ttft_mean": statistics.fmean(ttft),
                              "slo_attainment": sum(t <= slo for t in ttft) / len(ttft),
                              "cct_p99": sorted(cct)[min(len(cct) - 1, int(0.99 * len(cct)))], "collective": kind,
                              "cct_median": statistics.median(cct),
                              "ttft_per_request": [round(t, 4) for t in ttft]}
    if all("compute_s" in o for o in outs):
        # the compute sleeps' real mean length (both ranks, warm-up included)
        result["compute_ms_real"] = 1000 * statistics.fmean(o["compute_s"] for o in outs)
    if all("timeline" in o for o in outs):  # per layer, median over ranks and measured requests (ms after arrival)
        result["timeline_ms"] = {k: [round(1000 * statistics.median(o["timeline"][k][r][j] for o in outs
                                                                     for r in range(w, total)), 2)
                                     for j in range(cfg.layers)] for k in outs[0]["timeline"]}
    if all("compute_all_s" in o for o in outs):  # every sleep (the simulator model's jitter)
        result["compute_ms_samples"] = [round(1000 * x, 3) for o in outs for x in o["compute_all_s"]]
    if cfg.transport == "mooncake":
        result["transport"] = "mooncake"
        result["bytes_verified"] = {
            "reads": sum(o["reads_verified"] for o in outs), "reads_bad": sum(o["reads_bad"] for o in outs),
            "writes": written["verified"], "writes_bad": written["bad"] + sum(o["writes_failed"] for o in outs)}
        result["mooncake_stats"] = [dict(o["mooncake_stats"], transfer_ms=o["transfer_ms"]) for o in outs]
    if mode == "on":
        used: dict[str, int] = {}
        for o in outs:
            for k, v in o.get("permit_dscp", {}).items():
                used[k] = used.get(k, 0) + v
        result["permit_dscp_prefill"] = used
        result["permit_wait_ms_prefill"] = {
            k: 1000 * sum(o.get("permit_wait_s", {}).get(k, 0.0) for o in outs) / len(outs) for k in ("1", "2", "3")}
        gate = [x for o in outs for x in o.get("a2a_gate_s", [])[w * cfg.layers:]]
        if gate:  # the Gloo adapter's own time per collective (permit, marking, completion), inside the CCT
            result["a2a_gate_ms"] = round(1000 * statistics.fmean(gate), 3)
    else:
        result["dscp_by_stage"] = {str(k): v for k, v in dscp.items()}
    if cap is not None:
        out, _ = cap.communicate(timeout=span + 60)
        seen = json.loads(out) if out.strip() else {}
        result["dscp_seen"] = seen.get("dscp", {})
        result["capture_drops"] = seen.get("capture_drops")
    return result


def run_contention(cfg: ScenarioConfig) -> dict[str, Any]:
    """Bring up a 4-host fabric, run the job in each mode, tear down; the JSON of ``testbed run``."""
    tb = Testbed(FabricConfig(hosts=4, rate=cfg.rate, name=cfg.name))
    results: dict[str, Any] = {}
    with tb:
        congestion_control = tb.tcp_congestion_control()
        low = low_load_ttft(tb, cfg)
        slo = cfg.slo_factor * low
        for mode in cfg.modes:
            # Every mode is captured (the sniffer's CPU then weighs on each alike); "on"'s histogram is the report's.
            results[mode] = run_mode(tb, cfg, mode, capture=True, slo=slo)
    on = results["on"]
    seen, drops = on.pop("dscp_seen", {}), on.pop("capture_drops", None)
    for mode in cfg.modes:
        if mode != "on":
            results[mode].pop("capture_drops", None)
            results[mode]["dscp_seen"] = results[mode].pop("dscp_seen", {})
    out = dict(results)
    out.update({"cct_ratio": results["off"]["cct_mean"] / on["cct_mean"],
                "ttft_ratio": results["off"]["ttft_mean"] / on["ttft_mean"], "dscp_seen": seen,
                "capture_drops": drops, "on_mode": "coordinator + node daemon per host, permits via the shim",
                "slo_s": slo, "low_load_ttft_s": low, "config": asdict(cfg),
                "collective": collective_kind(cfg), "transport": cfg.transport,
                "tcp_congestion_control": congestion_control})
    if "static" in results:
        out["static_cct_ratio"] = results["off"]["cct_mean"] / results["static"]["cct_mean"]
        out["static_ttft_ratio"] = results["off"]["ttft_mean"] / results["static"]["ttft_mean"]
    return out
