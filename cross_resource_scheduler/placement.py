"""Placement: a pure function of the request, the capacity view and a seeded RNG.

Groups are placed instance by instance, greedily: for each instance the
candidate pool is narrowed by the constraints (same host -> the peer's node;
a hop bound -> the peer's rack or site), scanned from a random offset until
`sample_size` candidates pass every filter, and the best-weighed one wins.
When none passes, the answer says which filter removed how many candidates,
and whether the request could fit at all on an empty cloud (Kubernetes'
Unschedulable vs UnschedulableAndUnresolvable).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from cross_resource_scheduler.constraints import Constraint
from cross_resource_scheduler.plugins import Context, GroupDemand, Pipeline
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView, Node


@dataclass
class PlacementRequest:
    groups: list[GroupDemand]
    constraints: list[Constraint] = field(default_factory=list)


@dataclass
class Placement:
    # group name -> one node per instance
    nodes: dict[str, list[Node]]
    # node key -> summed demand of this request on it
    demand: dict[str, dict[str, float]]


@dataclass
class Unschedulable(Exception):
    message: str
    # False: it might fit later (capacity in use); True: it can never fit as asked.
    unresolvable: bool = False
    removed_by: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


MAX_ORDERS = 4


def _order(req: PlacementRequest) -> list[GroupDemand]:
    """Most constrained groups first, then bigger ones, so tight fits are decided early."""
    weight = Counter()
    for c in req.constraints:
        weight[c.a] += 1
        weight[c.b] += 1
    return sorted(req.groups, key=lambda g: (-weight[g.name], -g.count * sum(g.demand.values())))


def _pool(view: CapacityView, ctx: Context) -> list[Node]:
    g, topo = ctx.group, ctx.topology
    # A link may make another rack or site faster than its level: latency bounds cannot narrow the pool by
    # level then (the distance filter still checks each candidate). Links never change hops.
    by_latency = not any(link.latency_ms for link in topo.links.values())
    pools: list[list[Node]] = []
    for c in ctx.constraints:
        peers = ctx.peers(c)
        if not peers:
            continue
        p = peers[0]
        if c.kind == "same_host":
            pools.append([n for n in {x.key: x for x in peers}.values() if n.resource_type == g.resource_type])
        elif (c.kind == "max_hops" and c.value < topo.same_site.hops) or (
                by_latency and c.kind == "max_latency_ms" and c.value < topo.same_site.latency_ms):
            pools.append(view.in_rack(g.resource_type, p.location.site, p.location.rack))
        elif (c.kind == "max_hops" and c.value < topo.cross_site.hops) or (
                by_latency and c.kind == "max_latency_ms" and c.value < topo.cross_site.latency_ms):
            pools.append(view.in_site(g.resource_type, p.location.site))
    return min(pools, key=len) if pools else view.of_type(g.resource_type)


def _place_instance(view: CapacityView, ctx: Context, pipeline: Pipeline, rng: random.Random,
                    removed: Counter) -> Node | None:
    pool = _pool(view, ctx)
    n = len(pool)
    if n == 0:
        return None
    start = rng.randrange(n)
    # Filters that cannot exclude anything for this group (no traits asked, no
    # constraints, ...) are skipped: placement runs them for every candidate.
    checks = [(f.checker(ctx), f.name) for f in pipeline.filters if f.relevant(ctx)]
    feasible: list[Node] = []
    sample = pipeline.sample_size
    for i in range(n):
        node = pool[(start + i) % n]
        for passes, name in checks:
            if not passes(node):
                removed[name] += 1
                break
        else:
            feasible.append(node)
            if len(feasible) >= sample:
                break
    if not feasible:
        return None
    # A weigher that scores every candidate alike cannot change the pick: skipped.
    scorers = []
    for w, m in pipeline.weighers:
        score = w.scorer(ctx)
        if callable(score):
            scorers.append((score, m))
    if not scorers or len(feasible) == 1:
        return feasible[0]
    best, best_score = feasible[0], float("-inf")
    for node in feasible:
        total = 0.0
        for score, m in scorers:
            total += m * score(node)
        if total > best_score:
            best, best_score = node, total
    return best


def _attempt(req: PlacementRequest, order: list[GroupDemand], view: CapacityView, pipeline: Pipeline,
             topology: TopologyModel, rng: random.Random, ignore_usage: bool
             ) -> tuple[Placement | None, str, Counter, int]:
    placed: dict[str, list[Node]] = {}
    tentative: dict[str, dict[str, float]] = {}
    for g in order:
        ctx = Context(g, [c for c in req.constraints if c.involves(g.name)], placed, tentative, topology,
                      ignore_usage)
        placed.setdefault(g.name, [])
        for i in range(g.count):
            removed: Counter = Counter()
            node = _place_instance(view, ctx, pipeline, rng, removed)
            if node is None:
                where = f"group {g.name!r}" + (f" instance {i + 1} of {g.count}" if g.count > 1 else "")
                return None, where, removed, len(_pool(view, ctx))
            placed[g.name].append(node)
            slot = tentative.setdefault(node.key, {})
            for k, v in g.demand.items():
                slot[k] = slot.get(k, 0.0) + v
    return Placement(placed, tentative), "", Counter(), 0


def schedule(req: PlacementRequest, view: CapacityView, pipeline: Pipeline, topology: TopologyModel,
             rng: random.Random) -> Placement:
    """Place every instance of every group, or raise Unschedulable saying why."""
    order = _order(req)
    # Greedy placement can paint itself into a corner when groups constrain
    # each other; with constraints, retry once with each group leading.
    orders = [order] + ([order[i:] + order[:i] for i in range(1, min(len(order), MAX_ORDERS))]
                        if req.constraints else [])
    with view.lock:
        first: tuple[str, Counter, int] | None = None
        for o in orders:
            placement, where, removed, pool = _attempt(req, o, view, pipeline, topology, rng, ignore_usage=False)
            if placement is not None:
                return placement
            first = first or (where, removed, pool)
        where, removed, pool = first  # type: ignore[misc]
        could = any(_attempt(req, o, view, pipeline, topology, random.Random(rng.random()), ignore_usage=True)[0]
                    for o in orders)
    types = sorted({g.resource_type for g in req.groups})
    if pool == 0:
        detail = f"no {'/'.join(types)} resources are available (no manager up provides them)"
    else:
        parts = ", ".join(f"{name} removed {count}" for name, count in removed.most_common())
        detail = f"none of {pool} candidates fits: {parts}"
    unresolvable = not could
    hint = ("it cannot fit even on an empty cloud; change the request" if unresolvable
            else "capacity is in use; retry later or ask for less")
    return_error = Unschedulable(f"{where}: {detail}; {hint}", unresolvable, dict(removed))
    raise return_error
