"""Distances per level of the host - rack - site tree, and link overrides (cross_resource_scheduler.topology)."""

from __future__ import annotations

from cross_resource_scheduler.topology import Distance, TopologyModel
from harness.v1 import common_pb2


def loc(site: str, rack: str, host: str) -> common_pb2.Location:
    return common_pb2.Location(site=site, rack=rack, host=host)


def test_distance_per_level() -> None:
    t = TopologyModel()
    h = loc("s1", "r1", "h1")
    assert t.distance(h, loc("s1", "r1", "h1")) == Distance(0, 0.0, 1000.0)
    assert t.distance(h, loc("s1", "r1", "h2")) == Distance(2, 0.05, 10.0)
    assert t.distance(h, loc("s1", "r2", "h3")) == Distance(4, 0.2, 10.0)
    assert t.distance(h, loc("s2", "r1", "h1x")) == Distance(6, 5.0, 1.0)
    assert t.max_hops == 6


def test_distance_is_symmetric_and_monotone_in_level() -> None:
    t = TopologyModel()
    pts = [loc("s1", "r1", "h1"), loc("s1", "r1", "h2"), loc("s1", "r2", "h3"), loc("s2", "r9", "h4")]
    for a in pts:
        for b in pts:
            assert t.distance(a, b) == t.distance(b, a)
    d = [t.distance(pts[0], p) for p in pts]
    assert [x.hops for x in d] == sorted(x.hops for x in d)
    assert [x.latency_ms for x in d] == sorted(x.latency_ms for x in d)
    assert [x.bandwidth_gbps for x in d] == sorted((x.bandwidth_gbps for x in d), reverse=True)


def test_same_host_name_in_another_site_is_not_the_same_host() -> None:
    t = TopologyModel()
    assert t.distance(loc("s1", "r1", "h1"), loc("s2", "r1", "h1")).hops == 6


def test_empty_host_or_rack_does_not_collapse_levels() -> None:
    t = TopologyModel()
    # Two resources with no host name are not "the same host".
    assert t.distance(loc("s1", "r1", ""), loc("s1", "r1", "")).hops == 2
    # Two resources with no rack name in one site are only "same site".
    assert t.distance(loc("s1", "", "h1"), loc("s1", "", "h2")).hops == 4


def test_level_settings_are_configurable() -> None:
    t = TopologyModel(same_rack=Distance(1, 0.01, 100.0), cross_site=Distance(10, 50.0, 0.5))
    assert t.distance(loc("s", "r", "a"), loc("s", "r", "b")) == Distance(1, 0.01, 100.0)
    assert t.distance(loc("s", "r", "a"), loc("t", "r", "b")) == Distance(10, 50.0, 0.5)
    assert t.max_hops == 10


def test_rack_link_overrides_latency_and_bandwidth_not_hops() -> None:
    t = TopologyModel()
    t.add_link(common_pb2.Link(a="r1", b="r2", latency_ms=0.1, bandwidth_gbps=40.0))
    d = t.distance(loc("s1", "r1", "h1"), loc("s1", "r2", "h2"))
    assert d == Distance(4, 0.1, 40.0)
    # both directions
    assert t.distance(loc("s1", "r2", "h2"), loc("s1", "r1", "h1")) == d
    # another pair of racks keeps the level default
    assert t.distance(loc("s1", "r1", "h1"), loc("s1", "r3", "h3")) == Distance(4, 0.2, 10.0)
    # a rack link does not change same-rack distance
    assert t.distance(loc("s1", "r1", "h1"), loc("s1", "r1", "h9")) == Distance(2, 0.05, 10.0)


def test_site_link_overrides_cross_site_distance() -> None:
    t = TopologyModel()
    t.add_link(common_pb2.Link(a="east", b="west", latency_ms=20.0, bandwidth_gbps=0.1))
    assert t.distance(loc("east", "r1", "h1"), loc("west", "r1", "h2")) == Distance(6, 20.0, 0.1)
    assert t.distance(loc("west", "r1", "h2"), loc("east", "r7", "h1")) == Distance(6, 20.0, 0.1)
    assert t.distance(loc("east", "r1", "h1"), loc("north", "r1", "h2")) == Distance(6, 5.0, 1.0)


def test_link_with_unset_fields_keeps_the_level_values() -> None:
    t = TopologyModel()
    t.add_link(common_pb2.Link(a="r1", b="r2", bandwidth_gbps=25.0))  # latency unset
    assert t.distance(loc("s", "r1", "a"), loc("s", "r2", "b")) == Distance(4, 0.2, 25.0)
    t.add_link(common_pb2.Link(a="s", b="t", latency_ms=9.0))  # bandwidth unset
    assert t.distance(loc("s", "r1", "a"), loc("t", "r2", "b")) == Distance(6, 9.0, 1.0)


def test_level_links_lists_each_link_once() -> None:
    t = TopologyModel()
    t.add_link(common_pb2.Link(a="r1", b="r2", latency_ms=0.1))
    t.add_link(common_pb2.Link(a="s1", b="s2", latency_ms=7.0))
    t.add_link(common_pb2.Link(a="r2", b="r1", latency_ms=0.3))  # replaces the first, reversed
    links = t.level_links()
    assert len(links) == 2
    by_pair = {frozenset((lk.a, lk.b)): lk.latency_ms for lk in links}
    assert by_pair == {frozenset(("r1", "r2")): 0.3, frozenset(("s1", "s2")): 7.0}
    assert t.distance(loc("x", "r1", "a"), loc("x", "r2", "b")).latency_ms == 0.3
