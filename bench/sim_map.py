"""``laxflow sim map`` at its defaults, for the results pages: the cells as one JSON document on stdout.

    python bench/sim_map.py --out out/results/sim_map --plot docs/results/map

Runs the real command (``laxflow sim map --json OUT/map.json --csv OUT/map.csv --plot PLOT --jobs N``,
plus any arguments after ``--``), resumable like the command itself (the cells already in
``OUT/map.json`` are not re-run), and prints ``{"settings", "cells", "wall_s", "plots"}``: the map's
own JSON with its wall time and the heatmap files it wrote. Not a test: only wall time depends on
the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/sim_map", help="folder for map.json (resumable) and map.csv")
    ap.add_argument("--plot", default=None, help="folder for the heatmaps (default: OUT)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("rest", nargs="*", help="more `laxflow sim map` flags, after --")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    plot = Path(a.plot) if a.plot else out
    laxflow = Path(sys.executable).with_name("laxflow")  # the entry point beside this interpreter (.venv/bin)
    cmd = [str(laxflow), "sim", "map", "--json", str(out / "map.json"), "--csv",
           str(out / "map.csv"), "--plot", str(plot), "--jobs", str(a.jobs), "--quiet", *a.rest]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=sys.stderr)
    if proc.returncode != 0:
        print(f"sim_map: laxflow sim map exited with {proc.returncode}", file=sys.stderr)
        return proc.returncode
    doc = json.loads((out / "map.json").read_text())
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    doc["plots"] = sorted(str(p) for p in plot.glob("map-*.png"))
    doc["command"] = "laxflow sim map " + " ".join(cmd[cmd.index("map") + 1:])
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
