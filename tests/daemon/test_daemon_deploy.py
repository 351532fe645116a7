"""deploy/: every metric the Grafana dashboard names is really exported; the unit's flags exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from daemontest import LAXFLOW, wait_for
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parents[1] / "coordinator"))
from cptest import CoordinatorProcess  # noqa: E402

from laxflow.protocol.shm import EventKind, Segment, Stage  # noqa: E402

DEPLOY = Path(__file__).parents[2] / "deploy"


def _dashboard_metric_names() -> set[str]:
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return set(re.findall(r"\b(laxflow_[a-zA-Z0-9_]+)", " ".join(exprs)))


def _sample_names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_dashboard_metric_is_exported_by_a_real_daemon_or_coordinator(tmp_path, start_daemon):
    coord = CoordinatorProcess(tmp_path, heartbeat=0.2, dead_after=1.0).start()
    try:
        d = start_daemon(coordinator=coord.address, config={"heartbeat_s": 0.2})
        seg = Segment.attach(d.shm)
        msg = seg.alloc_msg_id()
        seg.push_event(EventKind.SUBMIT, msg, 5, 4096, Stage.COLLECTIVE, 0, 1)  # one permit: histogram series exist
        wait_for(lambda: seg.get_permit(msg), what="a permit")
        seg.close(unlink=False)
        wait_for(lambda: "laxflow_daemon_submit_to_permit_seconds_bucket" in d.metrics(), what="latency series")
        import urllib.request

        coord_text = urllib.request.urlopen(f"http://127.0.0.1:{coord.metrics_port}/metrics", timeout=5).read().decode()
        exported = _sample_names(d.metrics()) | _sample_names(coord_text)
    finally:
        coord.stop()
    wanted = _dashboard_metric_names()
    assert len(wanted) >= 15
    missing = sorted(wanted - exported)
    assert not missing, f"dashboard names metrics nobody exports: {missing}"


def test_systemd_unit_uses_only_real_daemon_flags():
    unit = (DEPLOY / "laxflow-daemon.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*(?:\\\n.*)*)", unit, re.M).group(1).replace("\\\n", " ")
    assert exec_start.split()[1:3] == ["daemon", "--node"]
    flags = set(re.findall(r"(--[a-z-]+)", exec_start + " " + re.search(r"LAXFLOW_COORDINATOR_FLAG=(.*)", unit).group(1)))
    helptext = subprocess.run([*LAXFLOW, "daemon", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert flags and all(f in helptext for f in flags), flags
