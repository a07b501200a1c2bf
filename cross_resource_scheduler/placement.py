"""Placement: a pure function of the request, the capacity view and a seeded RNG.

Groups are placed instance by instance, greedily: for each instance the
candidate pool is narrowed by the constraints (same host -> the peer's node;
a hop bound -> the peer's rack or site), scanned from a random offset until
`sample_size` candidates pass every filter, and the best-weighed one wins.

Greedy placement can paint itself into a corner when groups constrain each
other (the first instances take the only rack the others could share). When
the greedy tries fail, a complete depth-first search with backtracking runs
over nodes grouped into interchangeable classes (one node of each class is
tried), within a budget of work. A refusal says which filter
removed how many candidates, and whether the request could ever fit
(Kubernetes' Unschedulable vs UnschedulableAndUnresolvable): "never" only
when that is proven (a group alone cannot fit the empty cloud, or a complete
search of the empty cloud found nothing); a request that would fit on the
resources of a manager that is down is told to come back.

A pinned group (GroupDemand.pins: what a CRS above this one sends, having placed the request on the resources
this one offers it) has one candidate per instance, its own resource: the filters still judge it, and the other
groups are placed around it. A resource a CRS below refused a group on (GroupDemand.avoid) is removed for that
group by a filter of its own, "refused_below", which no configuration names.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from cross_resource_scheduler.constraints import Constraint
from cross_resource_scheduler.plugins import Context, Filter, GroupDemand, Pipeline, location_of
from cross_resource_scheduler.stacking import refused_metadata
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView, Node
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_DOWN,
    NEVER_FITS,
    PIN_REFUSED,
    PIN_UNKNOWN,
    SEARCH_GAVE_UP,
)


@dataclass
class PlacementRequest:
    groups: list[GroupDemand]
    constraints: list[Constraint] = field(default_factory=list)
    # What the placement's RNG starts from (the CRS derives it from the request's content): the same request on
    # the same view places alike, so that a quote prices the hosts a Reserve then takes.
    seed: int = 0


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
    # Managers that are down and whose resources it could fit: it may fit once they are back.
    down: list[str] = field(default_factory=list)
    # Which of the refusals it is, as a client branches on it (services.errors: NEVER_FITS, MANAGER_DOWN,
    # CAPACITY_IN_USE, SEARCH_GAVE_UP); empty: said by the fields above.
    reason: str = ""
    # The ErrorInfo metadata that goes with the reason (PIN_REFUSED's: stacking.refused_metadata).
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.reason:
            self.reason = MANAGER_DOWN if self.down else NEVER_FITS if self.unresolvable else SEARCH_GAVE_UP

    def __str__(self) -> str:
        return self.message


MAX_ORDERS = 4
# Work one complete search may do ("does it fit now?", "does it fit an empty cloud?"), in candidate checks
# (a step costs LEVEL_COST more, a weighed candidate one more per instance placed). It runs only after the
# greedy tries failed; the bound keeps what a refusal costs to tens of milliseconds on any cloud.
SEARCH_BUDGET = 20000
LEVEL_COST = 20
IN_USE = "capacity is in use; retry later or ask for less"
NOT_FOUND = ("no placement meeting the constraints was found in what is free now (the search is bounded and "
             "did not prove that none exists); retry later, or loosen the constraints or ask for less")


class _RefusedBelow(Filter):
    """The resources a CRS below refused the group on (GroupDemand.avoid; stacking.py): always on, for the groups
    that have some."""

    name = "refused_below"

    def relevant(self, ctx: Context) -> bool:
        return bool(ctx.group.avoid)

    def checker(self, ctx: Context):  # noqa: ANN201
        avoid = ctx.group.avoid
        return lambda node: node.key not in avoid


_REFUSED_BELOW = _RefusedBelow()


def filters_for(pipeline: Pipeline, ctx: Context) -> list[Filter]:
    """The filters that judge ctx's group: the pipeline's that can remove something for it, and refused_below."""
    found = [f for f in pipeline.filters if f.relevant(ctx)]
    return [*found, _REFUSED_BELOW] if ctx.group.avoid else found


def _order(req: PlacementRequest) -> list[GroupDemand]:
    """Pinned groups first (their places are given: the others are placed around them), then the most
    constrained, then bigger ones, so tight fits are decided early."""
    weight = Counter()
    for c in req.constraints:
        weight[c.a] += 1
        weight[c.b] += 1
    return sorted(req.groups, key=lambda g: (not g.pins, -weight[g.name], -g.count * sum(g.demand.values())))


def _pool(view: CapacityView, ctx: Context) -> list[Node]:
    g, topo = ctx.group, ctx.topology
    if g.pins:          # the next instance's own resource (schedule checked that each is known and up)
        node = view.nodes.get(g.pins[len(ctx.placed[g.name])])
        if node is None or view.node_down(node):
            return []
        return [node.empty() if ctx.ignore_usage else node]     # judged empty: as the plug-ins are to see it
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
    checks = [(f.checker(ctx), f.name) for f in filters_for(pipeline, ctx)]
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
    located: dict[str, Counter] = {}
    for g in order:
        ctx = Context(g, [c for c in req.constraints if c.involves(g.name)], placed, tentative, topology,
                      ignore_usage, located)
        placed.setdefault(g.name, [])
        here = located.setdefault(g.name, Counter())
        for i in range(g.count):
            removed: Counter = Counter()
            node = _place_instance(view, ctx, pipeline, rng, removed)
            if node is None:
                where = f"group {g.name!r}" + (f" instance {i + 1} of {g.count}" if g.count > 1 else "")
                return None, where, removed, len(_pool(view, ctx))
            placed[g.name].append(node)
            here[location_of(node)] += 1
            slot = tentative.setdefault(node.key, {})
            for k, v in g.demand.items():
                slot[k] = slot.get(k, 0.0) + v
    return Placement(placed, tentative), "", Counter(), 0


# -- complete search ------------------------------------------------------------

class _Classes:
    """Nodes grouped into classes of interchangeable ones, per resource type.

    Two nodes with the same type, site, rack, capacity, free capacity (unless judged empty), properties
    and traits look alike to every filter and weigher: swapping them maps a placement to another. The
    search tries, of each class, only the first node the request does not use yet, which keeps it
    complete (it misses no placement) yet small on a large cloud of few kinds of hosts.

    Judged empty (`ignore_usage`), the nodes the plug-ins see are `shown(node)`: the node on an empty
    cloud (Node.empty()), made only for the few nodes the search looks at, so that a plug-in reading usage
    any way judges the empty cloud (and a class's members, alike but for usage, look alike to it).
    """

    def __init__(self, nodes: list[Node], ignore_usage: bool, pinned: frozenset[str] = frozenset(),
                 avoided: dict[str, tuple[str, ...]] | None = None, distinct: bool = False) -> None:
        self.empty = ignore_usage
        by_key: dict[tuple, list[Node]] = {}
        seen: dict[tuple[str, str], tuple] = {}
        shared: list[Node] = []
        for n in nodes:
            loc = n.location
            site, host = loc.site, loc.host
            # (Unsorted items: the same dict in another order only splits a class, which stays sound.)
            key = (n.resource_type, site, loc.rack, tuple(n.capacity.items()),
                   () if ignore_usage else tuple(n.avail.items()), tuple(n.properties.items()), n.traits)
            if distinct:
                # A plug-in may tell apart what the built-ins find alike (a node's id, its host): each node is a
                # class of its own, or the count of room and the search would judge a refused node by an
                # accepted one.
                key += (n.key,)
            elif n.key in pinned:
                # A resource a group is pinned to is like no other: the free groups must be able to try it and
                # its look-alikes apart (a class tries only its first member the request does not use).
                key += (n.key,)
            elif avoided and n.key in avoided:
                key += (avoided[n.key],)
            if host:
                if (site, host) in seen:
                    shared.append(n)
                    continue
                seen[(site, host)] = key
            by_key.setdefault(key, []).append(n)
        if shared:
            # Distances compare host names: nodes sharing one (two managers' "h1") are never interchangeable.
            clash = {(n.location.site, n.location.host) for n in shared}
            for members in by_key.values():
                members[:] = [n for n in members if (n.location.site, n.location.host) not in clash]
            for n in nodes:
                if (n.location.site, n.location.host) in clash:
                    by_key[seen[(n.location.site, n.location.host)] + (n.key,)] = [n]
            by_key = {k: v for k, v in by_key.items() if v}
        self.nodes = {n.key: n for n in nodes}      # a pinned instance's resource, by key
        # Every node's rank: a class's members are consecutive (see _candidates).
        self.rank: dict[str, int] = {}
        self.by_type: dict[str, list[list[Node]]] = defaultdict(list)
        self.by_site: dict[tuple[str, str], list[list[Node]]] = defaultdict(list)
        self.by_rack: dict[tuple[str, str, str], list[list[Node]]] = defaultdict(list)
        for key, members in by_key.items():
            for n in members:
                self.rank[n.key] = len(self.rank)
            self.by_type[key[0]].append(members)
            self.by_site[key[:2]].append(members)
            self.by_rack[key[:3]].append(members)

    def shown(self, node: Node) -> Node:
        """`node` as the filters and weighers are to see it: on an empty cloud when judged empty."""
        return node.empty() if self.empty else node

    def narrowed(self, ctx: Context) -> list[list[Node]]:
        """The classes a hop or latency bound leaves the group, as _pool narrows the greedy's candidates."""
        g, topo = ctx.group, ctx.topology
        by_latency = not any(link.latency_ms for link in topo.links.values())
        best = self.by_type.get(g.resource_type, [])
        for c in ctx.constraints:
            peers = ctx.peers(c)
            if not peers:
                continue
            p = peers[0].location
            if (c.kind == "max_hops" and c.value < topo.same_site.hops) or (
                    by_latency and c.kind == "max_latency_ms" and c.value < topo.same_site.latency_ms):
                pool = self.by_rack.get((g.resource_type, p.site, p.rack), [])
            elif (c.kind == "max_hops" and c.value < topo.cross_site.hops) or (
                    by_latency and c.kind == "max_latency_ms" and c.value < topo.cross_site.latency_ms):
                pool = self.by_site.get((g.resource_type, p.site), [])
            else:
                continue
            if len(pool) < len(best):
                best = pool
        return best


def _candidates(ctx: Context, classes: _Classes, on: dict[str, tuple[Node, int]], pipeline: Pipeline
                ) -> tuple[list[Node], int]:
    """The nodes the next instance of ctx's group may take, best-weighed first, and the work it took.

    Candidates are the nodes the request already uses and, of each class, the first node it does not.
    A group's instances are interchangeable too, so each takes a node ranked no lower than the one its
    previous instance took: a set of nodes is tried in one order only.
    """
    g = ctx.group
    rank = classes.rank
    mine = ctx.placed[g.name]
    if g.pins:          # its own resource, or none (not among these nodes): pinned instances are not alike
        key = g.pins[len(mine)]
        pool = [on[key][0]] if key in on else [classes.shown(classes.nodes[key])] if key in classes.nodes else []
    else:
        floor = rank[mine[-1].key] if mine else -1
        pool = [n for n, _ in on.values() if n.resource_type == g.resource_type and rank[n.key] >= floor]
    if not g.pins and not any(c.kind == "same_host" and ctx.peers(c) for c in ctx.constraints):
        # (else only `on` can do)
        for members in classes.narrowed(ctx):
            if rank[members[-1].key] < floor:
                continue
            for n in members:
                if n.key not in on and rank[n.key] >= floor:
                    pool.append(classes.shown(n))
                    break
    checks = [f.checker(ctx) for f in filters_for(pipeline, ctx)]
    feasible = [n for n in pool if all(ok(n) for ok in checks)]
    work = LEVEL_COST + len(pool)
    scorers = [(s, m) for s, m in ((w.scorer(ctx), m) for w, m in pipeline.weighers) if callable(s)]
    if scorers and len(feasible) > 1:
        # Best first, as greedy would pick: the first complete placement found is a good one.
        feasible.sort(key=lambda n: -sum(m * s(n) for s, m in scorers))
        # A weigher may compare a candidate with every location placed on so far (topology does).
        peers = ctx.where.values() if ctx.where is not None else ctx.placed.values()
        work += len(feasible) * (1 + sum(len(v) for v in peers))
    return feasible, work


def _search(req: PlacementRequest, order: list[GroupDemand], classes: _Classes, pipeline: Pipeline,
            topology: TopologyModel, ignore_usage: bool) -> tuple[Placement | None, bool]:
    """Depth-first over every instance, backtracking when one has no candidate left.

    Returns the first complete placement, or None and whether the search was complete: None after a
    complete search proves that no placement exists on these nodes; after SEARCH_BUDGET's worth of work
    it only says none was found.
    """
    budget = SEARCH_BUDGET
    steps = [g for g in order for _ in range(g.count)]
    placed: dict[str, list[Node]] = {g.name: [] for g in order}
    tentative: dict[str, dict[str, float]] = {}
    on: dict[str, tuple[Node, int]] = {}  # node key -> (node, instances of this request on it)
    located: dict[str, Counter] = {g.name: Counter() for g in order}
    ctxs = {g.name: Context(g, [c for c in req.constraints if c.involves(g.name)], placed, tentative, topology,
                            ignore_usage, located) for g in order}
    levels: list[Iterator[Node]] = []
    depth = 0
    while depth < len(steps):
        g = steps[depth]
        if len(levels) == depth:
            feasible, work = _candidates(ctxs[g.name], classes, on, pipeline)
            budget -= work
            if budget < 0:
                return None, False
            levels.append(iter(feasible))
        else:
            _take_back(g, placed, tentative, on, located)  # this level's previous choice led nowhere
        node = next(levels[depth], None)
        if node is None:
            levels.pop()
            if depth == 0:
                return None, True
            depth -= 1
            continue
        _put(g, node, placed, tentative, on, located)
        depth += 1
    demand: dict[str, dict[str, float]] = {}
    for g in order:  # summed afresh: no rounding left over from the choices taken back
        for n in placed[g.name]:
            slot = demand.setdefault(n.key, {})
            for k, v in g.demand.items():
                slot[k] = slot.get(k, 0.0) + v
    return Placement(placed, demand), True


def _put(g: GroupDemand, node: Node, placed: dict[str, list[Node]], tentative: dict[str, dict[str, float]],
         on: dict[str, tuple[Node, int]], located: dict[str, Counter]) -> None:
    placed[g.name].append(node)
    located[g.name][location_of(node)] += 1
    slot = tentative.setdefault(node.key, {})
    for k, v in g.demand.items():
        slot[k] = slot.get(k, 0.0) + v
    on[node.key] = (node, on.get(node.key, (node, 0))[1] + 1)


def _take_back(g: GroupDemand, placed: dict[str, list[Node]], tentative: dict[str, dict[str, float]],
               on: dict[str, tuple[Node, int]], located: dict[str, Counter]) -> None:
    node = placed[g.name].pop()
    here, at = located[g.name], location_of(node)
    here[at] -= 1
    if not here[at]:
        del here[at]  # the count is of distinct locations: none left here
    count = on[node.key][1] - 1
    if count == 0:
        # Untouched again: the node is its class's equal once more (its key leaves `tentative`).
        del on[node.key], tentative[node.key]
        return
    on[node.key] = (node, count)
    slot = tentative[node.key]
    for k, v in g.demand.items():
        slot[k] -= v


# -- proofs that a request never fits -------------------------------------------

def _instances_fit(node: Node, g: GroupDemand, ignore_usage: bool) -> int:
    """How many instances of g a node holds, empty or as it is now (the capacity filter's arithmetic)."""
    most = g.count
    room = node.capacity if ignore_usage else node.avail
    for k, v in g.demand.items():
        if v > 0:
            most = min(most, int((room.get(k, 0.0) + 1e-9) // v))
    return max(most, 0)


def _group_never_fits(req: PlacementRequest, classes: _Classes, pipeline: Pipeline, topology: TopologyModel,
                      ignore_usage: bool) -> str | None:
    """Why some group cannot fit the classes' nodes (empty, or as they are now), judged by itself alone;
    None if each group could.

    Sound (it never refuses what fits): a group needs `count` instances on nodes that pass every filter
    on their own, each node holding as many as its capacity allows -- one if the group's instances must be
    on different hosts, and all of them on one node if they must share a host. A class's nodes are alike:
    one of each is judged.
    """
    for g in req.groups:
        ctx = Context(g, [c for c in req.constraints if c.involves(g.name)], {}, {}, topology, ignore_usage)
        checks = [f.checker(ctx) for f in filters_for(pipeline, ctx)]
        if g.pins:
            refused = _pins_never_fit(g, ctx, checks, classes, pipeline, ignore_usage)
            if refused is not None:
                return refused[1]
            continue
        shown = [(classes.shown(members[0]), len(members)) for members in classes.by_type.get(g.resource_type, [])]
        fits = [(_instances_fit(node, g, ignore_usage), n) for node, n in shown if all(ok(node) for ok in checks)]
        own = {c.kind for c in ctx.constraints if c.a == c.b == g.name}
        if "same_host" in own:
            room, how = max((f for f, _ in fits), default=0), "on one host"
        elif "different_host" in own:
            room, how = sum(n for f, n in fits if f > 0), "on different hosts"
        else:
            room, how = sum(f * n for f, n in fits), ""
        if room < g.count:
            return (f"group {g.name!r} needs {g.count} instance{'s' if g.count > 1 else ''}"
                    f"{' ' + how if how else ''}; the {g.resource_type} resources that could hold it have room "
                    f"for {room}")
    return None


def _pins_never_fit(g: GroupDemand, ctx: Context, checks: list, classes: _Classes, pipeline: Pipeline,
                    ignore_usage: bool) -> tuple[str, str] | None:
    """The resource a pinned group cannot sit on (among the classes' nodes), judged by itself alone, and why;
    None if it could. Exact: each resource must pass every filter and hold the instances pinned to it."""
    for key, n in Counter(g.pins).items():
        node = classes.nodes.get(key)
        if node is None:
            return key, f"group {g.name!r} is pinned to {key}, which is not among the resources judged"
        shown = classes.shown(node)
        failed = next((f.name for f, ok in zip(filters_for(pipeline, ctx), checks, strict=True) if not ok(shown)),
                      None)
        if failed is not None:
            return key, f"group {g.name!r} is pinned to {key}, which the {failed!r} filter refuses for it"
        room = _instances_fit(shown, replace(g, count=n), ignore_usage)
        if room < n:
            return key, (f"group {g.name!r} has {n} instance{'s' if n > 1 else ''} pinned to {key}, which has room "
                         f"for {room}")
    return None


def _refused_pin(req: PlacementRequest, view: CapacityView, pipeline: Pipeline, topology: TopologyModel
                 ) -> Unschedulable | None:
    """PIN_REFUSED, if a pinned group cannot sit on one of its resources even on an empty cloud (judged alone):
    naming, besides, the resources of its type that would refuse it too, for a CRS above to place it clear of
    them (stacking.refused_metadata). None if each pinned resource could take its instances."""
    for g in req.groups:
        if not g.pins:
            continue
        ctx = Context(g, [c for c in req.constraints if c.involves(g.name)], {}, {}, topology, ignore_usage=True)
        checks = [f.checker(ctx) for f in filters_for(pipeline, ctx)]
        pinned = _Classes([view.nodes[k] for k in dict.fromkeys(g.pins)], True, frozenset(g.pins))
        found = _pins_never_fit(g, ctx, checks, pinned, pipeline, ignore_usage=True)
        if found is None:
            continue
        key, why = found
        of_type = view.all_of_type(g.resource_type)     # a down manager's too (see Crs._clear_of)
        one = replace(g, count=1)
        refused = [n.key for n in of_type
                   if not all(ok(n.empty()) for ok in checks) or _instances_fit(n, one, ignore_usage=True) < 1]
        return Unschedulable(f"{why}; it never fits there: pin it elsewhere", True, {}, [], PIN_REFUSED,
                             refused_metadata(g.name, key, refused, [n.key for n in of_type]))
    return None


def _pinned_keys(req: PlacementRequest) -> frozenset[str]:
    return frozenset(key for g in req.groups for key in g.pins)


def _avoided(req: PlacementRequest) -> dict[str, tuple[str, ...]]:
    """Per resource a CRS below refused a group on, the groups that avoid it: the complete search must tell it from
    its look-alikes (a class tries only its first member), but those that the same groups avoid stay alike."""
    out: dict[str, list[str]] = defaultdict(list)
    for g in req.groups:
        for key in g.avoid:
            out[key].append(g.name)
    return {key: tuple(names) for key, names in out.items()}


def _check_pins(req: PlacementRequest, view: CapacityView) -> None:
    """Each pinned instance's resource is known, of its group's type, and its manager up: else Unschedulable,
    saying which (a pin is a CRS above's choice, from what this CRS offered it)."""
    for g in req.groups:
        for key in dict.fromkeys(g.pins):
            node = view.nodes.get(key)
            if node is None:
                raise Unschedulable(f"group {g.name!r} is pinned to {key!r}, which this CRS does not know (now): "
                                    "DiscoverResources lists its resources as manager/id; place again",
                                    reason=PIN_UNKNOWN)
            if node.resource_type != g.resource_type:
                raise Unschedulable(f"group {g.name!r} is pinned to {key!r}, a {node.resource_type} resource, not "
                                    f"a {g.resource_type}; pin it to one of its type", unresolvable=True)
            if view.node_down(node):
                down = view.down_name(node)
                raise Unschedulable(f"group {g.name!r} is pinned to {key!r}, whose manager {down!r} is "
                                    "down; retry later, or place it elsewhere", down=[down])


def as_pinned(req: PlacementRequest, view: CapacityView, pipeline: Pipeline, topology: TopologyModel) -> Placement:
    """A request whose every group is pinned, where it is pinned, whatever is in use there (a price is asked so,
    as an IRM prices a pinned host); Unschedulable if a pin is unknown, of another type or on a manager down, or
    never takes its group (PIN_REFUSED, as Reserve would refuse it)."""
    with view.lock:
        _check_pins(req, view)
        refused = _refused_pin(req, view, pipeline, topology)
        if refused is not None:
            raise refused
        return Placement({g.name: [view.nodes[k] for k in g.pins] for g in req.groups}, {})


def _fits_empty(req: PlacementRequest, order: list[GroupDemand], nodes: list[Node], pipeline: Pipeline,
                topology: TopologyModel) -> tuple[bool | None, str, Placement | None]:
    """Whether the request fits these nodes when they are empty: True (with a placement), False (with the
    reason; proven), or None (not known: the search ran out of budget)."""
    classes = _Classes(nodes, ignore_usage=True, pinned=_pinned_keys(req), avoided=_avoided(req),
                       distinct=pipeline.has_plugin_filters)
    reason = _group_never_fits(req, classes, pipeline, topology, ignore_usage=True)
    if reason is not None:
        return False, reason, None
    found, complete = _search(req, order, classes, pipeline, topology, ignore_usage=True)
    if found is not None:
        return True, "", found
    return (False, "no combination of hosts meets every constraint", None) if complete else (None, "", None)


def _verdict(req: PlacementRequest, order: list[GroupDemand], view: CapacityView, pipeline: Pipeline,
             topology: TopologyModel, searched_now: bool) -> tuple[str, bool, list[str]]:
    """For a request no placement was found for now: (hint, unresolvable, down managers that could hold it)."""
    types = {g.resource_type for g in req.groups}
    mine = [n for n in view.nodes.values() if n.resource_type in types]
    missing = sorted(t for t in types if not any(n.resource_type == t for n in mine))
    if missing:
        # Nothing of the type is known, up or down: its managers have not reported capacity yet (this CRS or they
        # just started, a watch reconnecting). "Never fits" would be read as the request's fault, for good.
        return (f"no {'/'.join(missing)} resources are known to this CRS yet (their managers have not reported "
                "capacity: starting or reconnecting); retry later"), False, []
    up = [n for n in mine if not view.node_down(n)]
    fits, reason, _ = _fits_empty(req, order, up, pipeline, topology)
    if fits:
        # Only a complete search of what is free now shows that it is the use that stands in the way.
        return (IN_USE if searched_now else NOT_FOUND), False, []
    down = [n for n in mine if view.node_down(n)]
    if down:
        with_down, _, found = _fits_empty(req, order, up + down, pipeline, topology)
        # Down managers are named when their resources are shown to hold it (or nothing up ever could); a search
        # that gave up shows nothing: "retry later" then, but not blaming them.
        if with_down is True or (with_down is None and fits is False):
            names = sorted({view.down_name(n) for nodes in found.nodes.values() for n in nodes if view.node_down(n)}
                           if found else {view.down_name(n) for n in down})
            return (f"it could fit on the resources of {'managers' if len(names) > 1 else 'manager'} "
                    f"{', '.join(names)}, which {'are' if len(names) > 1 else 'is'} down; retry later"), False, names
    if fits is False:
        # "The request": the reason may name another group than the one whose instance found no candidate.
        return f"the request cannot fit even on an empty cloud ({reason}); change the request", True, []
    return NOT_FOUND, False, []


def _needs_missing_filter(req: PlacementRequest, pipeline: Pipeline) -> str | None:
    missing = pipeline.missing_filters(req.constraints)
    if not missing:
        return None
    said = "; ".join(f"{kind} constraints need the {name!r} filter" for name, kind in sorted(missing.items()))
    return (f"{said}, which this CRS does not enable (its `filters` setting); drop those constraints, or ask "
            "the operator to enable the filter")


def schedule(req: PlacementRequest, view: CapacityView, pipeline: Pipeline, topology: TopologyModel,
             rng: random.Random) -> Placement:
    """Place every instance of every group, or raise Unschedulable saying why."""
    missing = _needs_missing_filter(req, pipeline)
    if missing is not None:
        # Placing without the filter would silently break the tenant's constraints.
        raise Unschedulable(missing, unresolvable=True)
    order = _order(req)
    with view.lock:
        _check_pins(req, view)
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
        if all(g.pins for g in req.groups):
            # Every instance's place is given: no search, the verdict is exact -- it fits the empty resources
            # (then it is their use that stands in the way) or it never does.
            fits, *_ = _attempt(req, order, view, pipeline, topology, rng, ignore_usage=True)
            never = fits is None
            said = ", ".join(f"{n} removed {c}" for n, c in removed.most_common())
            if not never:
                raise Unschedulable(f"{where}: the resource it is pinned to does not take it now ({said}); "
                                    f"{IN_USE}", False, dict(removed), [], CAPACITY_IN_USE)
            # A resource that never takes its group: a CRS above, which pinned it there, places it elsewhere.
            refused = _refused_pin(req, view, pipeline, topology)
            if refused is not None:
                refused.message = f"{where}: {refused.message}"
                refused.removed_by = dict(removed)
                raise refused
            pinned = _Classes([view.nodes[k] for k in _pinned_keys(req)], True, _pinned_keys(req))
            why = _group_never_fits(req, pinned, pipeline, topology, ignore_usage=True) or (
                "together they need more than the resources they are pinned to have, or the constraints are not met "
                "there")
            raise Unschedulable(f"{where}: the resource it is pinned to does not take it ({said}); it cannot fit "
                                f"even on an empty cloud ({why}); change the request", True, dict(removed), [],
                                NEVER_FITS)
        types = {g.resource_type for g in req.groups}
        up = [n for n in view.nodes.values() if n.resource_type in types and not view.node_down(n)]
        now = _Classes(up, ignore_usage=False, pinned=_pinned_keys(req), avoided=_avoided(req),
                       distinct=pipeline.has_plugin_filters)
        # A group with too little room now needs no search (the common refusal on a loaded cloud).
        searched = _group_never_fits(req, now, pipeline, topology, ignore_usage=False) is not None
        if not searched:
            found, searched = _search(req, order, now, pipeline, topology, ignore_usage=False)
            if found is not None:
                return found
        hint, unresolvable, down = _verdict(req, order, view, pipeline, topology, searched)
    if pool == 0:
        names = "/".join(sorted(types))
        detail = f"no {names} resources are available (no manager up provides them)"
    else:
        parts = ", ".join(f"{name} removed {count}" for name, count in removed.most_common())
        detail = f"none of {pool} candidates fits: {parts}"
    raise Unschedulable(f"{where}: {detail}; {hint}", unresolvable, dict(removed), down,
                        CAPACITY_IN_USE if hint == IN_USE and not (unresolvable or down) else "")
