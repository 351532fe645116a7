"""Switch and NIC configuration generated from laxflow's DSCP map.

``laxflow testbed switch-config --vendor sonic|onyx|cumulus [--nic mlnx]``
prints what a user pastes: the switch's DSCP -> traffic class map, the
traffic class -> queue map, strict priority on every queue of the listed
ports, and (``--nic mlnx``) the host NIC commands to trust DSCP. The map is
:meth:`DscpMap.rows` (laxflow's levels, the scavenger class, CNP 48 -> TC 6,
lossless RoCE 26 -> TC 3); every other DSCP goes to TC 0. Queue q serves TC q.
Pure functions of the map and the options: the golden files in
``tests/testbed/golden/`` pin the output.

Syntax sources (checked when the generators were written):
- SONiC: config_db tables DSCP_TO_TC_MAP, TC_TO_QUEUE_MAP, SCHEDULER
  (``"type": "STRICT"``), QUEUE (``"<port>|<queue>"`` -> ``scheduler``),
  PORT_QOS_MAP (``dscp_to_tc_map``, ``tc_to_queue_map``); sonic-net/SONiC
  doc/Configuration.md and the sonic-*-map YANG models. References are the
  plain object name (ABNF style of 202012 and later); releases before that
  want ``"[DSCP_TO_TC_MAP|LAXFLOW]"``.
- NVIDIA Onyx (SN2000/3000/4000 switches): ``interface ethernet 1/1 qos
  trust L3``, ``interface ethernet 1/1 traffic-class <tc> dcb ets strict``,
  ``interface ethernet 1/1 traffic-class <tc> bind switch-priority <sp>``
  (Onyx User Manual, "QoS Commands"). Onyx's documented default DSCP ->
  switch-priority map is DSCP / 8, and laxflow does not emit a command to
  change it (none verified): the output states which levels therefore share
  a queue on Onyx.
- Cumulus Linux NVUE (5.4+): ``nv set qos mapping <profile> trust l3``,
  ``nv set qos mapping <profile> dscp <d> switch-priority <sp>``,
  ``nv set qos egress-queue-mapping <profile> switch-priority <sp>
  traffic-class <tc>``, ``nv set qos egress-scheduler <profile>
  traffic-class <tc> mode strict``, ``nv config apply`` (Cumulus Linux user
  guide, "Quality of Service", and the NVUE command reference).
- NVIDIA ConnectX (MLNX_OFED / mlnx-tools): ``mlnx_qos -i <if> --trust
  dscp``, ``--dscp2prio set,<dscp>,<prio>``, ``--prio_tc``, ``--tsa``;
  ``cma_roce_tos -d <dev> -t <tos>`` (the RDMA-CM default ToS).
"""

from __future__ import annotations

import json
import re

from laxflow.errors import UserError, user_errors
from laxflow.policy.dscp import DscpMap, default_dscp_map

VENDORS = ("sonic", "onyx", "cumulus")
NICS = ("mlnx",)
MAP_NAME = "LAXFLOW"


def dscp_to_tc(dscp_map: DscpMap) -> dict[int, int]:
    """All 64 DSCPs -> TC: the map's codepoints, everything else TC 0."""
    out = {code: 0 for code in range(64)}
    for row in dscp_map.rows():
        out[int(row["dscp"])] = int(row["tc"])
    return out


def _meaning(dscp_map: DscpMap) -> dict[int, str]:
    def label(row: dict) -> str:
        if row["level"] == "reserved":
            return str(row["meaning"])
        return "scavenger" if row["level"] == "scavenger" else f"level {row['level']}"

    return {int(r["dscp"]): label(r) for r in dscp_map.rows()}


def sonic(dscp_map: DscpMap, ports: list[str]) -> str:
    """config_db JSON fragment for ``sudo config load <file>`` (or ``config apply-patch``)."""
    mapping = dscp_to_tc(dscp_map)
    db = {
        "DSCP_TO_TC_MAP": {MAP_NAME: {str(d): str(tc) for d, tc in mapping.items()}},
        "TC_TO_QUEUE_MAP": {MAP_NAME: {str(tc): str(tc) for tc in range(8)}},
        "SCHEDULER": {"LAXFLOW_STRICT": {"type": "STRICT"}},
        "QUEUE": {f"{port}|{q}": {"scheduler": "LAXFLOW_STRICT"} for port in ports for q in range(8)},
        "PORT_QOS_MAP": {port: {"dscp_to_tc_map": MAP_NAME, "tc_to_queue_map": MAP_NAME} for port in ports},
    }
    return json.dumps(db, indent=4) + "\n"


def onyx(dscp_map: DscpMap, ports: list[str]) -> str:
    """Onyx CLI (config mode) lines; ``##`` lines are comments."""
    meaning = _meaning(dscp_map)
    lines = ["## laxflow DSCP map for NVIDIA Onyx (config mode). Queue = traffic class; all strict."]
    shared: dict[int, list[int]] = {}
    for code in sorted(meaning):
        shared.setdefault(code // 8, []).append(code)
    lines.append("## Onyx's default DSCP -> switch-priority map is DSCP/8, used as is:")
    for sp, codes in sorted(shared.items()):
        names = ", ".join(f"{c} ({meaning[c]})" for c in codes)
        lines.append(f"##   switch-priority {sp}: DSCP {names}")
    collapsed = [codes for codes in shared.values() if len(codes) > 1]
    if collapsed:
        lines.append("## so codepoints that share a switch-priority share a queue on Onyx; the host's software")
        lines.append("## gates (the node daemon) still order them.")
    for port in ports:
        lines.append(f"interface ethernet {port} qos trust L3")
        for tc in range(8):
            lines.append(f"interface ethernet {port} traffic-class {tc} bind switch-priority {tc}")
        for tc in range(8):
            lines.append(f"interface ethernet {port} traffic-class {tc} dcb ets strict")
    return "\n".join(lines) + "\n"


def cumulus(dscp_map: DscpMap, ports: list[str]) -> str:
    """NVUE commands (Cumulus Linux 5.4+), profile ``default-global``."""
    mapping = dscp_to_tc(dscp_map)
    meaning = _meaning(dscp_map)
    lines = ["# laxflow DSCP map for Cumulus Linux (NVUE). Switch priority = traffic class; all strict.",
             "nv set qos mapping default-global trust l3"]
    for code in sorted(meaning):
        lines.append(f"nv set qos mapping default-global dscp {code} switch-priority {mapping[code]}  # {meaning[code]}")
    for tc in range(8):
        lines.append(f"nv set qos egress-queue-mapping default-global switch-priority {tc} traffic-class {tc}")
    for tc in range(8):
        lines.append(f"nv set qos egress-scheduler default-global traffic-class {tc} mode strict")
    lines.append("nv config apply")
    # Other DSCPs keep Cumulus's default map; laxflow only needs its own codepoints pinned.
    del ports  # the default-global profiles apply to every port
    return "\n".join(lines) + "\n"


def mlnx(dscp_map: DscpMap, iface: str, rdma_dev: str) -> str:
    """Host NIC commands (ConnectX, mlnx_qos from MLNX_OFED / mlnx-tools)."""
    mapping = dscp_to_tc(dscp_map)
    meaning = _meaning(dscp_map)
    lines = ["# laxflow: NIC trusts DSCP; priority p -> TC p, strict on every TC.",
             f"mlnx_qos -i {iface} --trust dscp"]
    for code in sorted(meaning):
        lines.append(f"mlnx_qos -i {iface} --dscp2prio set,{code},{mapping[code]}  # {meaning[code]}")
    lines.append(f"mlnx_qos -i {iface} --prio_tc 0,1,2,3,4,5,6,7")
    lines.append(f"mlnx_qos -i {iface} --tsa strict,strict,strict,strict,strict,strict,strict,strict")
    lines.append("# QPs laxflow does not tag (RDMA-CM default) stay in the lossless RoCE class, DSCP 26:")
    lines.append(f"cma_roce_tos -d {rdma_dev} -t {26 << 2}")
    return "\n".join(lines) + "\n"


_PORT_RE = {"sonic": re.compile(r"^Ethernet\d+$"), "onyx": re.compile(r"^\d+/\d+(/\d+)?$"), "cumulus": re.compile(r"^swp\S+$")}
DEFAULT_PORTS = {"sonic": "Ethernet0", "onyx": "1/1", "cumulus": "swp1"}


def render(vendor: str, nic: str | None = None, ports: str | None = None, levels: int = 8,
           iface: str = "eth0", rdma_dev: str = "mlx5_0") -> str:
    """The text ``switch-config`` prints; bad options raise UserError naming the option."""
    if vendor not in VENDORS:
        raise UserError(f"--vendor: expected one of {', '.join(VENDORS)}, got {vendor!r}")
    if nic is not None and nic not in NICS:
        raise UserError(f"--nic: expected one of {', '.join(NICS)}, got {nic!r}")
    with user_errors("--levels"):
        dscp_map = default_dscp_map(levels)
    port_list = [p.strip() for p in (ports or DEFAULT_PORTS[vendor]).split(",") if p.strip()]
    for port in port_list:
        if not _PORT_RE[vendor].match(port):
            raise UserError(f"--ports: {port!r} is not a {vendor} port name (e.g. {DEFAULT_PORTS[vendor]})")
    text = {"sonic": sonic, "onyx": onyx, "cumulus": cumulus}[vendor](dscp_map, port_list)
    if nic == "mlnx":
        # A separate block (for SONiC the JSON above is one file, these lines are shell on the hosts).
        text += "\n# ---- host NIC: run on every host ----\n" + mlnx(dscp_map, iface, rdma_dev)
    return text
