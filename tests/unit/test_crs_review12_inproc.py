"""The CRS after its twelfth review, in-process: the topology weigher's cost and scores, instance and name
limits, attribute defaults, the parse cache's size bound, a node leaving between placing and assuming,
site-qualified rack links, and the registry's address checks."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import cross_resource_scheduler.service as crs_service
from cross_resource_scheduler.constraints import Constraint
from cross_resource_scheduler.placement import PlacementRequest, schedule
from cross_resource_scheduler.plugins import Context, GroupDemand, Pipeline, TopologyWeigher
from cross_resource_scheduler.service import Crs, CrsConfig
from cross_resource_scheduler.topology import Distance, TopologyModel
from cross_resource_scheduler.view import CapacityView, Node
from harness.v1 import common_pb2, irm_pb2, registry_pb2
from services.config import ConfigError
from services.errors import InvalidArgument, Unavailable
from tests.unit.test_crs_service_parse import _group, _specs

NUMBER = irm_pb2.AttributeSpec.KIND_NUMBER


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = Crs(CrsConfig(state_dir=str(tmp_path)))
    yield c
    c.db.dispose()


def _node(view: CapacityView, hid: str, site: str, rack: str, host: str, cores: float = 4) -> Node:
    return view.upsert("m", common_pb2.PhysicalResource(
        id=hid, resource_type="vm", capacity={"cores": cores}, used={"cores": 0},
        location=common_pb2.Location(site=site, rack=rack, host=host), generation=1))


# -- item 2: the topology weigher -------------------------------------------------------------------------------


def _per_instance_score(node: Node, ctx: Context) -> float:
    """TopologyWeigher's score as it was computed before peers were counted by location: the mean, over every
    placed peer instance, of its distance's score."""
    me = ctx.group.name
    related = {c.other(me) for c in ctx.constraints if c.kind != "different_host"}
    peers = [p for g in related for p in ctx.placed.get(g, [])]
    if not peers:
        peers = [p for nodes in ctx.placed.values() for p in nodes]
    if not peers:
        return 0.5
    topo = ctx.topology
    top_bw = math.log1p(max(topo.same_host.bandwidth_gbps, 1e-9))
    max_hops = max(1, topo.max_hops)
    total = 0.0
    for p in peers:
        d = topo.distance(node.location, p.location)
        hop_score = 1.0 - d.hops / max_hops
        bw_score = math.log1p(d.bandwidth_gbps) / top_bw if top_bw > 0 else 0.0
        total += (2 * hop_score + min(1.0, bw_score)) / 3
    return total / len(peers)


@pytest.mark.parametrize("seed", range(20))
def test_the_topology_weigher_scores_as_the_mean_over_every_placed_instance(seed: int) -> None:
    rng = random.Random(seed)
    topo = TopologyModel()
    topo.add_link(common_pb2.Link(a="r0", b="r1", latency_ms=0.01, bandwidth_gbps=100.0))
    topo.add_link(common_pb2.Link(a="s0/r1", b="s0/r2", bandwidth_gbps=40.0))
    topo.add_link(common_pb2.Link(a="s0", b="s2", latency_ms=1.0, bandwidth_gbps=5.0))
    view = CapacityView()
    # Empty racks and hosts, and host names repeated across sites and racks: every branch of distance().
    nodes = [_node(view, f"n{i}", f"s{rng.randrange(3)}", rng.choice(["", "r0", "r1", "r2"]),
                   rng.choice(["", "h0", "h1", "h2", "h3"])) for i in range(30)]
    groups = ["a", "b", "c"]
    placed = {g: [rng.choice(nodes) for _ in range(rng.randrange(0, 12))] for g in groups}
    constraints = rng.choice([[], [Constraint("max_hops", "a", "b", 4)], [Constraint("different_host", "a", "c", 0)],
                              [Constraint("same_host", "a", "a", 0), Constraint("max_latency_ms", "a", "c", 9)]])
    for me in groups:
        mine = [c for c in constraints if c.involves(me)]
        for ctx in (Context(GroupDemand(me, "vm", 1, {"cores": 1}), mine, placed, {}, topo),
                    Context(GroupDemand(me, "vm", 1, {"cores": 1}), mine, placed, {}, topo, False, {
                        g: _located(ns) for g, ns in placed.items()})):
            score = TopologyWeigher().scorer(ctx)
            for node in nodes:
                got = score if isinstance(score, float) else score(node)
                assert got == pytest.approx(_per_instance_score(node, ctx), rel=1e-12, abs=1e-15)


def _located(nodes: list[Node]):  # type: ignore[no-untyped-def]
    from collections import Counter

    return Counter((n.location.site, n.location.rack, n.location.host) for n in nodes)


def test_placing_many_instances_costs_the_distinct_locations_not_every_pair_of_instances() -> None:
    view = CapacityView()
    for i in range(100):
        _node(view, f"h{i}", f"s{i % 2}", f"r{i % 10}", f"h{i}", cores=4)
    topo = TopologyModel()
    calls = [0]
    for name in ("distance", "distance_between"):
        real = getattr(topo, name, None)
        if real is not None:
            def counted(*a, _real=real):  # type: ignore[no-untyped-def]
                calls[0] += 1
                return _real(*a)
            setattr(topo, name, counted)
    pipe = Pipeline.from_names(["capacity"], {"pack": 1.0, "topology": 2.0})
    req = PlacementRequest([GroupDemand("g", "vm", 300, {"cores": 1})])
    placement = schedule(req, view, pipe, topo, random.Random(1))
    assert len(placement.nodes["g"]) == 300
    # Per instance: its candidates (16) against every instance placed before was ~720,000 distance computations
    # here; against the racks of a site and the sites (and cached per pair) it is a few thousand.
    assert calls[0] < 20_000, calls[0]


def test_a_request_of_more_than_max_instances_in_all_is_invalid(crs: Crs) -> None:
    specs = _specs()
    crs._specs = lambda: specs  # type: ignore[method-assign]
    groups = []
    for i in range(5):  # 5 x 1000 > 4096, each group within MAX_COUNT
        g = _group(1, count=1000)
        g.name = f"g{i}"
        groups.append(g)
    with pytest.raises(InvalidArgument) as e:
        crs._parse(groups, [])
    assert [v.field for v in e.value.violations] == ["groups"]
    assert "5000 instances" in e.value.message and f"at most {crs_service.MAX_INSTANCES}" in e.value.message
    assert len(crs._parse(groups[:4], []).groups) == 4  # 4000: accepted


# -- item 3: a consumable left out counts at its default ----------------------------------------------------------


def test_a_consumable_left_out_counts_at_the_managers_default(crs: Crs) -> None:
    specs = {"vfpga": {
        "devices": irm_pb2.AttributeSpec(name="devices", kind=NUMBER, consumable=True, domain=common_pb2.Range(min=1),
                                         default=common_pb2.AttributeRequest(number=1)),
        "lanes": irm_pb2.AttributeSpec(name="lanes", kind=NUMBER, consumable=True,
                                       default=common_pb2.AttributeRequest(range=common_pb2.Range(min=2, max=8))),
        "slots": irm_pb2.AttributeSpec(name="slots", kind=NUMBER, consumable=True),  # no default: not counted
        "speed": irm_pb2.AttributeSpec(name="speed", kind=NUMBER,  # not consumable: never a demand
                                       default=common_pb2.AttributeRequest(number=3))}}
    crs._specs = lambda: specs  # type: ignore[method-assign]
    bare = crs._parse([irm_pb2.ResourceGroup(name="g", resource_type="vfpga", count=1)], [])
    assert bare.groups[0].demand == {"devices": 1.0, "lanes": 2.0}
    asked = crs._parse([irm_pb2.ResourceGroup(name="g", resource_type="vfpga", count=1, attributes={
        "devices": common_pb2.AttributeRequest(number=3)})], [])
    assert asked.groups[0].demand == {"devices": 3.0, "lanes": 2.0}


# -- item 5: group names and the parse cache ---------------------------------------------------------------------


def test_a_group_name_over_128_characters_is_invalid(crs: Crs) -> None:
    specs = _specs()
    crs._specs = lambda: specs  # type: ignore[method-assign]
    g = _group(1)
    g.name = "n" * 128
    assert crs._parse([g], []).groups[0].name == g.name
    g.name = "n" * 129
    with pytest.raises(InvalidArgument) as e:
        crs._parse([g], [])
    assert [v.field for v in e.value.violations] == ["groups[0].name"]
    assert "at most 128 characters, got 129" in e.value.message


def test_a_large_request_is_parsed_but_not_kept_in_the_cache(crs: Crs) -> None:
    specs = _specs()
    crs._specs = lambda: specs  # type: ignore[method-assign]
    small = crs._parse([_group(1)], [])
    assert crs._parse([_group(1)], []) is small  # small ones are cached
    big = []
    for i in range(600):  # ~100 KiB serialized
        g = _group(1)
        g.name = f"{i:04d}" + "x" * 120
        big.append(g)
    assert sum(len(g.SerializeToString()) for g in big) > crs_service._PARSE_CACHE_MAX_BYTES
    parsed = crs._parse(big, [])
    assert len(parsed.groups) == 600
    assert crs._parse(big, []) is not parsed
    assert all(sum(map(len, key[0])) <= crs_service._PARSE_CACHE_MAX_BYTES for key in crs._parsed[1])


# -- item 4: a node removed between placing and assuming ---------------------------------------------------------


def test_a_node_removed_after_placement_is_unavailable_and_nothing_stays_assumed(crs: Crs, monkeypatch) -> None:
    for h in ("h1", "h2"):
        _node(crs.view, h, "s", "r", h, cores=10)
    real = crs_service.schedule

    def racing(req, view, *a):  # type: ignore[no-untyped-def]
        p = real(req, view, *a)
        view.remove("m", sorted(p.demand)[-1].split("/", 1)[1])  # the watch thread, right after placing
        return p
    monkeypatch.setattr(crs_service, "schedule", racing)
    req = PlacementRequest([GroupDemand("g", "vm", 2, {"cores": 6})], [Constraint("different_host", "g", "g", 0)])
    with pytest.raises(Unavailable) as e:
        crs._place(req, 0, "tok")
    assert "left the capacity view" in e.value.message and "retry" in e.value.message
    assert crs.view._assumptions == {} and crs.view._tokens == {}
    assert {k: n.free("cores") for k, n in crs.view.nodes.items()} == {"m/h1": 10.0}


def test_a_watch_thread_cannot_remove_a_placed_node_before_it_is_assumed(crs: Crs, monkeypatch) -> None:
    for h in ("h1", "h2"):
        _node(crs.view, h, "s", "r", h, cores=10)
    real_schedule, real_remove = crs_service.schedule, crs.view.remove
    removing = threading.Event()
    removed: list[str] = []

    def remove(manager: str, rid: str) -> None:
        removing.set()
        real_remove(manager, rid)
        removed.append(rid)
    monkeypatch.setattr(crs.view, "remove", remove)
    watch: list[threading.Thread] = []

    def racing(req, view, *a):  # type: ignore[no-untyped-def]
        p = real_schedule(req, view, *a)
        victim = sorted(p.demand)[-1].split("/", 1)[1]
        t = threading.Thread(target=view.remove, args=("m", victim))     # the watch thread, another thread
        watch.append(t)
        t.start()
        assert removing.wait(10)
        t.join(0.5)         # it would be done by now if nothing held it back until the placement is assumed
        return p
    monkeypatch.setattr(crs_service, "schedule", racing)
    req = PlacementRequest([GroupDemand("g", "vm", 2, {"cores": 6})], [Constraint("different_host", "g", "g", 0)])
    placement = crs._place(req, 0, "tok")       # no "left the capacity view": the removal waited its turn
    assert sorted(placement.demand) == ["m/h1", "m/h2"]
    watch[0].join(10)
    assert removed == ["h2"] and sorted(crs.view.nodes) == ["m/h1"]


# -- item 7: rack links named with their site ---------------------------------------------------------------------


def _loc(site: str, rack: str, host: str) -> common_pb2.Location:
    return common_pb2.Location(site=site, rack=rack, host=host)


def test_a_site_qualified_rack_link_applies_in_its_site_only() -> None:
    t = TopologyModel()
    t.add_link(common_pb2.Link(a="site-a/r1", b="site-a/r2", latency_ms=0.01, bandwidth_gbps=100))
    assert t.distance(_loc("site-a", "r1", "x"), _loc("site-a", "r2", "y")) == Distance(4, 0.01, 100.0)
    assert t.distance(_loc("site-a", "r2", "y"), _loc("site-a", "r1", "x")) == Distance(4, 0.01, 100.0)
    assert t.distance(_loc("site-b", "r1", "x"), _loc("site-b", "r2", "y")) == t.same_site
    # A bare one still applies to the racks of that name in every site; the site's own wins in its site.
    t.add_link(common_pb2.Link(a="r1", b="r2", latency_ms=0.1))
    assert t.distance(_loc("site-b", "r1", "x"), _loc("site-b", "r2", "y")) == Distance(4, 0.1, 10.0)
    assert t.distance(_loc("site-a", "r1", "x"), _loc("site-a", "r2", "y")) == Distance(4, 0.01, 100.0)
    for a, b in [("site-a/r1", "site-b/r2"), ("site-a/r1", "r2"), ("site-a/", "site-a/r2")]:
        with pytest.raises(ValueError):
            t.add_link(common_pb2.Link(a=a, b=b))


def _crs_with_links(tmp_path: Path, links: str) -> Crs:
    path = tmp_path / "topo.yaml"
    path.write_text(f"links:\n{links}")
    c = Crs(CrsConfig(state_dir=str(tmp_path), topology_file=str(path)))
    c.db.dispose()
    return c


def test_topology_file_site_rack_links_load_and_an_ambiguous_bare_rack_is_refused(tmp_path: Path) -> None:
    c = _crs_with_links(tmp_path, "  - {a: site-a/r1, b: site-a/r2, latency_ms: 0.01, bandwidth_gbps: 100}\n"
                                  "  - {a: r7, b: r8, latency_ms: 0.02}\n")
    assert c.topology.distance(_loc("site-a", "r1", "x"), _loc("site-a", "r2", "y")).latency_ms == 0.01
    assert c.topology.distance(_loc("site-b", "r1", "x"), _loc("site-b", "r2", "y")).latency_ms == 0.2
    assert c.topology.distance(_loc("site-b", "r7", "x"), _loc("site-b", "r8", "y")).latency_ms == 0.02
    with pytest.raises(ConfigError) as e:
        _crs_with_links(tmp_path, "  - {a: site-a/r1, b: site-a/r2, latency_ms: 0.01}\n"
                                  "  - {a: site-b/r1, b: site-b/r2, latency_ms: 0.03}\n"
                                  "  - {a: r3, b: r1, latency_ms: 0.05}\n")
    assert "links[2].b" in str(e.value) and "site-a/r1, site-b/r1" in str(e.value)
    with pytest.raises(ValueError, match=r"links\[0\]: .*racks of different sites"):
        _crs_with_links(tmp_path, "  - {a: site-a/r1, b: site-b/r2, latency_ms: 0.01}\n")


# -- items 1 and 8: the registry and GetReservation ---------------------------------------------------------------


def test_a_heartbeat_from_another_address_than_the_registered_one_is_unknown(crs: Crs) -> None:
    crs.registry.managers["m"] = crs_service.ManagerState("m", "127.0.0.1:9", ["vm"], 0.0)
    assert crs.Heartbeat(registry_pb2.HeartbeatRequest(name="m", address="127.0.0.1:9"), None).known
    assert crs.Heartbeat(registry_pb2.HeartbeatRequest(name="m"), None).known  # an older manager: by name
    assert not crs.Heartbeat(registry_pb2.HeartbeatRequest(name="m", address="127.0.0.1:10"), None).known


@pytest.mark.parametrize("address", ["::::", "host", "host:", ":50051", "h:99999", "h:0", "::1:50051"])
def test_a_manager_address_that_is_not_host_port_is_invalid(crs: Crs, address: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        crs.RegisterManager(registry_pb2.RegisterManagerRequest(name="m", address=address, resource_types=["vm"]),
                            None)
    assert [v.field for v in e.value.violations] == ["address"]
    assert "HOST:PORT" in e.value.message
    assert crs.registry.get("m") is None


@pytest.mark.parametrize("key", ["reservation_id", "request_id"])
def test_get_reservation_with_an_empty_id_is_invalid(crs: Crs, key: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        crs.GetReservation(irm_pb2.GetReservationRequest(tenant="t", **{key: ""}), None)
    assert [v.field for v in e.value.violations] == [key]
    assert "required" in e.value.message
