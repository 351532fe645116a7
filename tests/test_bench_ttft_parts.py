"""bench/ttft_parts.py: TTFT split into queue, compute and P2D tail per policy, with the decode units' TPOT."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def tp(bench_script):
    return bench_script("ttft_parts", "sim_claims")


def _run(tp, capsys, *extra: str) -> dict:
    assert tp.main(["--point", "fig12-conv", "--servers", "4", "--requests", "12", "--warmup", "4", "--seeds", "2",
                    "--policies", "fs,mfs", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_parts_add_up_to_ttft_and_decode_batches_report_tpot(tp, capsys):
    out = _run(tp, capsys)
    assert out["decode"] == "steps" and set(out["policies"]) == {"fs", "mfs"}
    for pol in out["policies"].values():
        assert len(pol["slo_attainment"]["seeds"]) == 2
        assert all(pol[f"{k}_ms"]["mean"] >= 0 for k in tp.PARTS) and pol["tpot_ms"]["mean"] > 0
    held = _run(tp, capsys, "--decode", "hold")
    assert held["decode"] == "hold" and all("tpot_ms" not in p for p in held["policies"].values())
    for pol in out["policies"]:  # 4 servers: one decode unit (16 GPUs), so the decode model cannot move TTFT
        for k in tp.PARTS:
            assert held["policies"][pol][f"{k}_ms"]["seeds"] == out["policies"][pol][f"{k}_ms"]["seeds"]
