"""Readers for the public LLM-serving trace formats, so a user can replay their own.

Called by the serving simulator's CLI (``--trace PATH --trace-format F``).
Every reader returns requests in arrival order with arrivals in seconds from
the first request. Anything wrong in the file raises ``UserError`` naming the
file, the line and the field: ``trace.jsonl:12: field 'input_length':
expected an integer >= 1, got -3``.

Formats:
  qwen-bailian  JSONL, one request per line (alibaba-edu/qwen-bailian-usagetraces-anon):
                ``timestamp`` (s), ``input_length``, ``output_length``, ``hash_ids``
                (16-token blocks), optional ``chat_id``, ``parent_chat_id`` (-1 = root),
                ``turn``, ``type``.
  mooncake      JSONL (kvcache-ai/Mooncake FAST25-release/traces): ``timestamp`` (ms),
                ``input_length``, ``output_length``, ``hash_ids`` (512-token blocks).
  azure         CSV (Azure LLM inference traces 2023/2024): ``TIMESTAMP`` (date-time
                or seconds), ``ContextTokens``, ``GeneratedTokens``. No block hashes:
                nothing is reusable.
  burstgpt      CSV (HPMLL/BurstGPT): ``Timestamp`` (s), ``Model``, ``Request tokens``,
                ``Response tokens``, ``Total tokens``, ``Log Type``. No block hashes.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from laxflow.errors import UserError, clip, json_error
from laxflow.sim.workload.request import Request


class _Line:
    """Where a record came from, for error messages."""

    def __init__(self, path: Path, lineno: int) -> None:
        self.path, self.lineno = path, lineno

    def fail(self, field: str, expected: str, got: Any) -> UserError:
        return UserError(f"{self.path}:{self.lineno}: field '{field}': expected {expected}, got {got!r}")

    def integer(self, rec: dict, field: str, minimum: int) -> int:
        if field not in rec:
            raise self.fail(field, f"an integer >= {minimum}", "nothing (missing)")
        v = rec[field]
        if isinstance(v, str):
            try:
                v = int(v.strip())
            except ValueError:
                raise self.fail(field, f"an integer >= {minimum}", rec[field]) from None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(field, f"an integer >= {minimum}", rec[field])
        return v

    def number(self, rec: dict, field: str) -> float:
        if field not in rec:
            raise self.fail(field, "a number >= 0", "nothing (missing)")
        v = rec[field]
        try:
            x = float(v.strip()) if isinstance(v, str) else v
        except ValueError:
            raise self.fail(field, "a number >= 0", v) from None
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise self.fail(field, "a number >= 0", v)
        return float(x)

    def hashes(self, rec: dict, field: str, input_tokens: int, block_size: int) -> tuple[int, ...]:
        v = rec.get(field)
        if not isinstance(v, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in v):
            raise self.fail(field, "a list of integer block hashes", v if v is not None else "nothing (missing)")
        most = math.ceil(input_tokens / block_size)
        if len(v) > most:
            raise self.fail(field, f"at most {most} hashes ({input_tokens} tokens in blocks of {block_size})",
                            len(v))
        return tuple(v)


def _jsonl(path: Path) -> Iterator[tuple[_Line, dict]]:
    with path.open(encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            where = _Line(path, lineno)
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not a JSON object ({json_error(e, line=False)})") from None
            if not isinstance(rec, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            yield where, rec


def _csv(path: Path, required: tuple[str, ...]) -> Iterator[tuple[_Line, dict]]:
    with path.open(encoding="utf-8-sig", newline="") as f:  # tolerate a byte-order mark
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in required if c not in header]
        if missing:
            # Quote at most the start of what was found: a JSONL file read as
            # CSV has its whole first record as its "header".
            found = ", ".join(header)
            if found.startswith("{"):
                found = "a JSON line, not a CSV header: is the trace format right?"
            raise UserError(f"{path}:1: missing column '{missing[0]}' (expected a header with "
                            f"{', '.join(required)}; found {clip(found) or 'nothing'})")
        reader.fieldnames = header
        for row in reader:
            if not any((v or "").strip() for k, v in row.items() if k is not None):
                continue
            yield _Line(path, reader.line_num), row


def _load_qwen(path: Path, block_size: int) -> list[Request]:
    out: list[Request] = []
    first_line: dict[str, int] = {}
    parent_of: dict[str, str | None] = {}
    for where, rec in _jsonl(path):
        inp = where.integer(rec, "input_length", 1)
        chat = str(where.integer(rec, "chat_id", 0)) if "chat_id" in rec else f"line{where.lineno}"
        if chat in first_line:
            raise where.fail("chat_id", "an id not used before", f"{chat} (first on line {first_line[chat]})")
        first_line[chat] = where.lineno
        parent = where.integer(rec, "parent_chat_id", -1) if "parent_chat_id" in rec else -1
        parent_id = None if parent == -1 else f"qwen-{parent}"
        rid = f"qwen-{chat}"
        parent_of[rid] = parent_id
        out.append(Request(id=rid, arrival=where.number(rec, "timestamp"), input_tokens=inp,
                           output_tokens=where.integer(rec, "output_length", 0),
                           block_hashes=where.hashes(rec, "hash_ids", inp, block_size),
                           block_size=block_size, parent=parent_id))
    # A session is named after its root request: follow parents while they are
    # in the file; a parent missing from the file (a clipped trace) is the root.
    sessions = []
    for r in out:
        root = r.id
        for _ in range(len(out)):
            up = parent_of.get(root)
            if up is None:
                break
            root = up
            if up not in parent_of:
                break
        sessions.append(root)
    return [replace(r, session=s) for r, s in zip(out, sessions)]


def _load_mooncake(path: Path, block_size: int) -> list[Request]:
    out = []
    for where, rec in _jsonl(path):
        inp = where.integer(rec, "input_length", 1)
        out.append(Request(id=f"mooncake-{len(out)}", arrival=where.number(rec, "timestamp") / 1000.0,
                           input_tokens=inp, output_tokens=where.integer(rec, "output_length", 0),
                           block_hashes=where.hashes(rec, "hash_ids", inp, block_size), block_size=block_size))
    return out


def _azure_time(where: _Line, value: str | None) -> float:
    """Seconds since the epoch from ``2023-11-16 18:15:46.6805900`` (7 fraction digits) or a number."""
    text = (value or "").strip()
    try:
        return float(text)
    except ValueError:
        pass
    base, _, frac = text.partition(".")
    try:
        t = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").timestamp()
        if frac:
            if not frac.isdigit():
                raise ValueError
            t += int(frac) / 10 ** len(frac)
        return t
    except ValueError:
        raise where.fail("TIMESTAMP", "a date-time like 2023-11-16 18:15:46.68 or seconds", value) from None


def _load_azure(path: Path, block_size: int) -> list[Request]:
    out = []
    for where, row in _csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        out.append(Request(id=f"azure-{len(out)}", arrival=_azure_time(where, row["TIMESTAMP"]),
                           input_tokens=where.integer(row, "ContextTokens", 1),
                           output_tokens=where.integer(row, "GeneratedTokens", 0), block_size=block_size))
    return out


def _load_burstgpt(path: Path, block_size: int) -> list[Request]:
    out = []
    for where, row in _csv(path, ("Timestamp", "Request tokens", "Response tokens")):
        out.append(Request(id=f"burstgpt-{len(out)}", arrival=where.number(row, "Timestamp"),
                           input_tokens=where.integer(row, "Request tokens", 1),
                           output_tokens=where.integer(row, "Response tokens", 0), block_size=block_size))
    return out


# format -> (reader, its native block size in tokens)
TRACE_FORMATS: dict[str, tuple[Callable[[Path, int], list[Request]], int]] = {
    "qwen-bailian": (_load_qwen, 16),
    "mooncake": (_load_mooncake, 512),
    "azure": (_load_azure, 16),
    "burstgpt": (_load_burstgpt, 16),
}


def load_trace(path: str | Path, format: str, *, block_size: int | None = None,
               limit: int | None = None) -> list[Request]:
    """Requests of the trace at ``path`` in ``format``, in arrival order, first arrival at 0 s.

    ``block_size`` overrides the format's hash block size (for a trace hashed
    differently); ``limit`` keeps the first ``limit`` requests by arrival.
    """
    if format not in TRACE_FORMATS:
        raise UserError(f"trace format {format!r}: expected one of {', '.join(TRACE_FORMATS)}")
    reader, native = TRACE_FORMATS[format]
    bs = native if block_size is None else block_size
    if bs < 1:
        raise UserError(f"trace {path}: block_size: expected an integer >= 1, got {bs}")
    p = Path(path)
    if p.is_dir():
        raise UserError(f"trace {p}: is a directory, expected a trace file")
    if not p.is_file():
        raise UserError(f"trace {p}: no such file")
    try:
        reqs = sorted(reader(p, bs), key=lambda r: r.arrival)
    except UnicodeDecodeError as exc:  # a binary or mis-encoded file
        raise UserError(f"trace {p}: not UTF-8 text (byte {exc.start} of a read block)") from None
    if not reqs:
        raise UserError(f"trace {p}: no requests in the file")
    if limit is not None:
        reqs = reqs[:limit]
    t0 = reqs[0].arrival
    return [replace(r, arrival=r.arrival - t0) for r in reqs]
