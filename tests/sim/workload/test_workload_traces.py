"""Trace loaders on small files written here, and malformed lines failing with file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laxflow.errors import UserError
from laxflow.sim.workload import load_trace, prefix_reuse_fraction


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


QWEN = [
    {"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 40, "output_length": 12,
     "type": "text", "turn": 1, "hash_ids": [10, 11, 12]},
    {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 70, "output_length": 8,
     "type": "text", "turn": 2, "hash_ids": [10, 11, 13, 14, 15]},
    {"chat_id": 7, "parent_chat_id": -1, "timestamp": 61.0, "input_length": 16, "output_length": 1,
     "type": "search", "turn": 1, "hash_ids": [99]},
    {"chat_id": 161, "parent_chat_id": 160, "timestamp": 70.0, "input_length": 100, "output_length": 5,
     "type": "text", "turn": 3, "hash_ids": [10, 11, 13, 14, 16, 17, 18]},
]


def test_qwen_bailian(tmp_path: Path) -> None:
    reqs = load_trace(write_jsonl(tmp_path / "q.jsonl", QWEN), "qwen-bailian")
    assert [r.id for r in reqs] == ["qwen-7", "qwen-159", "qwen-160", "qwen-161"]  # arrival order
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 0.114, 1.5, 9.0])
    r = reqs[2]
    assert (r.input_tokens, r.output_tokens, r.block_size) == (70, 8, 16)
    assert r.block_hashes == (10, 11, 13, 14, 15)
    assert r.parent == "qwen-159" and r.session == "qwen-159"
    assert reqs[3].session == "qwen-159" and reqs[0].session == "qwen-7" and reqs[0].parent is None
    # 160 reuses blocks 10, 11 (32 tokens); 161 reuses 10, 11, 13, 14 (64 tokens).
    assert prefix_reuse_fraction(reqs) == pytest.approx((32 + 64) / (16 + 40 + 70 + 100))


def test_mooncake_timestamps_are_milliseconds(tmp_path: Path) -> None:
    recs = [{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": list(range(14))},
            {"timestamp": 3052, "input_length": 2287, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]}]
    reqs = load_trace(write_jsonl(tmp_path / "m.jsonl", recs), "mooncake")
    assert [r.arrival for r in reqs] == [0.0, 3.052]
    assert reqs[1].block_size == 512 and reqs[1].block_hashes == (0, 42, 43, 44, 45)
    assert prefix_reuse_fraction(reqs) == pytest.approx(512 / (6755 + 2287))


def test_azure_csv(tmp_path: Path) -> None:
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n"
                 "2023-11-16 18:15:46.1805900,879,1\n")
    reqs = load_trace(p, "azure")
    assert [r.input_tokens for r in reqs] == [879, 374, 396]
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 0.5, 4.8145790])
    assert all(r.block_hashes == () for r in reqs)
    assert prefix_reuse_fraction(reqs) == 0.0


def test_burstgpt_csv(tmp_path: Path) -> None:
    p = tmp_path / "burst.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n"
                 "45,ChatGPT,1087,0,1087,API log\n")
    reqs = load_trace(p, "burstgpt")
    assert [(r.arrival, r.input_tokens, r.output_tokens) for r in reqs] == [(0.0, 472, 18), (40.0, 1087, 0)]


def test_limit_and_block_size_override(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "q.jsonl", QWEN)
    assert [r.id for r in load_trace(p, "qwen-bailian", limit=2)] == ["qwen-7", "qwen-159"]
    assert {r.block_size for r in load_trace(p, "qwen-bailian", block_size=8)} == {8}
    with pytest.raises(UserError, match=r"q\.jsonl:1: field 'hash_ids': expected at most 2 hashes .*, got 3"):
        load_trace(p, "qwen-bailian", block_size=32)  # 40 tokens hold 2 blocks of 32


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"timestamp": 1, "input_length": -3, "output_length": 1, "hash_ids": []}',
         r"m\.jsonl:2: field 'input_length': expected an integer >= 1, got -3"),
        ('{"timestamp": 1, "output_length": 1, "hash_ids": []}',
         r"m\.jsonl:2: field 'input_length': expected .*missing"),
        ('{"timestamp": "soon", "input_length": 3, "output_length": 1, "hash_ids": [1]}',
         r"m\.jsonl:2: field 'timestamp': expected a number >= 0, got 'soon'"),
        ('{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": "abc"}',
         r"m\.jsonl:2: field 'hash_ids': expected a list of integer block hashes"),
        ('{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [1, 2]}',
         r"m\.jsonl:2: field 'hash_ids': expected at most 1 hashes"),
        ('{"timestamp": 1, "input_length": 3, ', r"m\.jsonl:2: not a JSON object"),
        ('[1, 2]', r"m\.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_malformed_mooncake_lines(tmp_path: Path, line: str, match: str) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})
    p = write_jsonl(tmp_path / "m.jsonl", [good, line])
    with pytest.raises(UserError, match=match):
        load_trace(p, "mooncake")


def test_malformed_qwen_duplicate_chat_id(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "q.jsonl", [QWEN[0], QWEN[0]])
    with pytest.raises(UserError, match=r"q\.jsonl:2: field 'chat_id': expected an id not used before.*line 1"):
        load_trace(p, "qwen-bailian")


def test_malformed_csv(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                 "2023-11-16 18:15:47.00,many,44\n")
    with pytest.raises(UserError, match=r"a\.csv:3: field 'ContextTokens': expected an integer >= 1, got 'many'"):
        load_trace(p, "azure")
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,374,44\n")
    with pytest.raises(UserError, match=r"a\.csv:2: field 'TIMESTAMP'"):
        load_trace(p, "azure")
    p.write_text("Timestamp,Model,Request tokens,Total tokens\n1,ChatGPT,3,4\n")
    with pytest.raises(UserError, match=r"a\.csv:1: missing column 'Response tokens'"):
        load_trace(p, "burstgpt")


def test_file_and_format_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        load_trace(tmp_path / "missing.jsonl", "mooncake")
    with pytest.raises(UserError, match="no requests"):
        load_trace(write_jsonl(tmp_path / "empty.jsonl", []), "mooncake")
    with pytest.raises(UserError, match="trace format 'sharegpt': expected one of qwen-bailian, mooncake"):
        load_trace(tmp_path / "x", "sharegpt")
    binary = tmp_path / "plot.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n")
    for fmt in ("mooncake", "azure"):  # a JSONL and a CSV reader
        with pytest.raises(UserError, match=r"plot.png: not UTF-8 text"):
            load_trace(binary, fmt)


def test_optional_qwen_fields_and_numeric_azure_times(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "q.jsonl", [{"timestamp": 2.0, "input_length": 5, "output_length": 1,
                                            "hash_ids": [3]}])
    (r,) = load_trace(p, "qwen-bailian")
    assert r.id == "qwen-line1" and r.parent is None and r.session == "qwen-line1"
    a = tmp_path / "a.csv"
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n10.5,3,1\n12,4\n")
    with pytest.raises(UserError, match=r"a\.csv:3: field 'GeneratedTokens': expected an integer >= 0, got None"):
        load_trace(a, "azure")
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n10.5,3,1\n12,4,2\n")
    assert [r.arrival for r in load_trace(a, "azure")] == [0.0, 1.5]
