"""``laxflow testbed run --scenario contention``: a disaggregated prefill on the fabric.

Hosts (4): h0, h1 prefill ranks (expert parallel pair), h2 a peer holding
reusable KV (stage-1 source), h3 the decode host (stage-3 sink). Per request
and layer: stage-1 read of that layer's reused KV (h2 -> h0, h1), compute (a
sleep), stage-2 all_to_all between h0 and h1, stage-3 write of the layer's KV
(h0, h1 -> h3). The all_to_all meets stage-3 writes at the prefill hosts' NIC
queues and stage-1 reads at the switch ports toward h0 and h1: the
contention of MFS Fig. 5 on a 4-host fabric. Processes: :mod:`worker`.

Modes, run back to back on the same fabric and workload:

- ``off``: one class, every connection DSCP 0 (what the fabric does without laxflow).
- ``on``: **static per-stage classes** from laxflow's DSCP map: stage 2 at
  level 1 (RLI 0, TC 4), stage 1 at level 3 (TC 3), stage 3 at level 5
  (TC 2). Tagged through the real shim (``tagger="shim"``: the per-thread
  tag on the prefill ranks, the static ``LAXFLOW_DSCP`` rule on the KV
  store) or by ``IP_TOS`` (``tagger="sockopt"``). This is *not* MFS yet:
  no node daemon, no coordinator, no promotion by laxity. Those come in
  where :class:`worker.Tagger` opens connections, once the daemon and the
  adapters (Mooncake for stages 1 and 3, Gloo for stage 2) are merged.

TTFT SLO: ``slo_factor`` x the request's TTFT on an idle fabric, computed
from the sizes and the line rate (the paper uses 3x the low-load TTFT).
Called by the CLI and the tests in the main thread of a root process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from laxflow.errors import UserError
from laxflow.policy.dscp import default_dscp_map
from laxflow.testbed.fabric import FabricConfig, Testbed, parse_rate

STAGE_LEVEL = {2: 1, 1: 3, 3: 5}  # static per-stage RMLQ level of the "on" mode


@dataclass(frozen=True)
class ScenarioConfig:
    """Sizes per rank and layer; validated once."""

    name: str = "lxfscn"
    rate: str = "100mbit"
    requests: int = 20
    layers: int = 4
    compute_ms: float = 15.0
    a2a_bytes: int = 150_000
    reuse_bytes: int = 200_000
    kv_bytes: int = 250_000
    interarrival_ms: float = 200.0
    slo_factor: float = 2.0
    tagger: str = "shim"  # or "sockopt"

    def __post_init__(self) -> None:
        parse_rate(self.rate)
        for field_name in ("requests", "layers", "a2a_bytes", "reuse_bytes", "kv_bytes"):
            if getattr(self, field_name) <= 0:
                raise UserError(f"scenario: {field_name} must be positive, got {getattr(self, field_name)}")
        if self.compute_ms < 0 or self.interarrival_ms <= 0 or self.slo_factor <= 0:
            raise UserError("scenario: compute_ms >= 0, interarrival_ms > 0 and slo_factor > 0 are required")
        if self.tagger not in ("shim", "sockopt"):
            raise UserError(f"scenario: tagger must be shim or sockopt, got {self.tagger!r}")

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


def _worker_env(cfg: ScenarioConfig, static_dscp: int | None) -> dict[str, str] | None:
    if cfg.tagger != "shim":
        return None
    from laxflow.shim import ShimConfig, shim_env

    # A segment name no daemon owns: the shim runs in its static / per-thread-tag mode only.
    return shim_env(ShimConfig(dscp=static_dscp, shm_name=f"/{cfg.name}-no-daemon-{os.getpid()}"))


def run_mode(tb: Testbed, cfg: ScenarioConfig, mode: str, capture: bool) -> dict[str, Any]:
    """One run of the job in ``mode``; returns measurements (and the DSCP histogram if ``capture``)."""
    py = sys.executable
    dscp = stage_dscp(mode)
    common = {"kv_port": 7001, "decode_port": 7002, "a2a_port": 7100, "tagger": cfg.tagger,
              "dscp": {str(k): v for k, v in dscp.items()}}
    servers = [
        tb.popen_in(2, [py, "-m", "laxflow.testbed.worker", "kvstore", json.dumps(common)],
                    env=_worker_env(cfg, dscp[1] if mode == "on" else None)),
        tb.popen_in(3, [py, "-m", "laxflow.testbed.worker", "decode", json.dumps(common)],
                    env=_worker_env(cfg, dscp[3] if mode == "on" else None)),
    ]
    span = cfg.requests * cfg.interarrival_ms / 1000 + cfg.ideal_ttft_s() * 4
    cap = None
    if capture:
        ports = ",".join(tb.switch_port(i) for i in range(tb.config.hosts))
        cap = subprocess.Popen(["ip", "netns", "exec", tb.netns("sw"), py, "-c", "from laxflow.cli import main; main()",
                                "testbed", "verify-dscp", "--iface", ports, "--egress-only", "--seconds",
                                f"{span + 6:.1f}", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert cap.stderr is not None
        if not cap.stderr.readline().startswith("capturing on"):  # its sockets are open from here on
            raise UserError(f"contention scenario: the DSCP capture did not start ({cap.stderr.read().strip()[-200:]})")
    start = time.time() + 2.5  # time for every process to start and connect
    ranks = []
    for rank in (0, 1):
        wcfg = dict(common, rank=rank, peer=tb.address(1 - rank), kvstore=tb.address(2), decode=tb.address(3),
                    layers=cfg.layers, requests=cfg.requests, compute_s=cfg.compute_ms / 1000,
                    a2a_bytes=cfg.a2a_bytes, reuse_bytes=cfg.reuse_bytes, kv_bytes=cfg.kv_bytes,
                    interarrival_s=cfg.interarrival_ms / 1000, start_epoch=start)
        ranks.append(tb.popen_in(rank, [py, "-m", "laxflow.testbed.worker", "prefill", json.dumps(wcfg)],
                                 stdout=subprocess.PIPE, env=_worker_env(cfg, None)))
    try:
        outs = [json.loads(p.communicate(timeout=span * 10 + 60)[0]) for p in ranks]
    except (ValueError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"contention scenario ({mode}): a prefill rank failed ({type(exc).__name__})") from None
    finally:
        for p in servers:
            p.kill()
            p.wait()
    ttft = [max(a, b) for a, b in zip(outs[0]["ttft"], outs[1]["ttft"])]
    cct = outs[0]["cct"] + outs[1]["cct"]
    slo = cfg.slo_factor * cfg.ideal_ttft_s()
    result: dict[str, Any] = {"cct_mean": statistics.fmean(cct), "ttft_mean": statistics.fmean(ttft),
                              "slo_attainment": sum(t <= slo for t in ttft) / len(ttft),
                              "dscp_by_stage": {str(k): v for k, v in dscp.items()}}
    if cap is not None:
        out, _ = cap.communicate(timeout=span + 60)
        seen = json.loads(out) if out.strip() else {}
        result["dscp_seen"] = seen.get("dscp", {})
        result["capture_drops"] = seen.get("capture_drops")
    return result


def run_contention(cfg: ScenarioConfig) -> dict[str, Any]:
    """Bring up a 4-host fabric, run the job off then on, tear down; the JSON of ``testbed run``."""
    tb = Testbed(FabricConfig(hosts=4, rate=cfg.rate, name=cfg.name))
    with tb:
        off = run_mode(tb, cfg, "off", capture=False)
        on = run_mode(tb, cfg, "on", capture=True)
    seen, drops = on.pop("dscp_seen", {}), on.pop("capture_drops", None)
    return {"off": off, "on": on, "cct_ratio": off["cct_mean"] / on["cct_mean"],
            "ttft_ratio": off["ttft_mean"] / on["ttft_mean"], "dscp_seen": seen, "capture_drops": drops,
            "on_mode": "static per-stage DSCP (no daemon/coordinator yet)", "slo_s": cfg.slo_factor * cfg.ideal_ttft_s(),
            "config": asdict(cfg)}
