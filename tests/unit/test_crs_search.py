"""Placement's complete search and its verdicts: a feasible request is placed whatever the greedy's luck,
"never fits" only when proven, a down manager's resources mean "retry later", and constraints whose
filter is not enabled are refused (cross_resource_scheduler.placement)."""

from __future__ import annotations

import random

import pytest

from cross_resource_scheduler import placement
from cross_resource_scheduler.constraints import parse
from cross_resource_scheduler.placement import PlacementRequest, Unschedulable, schedule
from cross_resource_scheduler.plugins import GroupDemand, Pipeline
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView
from tests.unit.test_crs_placement import add, group

DEFAULT = Pipeline.from_names(["traits", "properties", "capacity", "affinity", "distance"],
                              {"pack": 1.0, "topology": 2.0}, 16)
# Two racks: only r2 holds both 8-core instances of b on different hosts, and a must be in b's rack.
HOSTS = [("big1", 8, "r1"), ("small1", 2, "r1"), ("big2", 8, "r2"), ("big3", 8, "r2"), ("small2a", 2, "r2"),
         ("small2b", 2, "r2")]
CORNER = PlacementRequest([GroupDemand("a", "vm", 2, {"cores": 2}), GroupDemand("b", "vm", 2, {"cores": 8})],
                          [parse("hops(a, b) <= 2"), parse("different_host(a, a)"), parse("different_host(b, b)")])


def _corner_view() -> CapacityView:
    view = CapacityView()
    for hid, cores, rack in HOSTS:
        add(view, hid, cores=cores, rack=rack, memory=64)
    return view


def test_a_feasible_request_greedy_can_corner_is_placed_for_every_seed() -> None:
    view = _corner_view()
    for seed in range(100):
        p = schedule(CORNER, view, DEFAULT, TopologyModel(), random.Random(seed))
        assert sorted(n.physical_id for n in p.nodes["b"]) == ["big2", "big3"]
        assert {n.location.rack for n in p.nodes["a"]} == {"r2"} and len({n.key for n in p.nodes["a"]}) == 2


def test_an_unproven_refusal_is_not_never_and_does_not_blame_use(monkeypatch) -> None:
    # With no search budget nothing is proven: a refusal on an empty cloud must neither say it can never
    # fit nor that capacity is in use (none is).
    monkeypatch.setattr(placement, "SEARCH_BUDGET", 0)
    view = _corner_view()
    refusals = []
    for seed in range(60):
        try:
            schedule(CORNER, view, DEFAULT, TopologyModel(), random.Random(seed))
        except Unschedulable as e:
            refusals.append(e)
    assert refusals, "the greedy tries alone should fail for some seed"
    for e in refusals:
        assert not e.unresolvable and e.down == []
        assert "capacity is in use" not in str(e) and "did not prove that none exists" in str(e)


def test_never_fits_is_said_with_the_reason_when_a_group_alone_cannot_fit() -> None:
    view = _corner_view()
    req = PlacementRequest([GroupDemand("b", "vm", 4, {"cores": 8})], [parse("different_host(b, b)")])
    with pytest.raises(Unschedulable) as info:
        schedule(req, view, DEFAULT, TopologyModel(), random.Random(1))
    assert info.value.unresolvable
    assert "; the request cannot fit even on an empty cloud (group 'b' needs 4 instances on different hosts; " \
           "the vm resources that could hold it have room for 3); change the request" in str(info.value)


def test_never_fits_is_proven_by_a_complete_search_of_the_empty_cloud() -> None:
    # Each group fits alone; together, b's two 8-core hosts are in r2 and a's in r1 only (traits).
    view = CapacityView()
    add(view, "a1", cores=8, rack="r1", traits=("a",))
    add(view, "a2", cores=8, rack="r1", traits=("a",))
    add(view, "b1", cores=8, rack="r2")
    add(view, "b2", cores=8, rack="r2")
    req = PlacementRequest([GroupDemand("a", "vm", 1, {"cores": 1}, {}, frozenset({"a"})),
                            GroupDemand("b", "vm", 2, {"cores": 8}, {}, frozenset(), frozenset({"a"}))],
                           [parse("hops(a, b) <= 2")])
    with pytest.raises(Unschedulable) as info:
        schedule(req, view, DEFAULT, TopologyModel(), random.Random(1))
    assert info.value.unresolvable
    assert "no combination of hosts meets every constraint" in str(info.value)


def test_capacity_in_use_is_said_only_when_what_is_free_was_searched_in_full() -> None:
    view = _corner_view()
    for hid in ("big2", "big3"):
        view.nodes[f"m/{hid}"].used["cores"] = 4
        view.nodes[f"m/{hid}"].refresh()
    with pytest.raises(Unschedulable) as info:
        schedule(CORNER, view, DEFAULT, TopologyModel(), random.Random(1))
    assert not info.value.unresolvable and "capacity is in use; retry later" in str(info.value)


def test_resources_of_a_down_manager_that_could_hold_it_mean_retry_later() -> None:
    view = CapacityView()
    add(view, "small", cores=8, manager="up")
    add(view, "ssd-big", cores=16, manager="gone", traits=("ssd",))
    view.set_down("gone", True)
    for g in (group("g", cores=12), group("g", cores=2, required=("ssd",))):
        with pytest.raises(Unschedulable) as info:
            schedule(PlacementRequest([g]), view, DEFAULT, TopologyModel(), random.Random(1))
        assert info.value.down == ["gone"] and not info.value.unresolvable
        assert "could fit on the resources of manager gone, which is down; retry later" in str(info.value)
    # What even the down manager's resources cannot hold never fits.
    with pytest.raises(Unschedulable) as info:
        schedule(PlacementRequest([group("g", cores=32)]), view, DEFAULT, TopologyModel(), random.Random(1))
    assert info.value.unresolvable and info.value.down == []


@pytest.mark.parametrize(("left_out", "constraint"), [("affinity", "different_host(w, w)"),
                                                      ("distance", "hops(w, x) <= 0")])
def test_a_constraint_whose_filter_is_not_enabled_is_refused_not_ignored(left_out, constraint) -> None:
    view = CapacityView()
    for h in ("h1", "h2", "h3"):
        add(view, h, cores=16)
    filters = [f for f in ("traits", "properties", "capacity", "affinity", "distance") if f != left_out]
    pipe = Pipeline.from_names(filters, {"pack": 1.0}, 16)
    req = PlacementRequest([group("w", count=2), group("x")], [parse(constraint)])
    with pytest.raises(Unschedulable) as info:
        schedule(req, view, pipe, TopologyModel(), random.Random(1))
    assert info.value.unresolvable
    assert f"need the {left_out!r} filter, which this CRS does not enable" in str(info.value)
    # Without such constraints the same pipeline places.
    schedule(PlacementRequest([group("w", count=2), group("x")]), view, pipe, TopologyModel(), random.Random(1))
