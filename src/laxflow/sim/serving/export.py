"""Per-request rows of a serving run, and the ``--requests-out`` file they go to.

``request_rows`` is called by :func:`~laxflow.sim.serving.experiment.run_one`
(in whichever process ran the simulation) when the spec asks for it;
``write_requests`` by ``laxflow sim serve`` / ``sweep`` in the main process
once every run is back. Times are in seconds, sizes in bytes, tokens counted.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from laxflow.errors import UserError
from laxflow.sim.serving.metrics import met_slo, request_metrics

# A request's decode, last in each row (empty / null where none ran: the unit engine with --decode hold).
DECODE_COLUMNS = (
    "outputs",  # tokens emitted, the first included
    "tpot",  # s, (last token - first) / (outputs - 1); 0 for one output
    "max_tbt",  # s, the largest gap between consecutive tokens
    "preemptions",  # recompute preemptions of its decode for KV memory
)
# One row per measured request and policy, in this column order.
REQUEST_COLUMNS = (
    "policy",
    "rate",  # requests/s per prefill GPU of the run
    "seed",
    "id",
    "arrival",  # s from the first request
    "prompt_tokens",
    "reused_tokens",  # prefix tokens not recomputed (cached locally or fetched)
    "remote_tokens",  # of those, fetched from another unit (stage 1)
    "unit",  # prefill unit index
    "decode_unit",
    "batch",
    "slo",  # s, TTFT budget
    "ttft",  # s
    "met",  # ttft <= slo
    "bytes_reuse",
    "bytes_collective",
    "bytes_p2d",
    "stall",  # s its batch waited on the network (non-overlapped communication)
    *DECODE_COLUMNS,
)
REQUEST_FORMATS = (".csv", ".jsonl")


def decode_columns(seq: Any | None, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``DECODE_COLUMNS`` of a request from its decode (an ``instances.instance.Seq``; None: none ran);
    ``metrics``: its ``request_metrics`` when the caller has them already."""
    if seq is None:
        return dict.fromkeys(DECODE_COLUMNS)
    m = request_metrics(seq) if metrics is None else metrics
    return {"outputs": len(seq.token_times), "tpot": m["tpot"], "max_tbt": m["max_tbt"],
            "preemptions": seq.preemptions}


def request_rows(result: Any, seed: int, rate: float) -> list[dict[str, Any]]:
    """One dict per measured request of ``result`` (a SimResult), keys ``REQUEST_COLUMNS``."""
    rows = []
    for s in result.measured:
        ttft = float(s.ttft)
        rows.append({
            "policy": result.policy,
            "rate": rate,
            "seed": seed,
            "id": s.id,
            "arrival": s.arrival,
            "prompt_tokens": s.input_tokens,
            "reused_tokens": int(s.route.reused_tokens),
            "remote_tokens": int(s.route.remote_tokens),
            "unit": int(s.route.prefill),
            "decode_unit": int(s.route.decode),
            "batch": s.batch,
            "slo": float(s.slo),
            "ttft": ttft,
            "met": met_slo(ttft, s.slo),
            "bytes_reuse": float(s.bytes.get("reuse", 0.0)),
            "bytes_collective": float(s.bytes.get("collective", 0.0)),
            "bytes_p2d": float(s.bytes.get("p2d", 0.0)),
            "stall": float(s.stall),
            **decode_columns(None if result.decode is None else result.decode[s.index]),
        })
    return rows


def check_requests_path(path: Path) -> None:
    """Refuse a ``--requests-out`` path whose extension says no format (before any run)."""
    if path.suffix.lower() not in REQUEST_FORMATS:
        raise UserError(f"--requests-out: {str(path)!r}: expected a .csv or .jsonl file name")


def write_requests(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as CSV (header line) or JSON lines, by ``path``'s extension."""
    try:
        with path.open("w", newline="", encoding="utf-8") as f:
            if path.suffix.lower() == ".csv":
                writer = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
            else:
                for row in rows:
                    f.write(json.dumps({k: row[k] for k in REQUEST_COLUMNS}, allow_nan=False) + "\n")
    except OSError as exc:
        raise UserError(f"--requests-out: cannot write {str(path)!r}: {exc.strerror}") from None
