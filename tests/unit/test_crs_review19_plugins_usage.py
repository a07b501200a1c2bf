"""Review 19: a researcher's filter written against `node.used` (or `node.avail`, `node.free()`) made a busy cloud
answer NEVER_FITS ("cannot fit even on an empty cloud; change the request"): the never-fits proof judged the
nodes' capacity through Context.ignore_usage, which only Context.free honoured. Now the proof shows the plug-ins
the nodes as they are on an empty cloud (Node.empty(): nothing used or assumed), so a rule on usage passes
there, and the busy cloud is CAPACITY_IN_USE (retry later). And a plug-in whose constructor fails for a reason of
its own is not told that "a plug-in is made with no arguments"."""

from __future__ import annotations

import random

import pytest

from cross_resource_scheduler.constraints import parse
from cross_resource_scheduler.placement import PlacementRequest, Unschedulable, schedule
from cross_resource_scheduler.plugins import Context, Filter, GroupDemand, Pipeline, PipelineError, Weigher
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView, Node
from harness.v1 import common_pb2
from services.errors import CAPACITY_IN_USE, NEVER_FITS

EX = "tests.crs_plugin_examples"
FILTERS = ["traits", "properties", "capacity", "affinity", "distance"]


def busy_cloud(hosts: int = 3, used: float = 10, cores: float = 16, racks: int = 1) -> CapacityView:
    """`hosts` hosts of `cores` cores, `used` of them in use on each (10 of 16: past half), in `racks` racks."""
    view = CapacityView()
    for i in range(hosts):
        view.upsert("m", common_pb2.PhysicalResource(
            id=f"h{i}", resource_type="vm", capacity={"cores": cores, "memory_gb": 64},
            used={"cores": used, "memory_gb": 8}, properties={"frequency_ghz": 2.4},
            location=common_pb2.Location(site="s", rack=f"r{i % racks}", host=f"h{i}"), generation=1))
    return view


def refusal(view: CapacityView, pipe: Pipeline, count: int = 1, cores: float = 1,
            constraints: tuple[str, ...] = ()) -> Unschedulable:
    req = PlacementRequest([GroupDemand("g", "vm", count, {"cores": cores, "memory_gb": 1})],
                           [parse(c) for c in constraints])
    with pytest.raises(Unschedulable) as caught:
        schedule(req, view, pipe, TopologyModel(), random.Random(0))
    return caught.value


@pytest.mark.parametrize("plugin", ["LowLoad", "LowLoadAvail"])
def test_a_filter_on_usage_makes_a_busy_cloud_in_use_not_never_fits(plugin: str) -> None:
    pipe = Pipeline.from_names([*FILTERS, f"{EX}:{plugin}"], {"pack": 1.0})
    e = refusal(busy_cloud(), pipe)
    assert (e.reason, e.unresolvable) == (CAPACITY_IN_USE, False), str(e)
    assert "capacity is in use; retry later" in str(e) and "empty cloud" not in str(e)


def test_a_filter_on_avail_makes_a_cloud_busy_with_assumed_demand_in_use_not_never_fits() -> None:
    # What is assumed (placed by the CRS, its commit not yet reported) counts in avail: 4 cores used, 6 assumed.
    pipe = Pipeline.from_names([*FILTERS, f"{EX}:LowLoadAvail"], {"pack": 1.0})
    view = busy_cloud(used=4)
    for node in list(view.nodes.values()):
        view.assume("t1", node, {"cores": 6})
    e = refusal(view, pipe)
    assert (e.reason, e.unresolvable) == (CAPACITY_IN_USE, False), str(e)


def test_the_complete_search_of_the_empty_cloud_shows_the_nodes_empty_too() -> None:
    # Three instances on different hosts: each group fits alone, so the proof is the search's, over its candidates.
    pipe = Pipeline.from_names([*FILTERS, f"{EX}:LowLoad"], {"pack": 1.0, f"{EX}:IdleFirst": 1.0})
    e = refusal(busy_cloud(), pipe, count=3, constraints=("different_host(g, g)",))
    assert (e.reason, e.unresolvable) == (CAPACITY_IN_USE, False), str(e)


def test_what_never_fits_is_still_never_fits_with_a_filter_on_usage() -> None:
    pipe = Pipeline.from_names([*FILTERS, f"{EX}:LowLoad"], {"pack": 1.0})
    e = refusal(busy_cloud(), pipe, cores=17)  # more than a host has
    assert (e.reason, e.unresolvable) == (NEVER_FITS, True)
    e = refusal(busy_cloud(), pipe, count=4, constraints=("different_host(g, g)",))  # more hosts than there are
    assert (e.reason, e.unresolvable) == (NEVER_FITS, True)


class Recording(Filter):
    """Passes every node; records what each call saw."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[tuple[bool, Node, float]] = []

    def host_passes(self, node: Node, ctx: Context) -> bool:
        self.seen.append((ctx.ignore_usage, node, ctx.free(node, "cores")))
        return node.used.get("cores", 0.0) <= 8  # LowLoad's rule


class RecordingWeigher(Weigher):
    name = "recording_weigher"

    def __init__(self) -> None:
        self.seen: list[Node] = []

    def weigh(self, node: Node, ctx: Context) -> float:
        if ctx.ignore_usage:
            self.seen.append(node)
        return 0.5


def test_plugins_see_every_node_of_the_proof_empty_and_the_view_is_left_as_it_was() -> None:
    view = busy_cloud(racks=3)  # three classes of nodes: the search weighs its candidates
    before = {k: (dict(n.used), dict(n.avail), dict(n.assumed)) for k, n in view.nodes.items()}
    f, w = Recording(), RecordingWeigher()
    base = Pipeline.from_names(FILTERS, {"pack": 1.0})
    pipe = Pipeline([*base.filters, f], [*base.weighers, (w, 1.0)], 32)
    e = refusal(view, pipe, count=3, constraints=("different_host(g, g)",))
    assert e.reason == CAPACITY_IN_USE, str(e)
    proof = [(node, free) for empty, node, free in f.seen if empty]
    assert proof and w.seen
    for node in [n for n, _ in proof] + w.seen:
        assert (node.used, node.assumed) == ({}, {})
        assert node.avail == node.capacity and node.free("cores") == node.capacity["cores"]
        real = view.nodes[node.key]
        assert node is not real and node.key == real.key and node.location == real.location
    assert all(free <= 16 for _, free in proof) and any(free == 16 for _, free in proof)
    # Outside the proof the nodes are the view's own.
    assert all(node is view.nodes[node.key] for empty, node, _ in f.seen if not empty)
    assert {k: (dict(n.used), dict(n.avail), dict(n.assumed)) for k, n in view.nodes.items()} == before


def test_node_empty_is_made_once_until_the_node_changes() -> None:
    view = busy_cloud(hosts=1)
    node = view.nodes["m/h0"]
    twin = node.empty()
    assert twin is node.empty() and twin.empty() is twin
    assert (twin.used, twin.assumed, twin.avail) == ({}, {}, {"cores": 16, "memory_gb": 64})
    assert (node.used["cores"], node.avail["cores"]) == (10, 6)  # the node itself is untouched
    view.assume("t1", node, {"cores": 2})
    assert node.empty() is not twin and node.empty().avail["cores"] == 16
    view.upsert("m", common_pb2.PhysicalResource(
        id="h0", resource_type="vm", capacity={"cores": 32, "memory_gb": 64}, used={"cores": 1},
        location=common_pb2.Location(site="s", rack="r0", host="h0"), generation=2))
    assert view.nodes["m/h0"] is node
    assert node.empty().capacity == node.empty().avail == {"cores": 32, "memory_gb": 64}


# -- a constructor failing for a reason of its own -----------------------------------------------------------

@pytest.mark.parametrize(("plugin", "kind", "raised"), [
    ("ExitsWhenMade", "filter", "SystemExit: 4"),
    ("BrokenWhenMade", "weigher", "RuntimeError: the weights table is missing"),
    ("TypeErrorWhenMade", "filter", "TypeError: int() argument must be"),
])
def test_a_constructor_failing_for_its_own_reason_is_not_said_to_want_arguments(plugin, kind, raised) -> None:
    filters, weighers = ([*FILTERS, f"{EX}:{plugin}"], {"pack": 1.0}) if kind == "filter" else (
        FILTERS, {f"{EX}:{plugin}": 1.0})
    with pytest.raises(PipelineError) as caught:
        Pipeline.from_names(filters, weighers)
    said = str(caught.value)
    assert said.startswith(f"{kind} '{EX}:{plugin}': {plugin}() raised {raised}"), said
    assert "no arguments" not in said
    assert said.endswith(f"; fix it, or drop it from the CRS's `{kind}s` setting"), said


def test_a_constructor_wanting_arguments_is_still_told_so() -> None:
    with pytest.raises(PipelineError) as caught:
        Pipeline.from_names(FILTERS, {f"{EX}:NeedsArguments": 1.0})
    assert str(caught.value).startswith(f"weigher '{EX}:NeedsArguments': NeedsArguments() raised TypeError: ")
    assert str(caught.value).endswith("(a plug-in is made with no arguments)")
