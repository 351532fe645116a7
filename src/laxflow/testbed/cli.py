"""``laxflow testbed ...``: the emulated fabric, wire checks, switch configuration.

``laxflow.cli`` adds :data:`app` under the name ``testbed``. Commands that
touch the kernel refuse without root (one line, exit 2); ``switch-config``
needs nothing. Heavy imports (scapy) happen inside the commands.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Optional

import typer

from laxflow.errors import UserError

app = typer.Typer(help="Emulated fabric (namespaces + DSCP strict-priority switch), wire checks, switch configs.",
                  no_args_is_help=True)


def _in_netns(netns: str, args: list[str]) -> None:
    """Re-run this command inside ``netns`` (scapy must start there to see its interfaces)."""
    from laxflow.testbed.fabric import existing_namespaces, require_root

    require_root("--netns")
    if netns not in existing_namespaces():
        raise UserError(f"--netns: no network namespace named {netns!r}")
    argv = ["ip", "netns", "exec", netns, sys.executable, "-c", "from laxflow.cli import main; main()", "testbed", *args]
    raise typer.Exit(subprocess.run(argv).returncode)


@app.command("up")
def up_command(
    hosts: int = typer.Option(4, "--hosts", help="Host namespaces (2..64)."),
    rate: str = typer.Option("1gbit", "--rate", help="Line rate of every link, tc spelling (100mbit, 1gbit)."),
    name: str = typer.Option("lxftb", "--name", help="Prefix of every namespace (unique per testbed)."),
    levels: int = typer.Option(8, "--levels", help="RMLQ levels of the DSCP map the switch is configured from."),
    as_json: bool = typer.Option(False, "--json", help="Print the layout as JSON."),
) -> None:
    """Create the fabric: <name>-h0.. hosts, <name>-sw bridge, DSCP strict priority on every egress port."""
    from laxflow.testbed.fabric import FabricConfig, Testbed

    tb = Testbed(FabricConfig(hosts=hosts, rate=rate, name=name, levels=levels)).up()
    layout = {"name": name, "rate": rate, "switch": tb.netns("sw"),
              "hosts": {tb.netns(i): {"address": tb.address(i), "switch_port": tb.switch_port(i)} for i in range(hosts)}}
    if as_json:
        typer.echo(json.dumps(layout, indent=1))
        return
    typer.echo(f"testbed {name}: {hosts} hosts at {rate}, switch namespace {tb.netns('sw')}")
    for ns, info in layout["hosts"].items():
        typer.echo(f"  {ns:<14} {info['address']:<12} switch port {info['switch_port']}")
    typer.echo(f"run in a host: ip netns exec {tb.netns(0)} CMD; remove: laxflow testbed down --name {name}")


@app.command("down")
def down_command(name: str = typer.Option("lxftb", "--name", help="Prefix given to `up`.")) -> None:
    """Remove the fabric (namespaces, their processes, state); safe to repeat and after a crash."""
    from laxflow.testbed.fabric import teardown

    removed = teardown(name)
    typer.echo(f"testbed {name}: removed {', '.join(removed)}" if removed else f"testbed {name}: nothing to remove")


@app.command("status")
def status_command() -> None:
    """List the testbeds recorded under /run/laxflow/testbed."""
    from laxflow.testbed.fabric import list_testbeds

    typer.echo(json.dumps(list_testbeds(), indent=1))


@app.command("verify-dscp")
def verify_dscp_command(
    iface: str = typer.Option(..., "--iface", help="Interface(s) to capture on, comma-separated (e.g. p2 or p0,p1,p2)."),
    seconds: float = typer.Option(5.0, "--seconds", help="How long to capture."),
    egress_only: bool = typer.Option(False, "--egress-only", help="Count only packets the interfaces send."),
    netns: Optional[str] = typer.Option(None, "--netns", help="Namespace of the interface."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """DSCP histogram per flow on the wire (TCP; RoCEv2 with BTH opcode, dest QP, PSN)."""
    if not 0 < seconds <= 3600:
        raise UserError(f"--seconds: expected 0..3600, got {seconds}")
    if netns:
        _in_netns(netns, ["verify-dscp", "--iface", iface, "--seconds", str(seconds)]
                    + (["--json"] if as_json else []) + (["--egress-only"] if egress_only else []))
    from laxflow.testbed.fabric import require_root

    require_root("verify-dscp")
    from laxflow.testbed.capture import verify_dscp

    try:
        # The "capturing" line on stderr tells a caller (tests, scenario) when to start its traffic.
        result = verify_dscp(iface.split(","), seconds, egress_only,
                             on_ready=lambda: print(f"capturing on {iface} for {seconds} s", file=sys.stderr, flush=True))
    except OSError as exc:
        raise UserError(f"--iface: cannot capture on {iface!r} ({exc})") from None
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    typer.echo(f"{result['iface']}: {sum(result['dscp'].values())} IP packets in {result['seconds']} s; DSCP {result['dscp']}; "
               f"{result['capture_drops']} dropped by the capture")
    for f in result["flows"]:
        extra = f"  opcodes {f['opcodes']} qp {f['dest_qp']} psn {f['psn']}" if f["proto"] == "rocev2" else ""
        typer.echo(f"  {f['proto']:<6} {f['src']}:{f['sport']} > {f['dst']}:{f['dport']}  {f['packets']} pkts  DSCP {f['dscp']}{extra}")


@app.command("probe")
def probe_command(
    dscp: int = typer.Option(..., "--dscp", help="DSCP of the probes (0..63)."),
    dst: str = typer.Option(..., "--dst", help="Destination IPv4 address."),
    count: int = typer.Option(10, "--count", help="Packets to send."),
    dest_qp: int = typer.Option(0x11, "--dest-qp", help="BTH destination QP (0..2^24-1)."),
    netns: Optional[str] = typer.Option(None, "--netns", help="Send from this namespace."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Send RoCEv2 packets (UDP 4791, valid BTH and ICRC) with a DSCP, to check a switch's queue mapping."""
    if not 0 <= dest_qp < 1 << 24:
        raise UserError(f"--dest-qp: expected 0..16777215, got {dest_qp}")
    if netns:
        _in_netns(netns, ["probe", "--dscp", str(dscp), "--dst", dst, "--count", str(count), "--dest-qp", str(dest_qp)]
                  + (["--json"] if as_json else []))
    from laxflow.testbed.capture import probe

    try:
        result = probe(dst, dscp, count, dest_qp)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"--dst: cannot send to {dst!r} ({exc})") from None
    typer.echo(json.dumps(result) if as_json else f"sent {result['sent']} RoCEv2 packets DSCP {dscp} to {dst} (QP {dest_qp:#x})")


@app.command("switch-config")
def switch_config_command(
    vendor: str = typer.Option(..., "--vendor", help="sonic, onyx or cumulus."),
    nic: Optional[str] = typer.Option(None, "--nic", help="Also print host NIC commands: mlnx."),
    ports: Optional[str] = typer.Option(None, "--ports", help="Comma-separated switch ports (default one example port)."),
    levels: int = typer.Option(8, "--levels", help="RMLQ levels of the DSCP map."),
    iface: str = typer.Option("eth0", "--iface", help="Host NIC interface for --nic."),
    rdma_dev: str = typer.Option("mlx5_0", "--rdma-dev", help="Host RDMA device for --nic."),
) -> None:
    """Switch DSCP->TC->queue maps and strict priority (and NIC trust-DSCP commands) from laxflow's DSCP map."""
    from laxflow.testbed.switch_config import render

    typer.echo(render(vendor, nic, ports, levels, iface, rdma_dev), nl=False)


@app.command("run")
def run_command(
    scenario: str = typer.Option("contention", "--scenario", help="Scenario to run: contention."),
    name: str = typer.Option("lxfscn", "--name", help="Prefix of the fabric's namespaces."),
    requests: int = typer.Option(20, "--requests", help="Requests measured per mode."),
    warmup: int = typer.Option(2, "--warmup", help="Requests run first in each mode and not measured."),
    rate: str = typer.Option("100mbit", "--rate", help="Line rate."),
    tagger: str = typer.Option("shim", "--tagger", help="How connections get their class: shim or sockopt."),
    layers: int = typer.Option(4, "--layers", help="Layers per request."),
    compute_ms: float = typer.Option(15.0, "--compute-ms", help="Compute time per layer (a sleep)."),
    a2a_bytes: int = typer.Option(150_000, "--a2a-bytes", help="Stage-2 bytes each rank sends per layer."),
    reuse_bytes: int = typer.Option(200_000, "--reuse-bytes", help="Stage-1 bytes each rank reads per layer."),
    kv_bytes: int = typer.Option(250_000, "--kv-bytes", help="Stage-3 bytes each rank writes per layer."),
    interarrival_ms: float = typer.Option(200.0, "--interarrival-ms", help="Time between request arrivals."),
    slo_factor: float = typer.Option(3.0, "--slo-factor", help="TTFT SLO = factor x the TTFT measured at low load (paper: 3)."),
    modes: str = typer.Option("off,static,on", "--modes",
                              help="Comma-separated modes: off (one class), static (per-stage DSCP), "
                                   "on (coordinator + daemons); off and on required."),
    window_bytes: Optional[int] = typer.Option(None, "--window-bytes",
                                               help="Daemons' permit window in bytes (default: one BDP)."),
    spare_share: float = typer.Option(0.25, "--spare-share",
                                      help="Daemons' spare-capacity grant: a share of the line rate in (0, 1], "
                                           "0 = strict priority only."),
    collective: str = typer.Option("auto", "--collective",
                                   help="Stage 2: gloo (torch.distributed), tcp (own exchange), auto (gloo if torch)."),
    transport: str = typer.Option("auto", "--transport",
                                  help="Stages 1 and 3: mooncake (Mooncake TransferEngine through laxflow's "
                                       "adapter), tcp (the workers' own exchange), auto (mooncake if installed)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run a synthetic disaggregated prefill on a 4-host fabric: one class (off), static per-stage classes
    (static), laxflow's coordinator and daemons (on)."""
    if scenario != "contention":
        raise UserError(f"--scenario: expected contention, got {scenario!r}")
    from laxflow.testbed.fabric import require_root
    from laxflow.testbed.scenario import ScenarioConfig, run_contention

    if transport not in ("auto", "mooncake", "tcp"):
        raise UserError(f"--transport: expected auto, mooncake or tcp, got {transport!r}")
    require_root("run")
    if transport == "auto":
        transport = "mooncake" if importlib.util.find_spec("mooncake") is not None else "tcp"
    result = run_contention(ScenarioConfig(
        name=name, requests=requests, warmup=warmup, rate=rate, tagger=tagger, layers=layers, compute_ms=compute_ms,
        a2a_bytes=a2a_bytes, reuse_bytes=reuse_bytes, kv_bytes=kv_bytes, interarrival_ms=interarrival_ms,
        slo_factor=slo_factor, modes=tuple(m.strip() for m in modes.split(",") if m.strip()), window_bytes=window_bytes, collective=collective,
        transport=transport, spare_share=spare_share or None))
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    for mode in ("off", "static", "on"):
        if mode not in result:
            continue
        r = result[mode]
        typer.echo(f"{mode:>6}: CCT {r['cct_mean'] * 1000:.1f} ms  TTFT {r['ttft_mean'] * 1000:.1f} ms  "
                   f"SLO attainment {r['slo_attainment']:.2f}")
    typer.echo(f"CCT off/on {result['cct_ratio']:.2f}x  TTFT off/on {result['ttft_ratio']:.2f}x  "
               f"DSCP seen (on) {result['dscp_seen']}  [stage 2 {result['collective']}, stages 1 and 3 "
               f"{result['transport']}; {result['on_mode']}]")
