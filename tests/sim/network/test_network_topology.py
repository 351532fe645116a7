"""Topologies: link tables, routes, ECMP and flow-group usage vectors."""

from __future__ import annotations

import numpy as np
import pytest

from laxflow.sim.network import Topology, big_switch, leaf_spine, mfs_testbed


def test_big_switch_route_is_egress_then_ingress():
    topo = big_switch(4, 10.0)
    assert topo.num_links == 8
    assert list(topo.path(1, 3)) == [topo.egress(1), topo.ingress(3)]
    assert topo.link_ids[topo.egress(1)] == "nic1.out"
    assert topo.link_ids[topo.ingress(3)] == "nic3.in"
    assert topo.path(2, 2).size == 0
    np.testing.assert_array_equal(topo.capacity, 10.0)


def test_leaf_spine_routes_and_capacities():
    topo = leaf_spine(16, 4, 100.0, oversubscription=2.0, num_spines=2)
    assert topo.num_leaves == 4
    # 32 host links + 4 leaves * 2 spines * 2 directions.
    assert topo.num_links == 32 + 16
    # Leaf uplinks add up to 4 NICs * 100 / 2.
    up = [topo.uplink(0, s) for s in range(2)]
    assert topo.capacity[up].sum() == pytest.approx(200.0)
    # Same leaf: two host links only.
    assert list(topo.path(0, 3)) == [topo.egress(0), topo.ingress(3)]
    # Across leaves: egress, leaf->spine, spine->leaf, ingress, same spine both hops.
    p = topo.path(1, 9)
    assert len(p) == 4
    assert p[0] == topo.egress(1) and p[3] == topo.ingress(9)
    spine = int(topo.spine_of(np.array([1]), np.array([9]))[0])
    assert p[1] == topo.uplink(0, spine) and p[2] == topo.downlink(spine, 2)
    assert topo.link_ids[p[1]] == f"leaf0>spine{spine}"


def test_ecmp_is_deterministic_and_spreads_over_spines():
    a = leaf_spine(256, 16, 1.0)
    b = leaf_spine(256, 16, 1.0)
    src = np.repeat(np.arange(16), 240)
    dst = np.tile(np.arange(16, 256), 16)
    spines_a = a.spine_of(src, dst)
    np.testing.assert_array_equal(spines_a, b.spine_of(src, dst))
    counts = np.bincount(spines_a, minlength=16)
    # Every spine is used, none by more than twice its fair share.
    assert counts.min() > 0 and counts.max() < 2 * counts.mean()


def test_route_many_matches_path():
    topo = leaf_spine(64, 8, 1.0, num_spines=4)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 64, 50)
    dst = rng.integers(0, 64, 50)
    pair, link = topo.route_many(src, dst)
    for k in range(50):
        np.testing.assert_array_equal(link[pair == k], topo.path(int(src[k]), int(dst[k])))


def test_usage_of_an_all_to_all_on_a_big_switch():
    topo = big_switch(4, 1.0)
    traffic = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    links, weights, total = topo.usage(traffic)
    assert total == 24.0
    np.testing.assert_array_equal(links, np.arange(8))
    # Every port carries 3 of the 12 pairs.
    np.testing.assert_allclose(weights, 0.25)


def test_usage_weights_follow_bytes_per_link():
    topo = big_switch(3, 1.0)
    links, weights, total = topo.usage({(0, 1): 3.0, (0, 2): 1.0})
    assert total == 4.0
    got = dict(zip((topo.link_ids[l] for l in links), weights))
    assert got == pytest.approx({"nic0.out": 1.0, "nic1.in": 0.75, "nic2.in": 0.25})


def test_usage_rejects_bad_traffic():
    topo = big_switch(2, 1.0)
    with pytest.raises(ValueError, match="out of range"):
        topo.usage({(0, 5): 1.0})
    with pytest.raises(ValueError, match="no bytes"):
        topo.usage({(0, 1): 0.0})


def test_mfs_testbed_names_servers_and_nics():
    topo = mfs_testbed(2, 4, 25e9)
    assert topo.num_nics == 8
    assert topo.nic(1, 2) == 6
    assert topo.server_of(6) == 1
    assert topo.link_ids[topo.egress(6)] == "s1n2.out"
    assert list(topo.path(0, 7)) == [topo.egress(0), topo.ingress(7)]


def test_bare_links():
    topo = Topology.from_links(["a", "b"], [1.0, 2.0])
    assert topo.index("b") == 1 and topo.num_nics == 0
    with pytest.raises(ValueError, match="no NICs"):
        topo.route_many(np.array([0]), np.array([1]))
    with pytest.raises(ValueError, match="duplicate"):
        Topology.from_links(["a", "a"], [1.0, 1.0])
    with pytest.raises(ValueError, match="> 0"):
        Topology.from_links(["a"], [0.0])


def test_bad_factory_arguments():
    with pytest.raises(ValueError, match="num_nics"):
        big_switch(0, 1.0)
    with pytest.raises(ValueError, match="oversubscription"):
        leaf_spine(8, 4, 1.0, oversubscription=0.0)
    with pytest.raises(ValueError, match="out of range"):
        big_switch(2, 1.0).path(0, 2)
