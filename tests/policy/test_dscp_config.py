"""DSCP map defaults and validation; MfsConfig validation."""

from __future__ import annotations

import pytest

from laxflow.errors import UserError
from laxflow.policy.config import MfsConfig
from laxflow.policy.dscp import CNP_DSCP, LOSSLESS_DSCP, DscpMap, default_dscp_map


@pytest.mark.parametrize("k", [2, 8, 16])
def test_default_map_is_distinct_and_avoids_roce_classes(k):
    m = default_dscp_map(k)
    codes = list(m.level_dscp) + [m.scavenger_dscp]
    assert len(set(codes)) == k + 1
    assert CNP_DSCP not in codes and LOSSLESS_DSCP not in codes
    assert m.level_tc[0] == 5 and all(1 <= tc <= 4 for tc in m.level_tc[1:])
    assert list(m.level_tc[1:]) == sorted(m.level_tc[1:], reverse=True)  # lower levels never on higher TCs
    assert m.dscp(k) == m.scavenger_dscp and m.tos(0) == m.level_dscp[0] << 2
    # the most urgent levels keep a queue each (MFS caps RLI at the physical queues): level 1, where
    # collectives and RLI-0 reads go, never shares its switch queue with a looser level
    top = min(k, 5)
    assert len(set(m.level_tc[:top])) == top
    assert all(tc == 1 for tc in m.level_tc[4:])


def test_default_map_for_eight_levels():
    m = default_dscp_map(8)
    assert m.level_dscp == (39, 38, 37, 36, 35, 34, 33, 32)
    assert m.level_tc == (5, 4, 3, 2, 1, 1, 1, 1)
    assert (m.scavenger_dscp, m.scavenger_tc) == (8, 0)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"level_dscp": (48, 1), "level_tc": (5, 4)}, "reserved for CNP"),
        ({"level_dscp": (1, 1), "level_tc": (5, 4)}, "distinct"),
        ({"level_dscp": (1, 70), "level_tc": (5, 4)}, "out of range"),
        ({"level_dscp": (1, 2), "level_tc": (6, 4)}, "traffic class 6"),
        ({"level_dscp": (1, 2), "level_tc": (5,)}, "equal length"),
    ],
)
def test_map_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        DscpMap(**kw)


@pytest.mark.parametrize(
    "kw, field",
    [({"levels": 1}, "levels"), ({"E": 1.0}, "E"), ({"U": 0.0}, "U"), ({"period": 0}, "period"),
     ({"drop_budget": -1}, "drop_budget"), ({"bogus": 1}, "bogus")],
)  # fmt: skip
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(UserError, match=field):
        MfsConfig.from_mapping(kw)


def test_config_accepts_a_dscp_mapping_of_matching_size():
    cfg = MfsConfig.from_mapping({"levels": 2, "dscp": {"levels": [10, 12], "level_tc": [5, 4]}})
    assert cfg.dscp_map.dscp(1) == 12
    with pytest.raises(UserError, match="dscp map has 2 levels"):
        MfsConfig.from_mapping({"levels": 3, "dscp": {"levels": [10, 12], "level_tc": [5, 4]}})


def test_dscp_command_prints_the_map():
    import json

    from typer.testing import CliRunner

    from laxflow.policy_cli import app

    out = CliRunner().invoke(app, ["dscp", "--levels", "8", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["levels"] == list(default_dscp_map(8).level_dscp) and data["scavenger"] == 8
    assert data["reserved"] == {"26": "default lossless RoCE", "48": "CNP"}
    table = CliRunner().invoke(app, ["dscp"])
    assert "scavenger" in table.output and "39" in table.output
