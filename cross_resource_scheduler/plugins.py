"""Placement plug-ins: filters say yes/no per candidate, weighers score it 0..1.

As in Nova's scheduler, each filter answers `host_passes(node, ctx)` and each
weigher's score is multiplied by a configurable multiplier; the enabled lists
come from configuration and an unknown name fails at start-up.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from cross_resource_scheduler.constraints import Constraint
from cross_resource_scheduler.topology import Distance, TopologyModel
from cross_resource_scheduler.view import Node


@dataclass(frozen=True)
class GroupDemand:
    """One group of a request, in the resource-agnostic terms placement needs."""

    name: str
    resource_type: str
    count: int
    # Consumable attributes per instance (e.g. cores, memory_gb).
    demand: dict[str, float]
    # Non-consumable numeric attributes: [lo, hi] the resource's property must lie in.
    properties: dict[str, tuple[float, float]] = field(default_factory=dict)
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()


@dataclass
class Context:
    group: GroupDemand
    constraints: list[Constraint]  # those involving this group
    placed: dict[str, list[Node]]  # group -> nodes chosen so far in this request
    tentative: dict[str, dict[str, float]]  # node key -> demand this request put there
    topology: TopologyModel
    # Judge against total capacity: "could this ever fit?" (unresolvable check).
    ignore_usage: bool = False
    # group -> how many of its placed instances are at each location (site, rack, host), kept by placement in
    # step with `placed` (None: counted from `placed` when asked). Distances depend on the location alone, so
    # scoring against it costs the distinct locations, not the instances.
    where: dict[str, Counter[tuple[str, str, str]]] | None = None

    def located(self, group: str) -> Counter[tuple[str, str, str]]:
        """How many of `group`'s placed instances are at each location."""
        if self.where is not None:
            return self.where.get(group) or Counter()
        return Counter(location_of(n) for n in self.placed.get(group, []))

    def peer_locations(self, c: Constraint) -> Counter[tuple[str, str, str]]:
        """`peers(c)`, counted by location."""
        me = self.group.name
        if c.a == c.b:
            return self.located(me)
        other = c.other(me)
        if self.placed.get(other):
            return self.located(other)
        if c.kind == "different_host":
            return Counter()
        return self.located(me)

    def peers(self, c: Constraint) -> list[Node]:
        """The placed instances `c` must be checked against for this group's next instance."""
        me = self.group.name
        if c.a == c.b:
            return self.placed.get(me, [])
        other = self.placed.get(c.other(me))
        if other:
            return other
        # The other group is not placed yet; every one of its instances will have
        # to be within the bound of every instance of this group. Level distances
        # form an ultrametric, so that is possible only if this group's own
        # instances are within the bound of each other: hold them to it now.
        if c.kind == "different_host":
            return []
        return self.placed.get(me, [])

    def free(self, node: Node, attribute: str) -> float:
        mine = self.tentative.get(node.key)
        taken = mine.get(attribute, 0.0) if mine else 0.0
        if self.ignore_usage:
            return node.capacity.get(attribute, 0.0) - taken
        return node.free(attribute) - taken


DISTANCE_KINDS = ("max_hops", "max_latency_ms", "min_bandwidth_gbps")


def location_of(node: Node) -> tuple[str, str, str]:
    """What a node's distances depend on: its (site, rack, host)."""
    loc = node.location
    return (loc.site, loc.rack, loc.host)


class Filter:
    name = "filter"

    def relevant(self, ctx: Context) -> bool:
        """False when this filter passes every node for this group (placement then skips it)."""
        return True

    def host_passes(self, node: Node, ctx: Context) -> bool:
        raise NotImplementedError

    def checker(self, ctx: Context) -> Callable[[Node], bool]:
        """`host_passes` for one instance's candidates (filters override it to do the
        per-instance work once: placement calls it for every candidate examined)."""
        return lambda node: self.host_passes(node, ctx)


class CapacityFilter(Filter):
    """Enough free capacity for one more instance."""

    name = "capacity"

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return self.checker(ctx)(node)

    def checker(self, ctx: Context) -> Callable[[Node], bool]:
        # Context.free, inlined: this runs for every candidate examined.
        need = [(k, v - 1e-9) for k, v in ctx.group.demand.items()]
        tentative = ctx.tentative
        if ctx.ignore_usage:
            def fits_empty(node: Node) -> bool:
                mine, cap = tentative.get(node.key), node.capacity
                for k, v in need:
                    if cap.get(k, 0.0) - (mine.get(k, 0.0) if mine else 0.0) < v:
                        return False
                return True
            return fits_empty

        def fits(node: Node) -> bool:
            mine, avail = tentative.get(node.key), node.avail  # avail[k] == node.free(k)
            for k, v in need:
                free = avail.get(k, 0.0)
                if mine:
                    free -= mine.get(k, 0.0)
                if free < v:
                    return False
            return True
        return fits


class PropertiesFilter(Filter):
    """Fixed properties (e.g. frequency_ghz) inside the requested ranges."""

    name = "properties"

    def relevant(self, ctx: Context) -> bool:
        return bool(ctx.group.properties)

    def host_passes(self, node: Node, ctx: Context) -> bool:
        for k, (lo, hi) in ctx.group.properties.items():
            v = node.properties.get(k)
            if v is None or not (lo - 1e-9 <= v <= hi + 1e-9):
                return False
        return True


class TraitsFilter(Filter):
    name = "traits"

    def relevant(self, ctx: Context) -> bool:
        return bool(ctx.group.required_traits or ctx.group.forbidden_traits)

    def host_passes(self, node: Node, ctx: Context) -> bool:
        g = ctx.group
        return g.required_traits <= node.traits and not (g.forbidden_traits & node.traits)


class AffinityFilter(Filter):
    """same_host / different_host against instances already placed."""

    name = "affinity"

    def relevant(self, ctx: Context) -> bool:
        return any(c.kind in ("same_host", "different_host") for c in ctx.constraints)

    def host_passes(self, node: Node, ctx: Context) -> bool:
        for c in ctx.constraints:
            peers = ctx.peers(c)
            if c.kind == "same_host" and peers and any(p.key != node.key for p in peers):
                return False
            if c.kind == "different_host" and any(p.key == node.key for p in peers):
                return False
        return True


class DistanceFilter(Filter):
    """max hops / max latency / min bandwidth against instances already placed."""

    name = "distance"

    def relevant(self, ctx: Context) -> bool:
        return any(c.kind in DISTANCE_KINDS for c in ctx.constraints)

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return self.checker(ctx)(node)

    def checker(self, ctx: Context) -> Callable[[Node], bool]:
        # Each bound against the distinct locations of the peers (not every instance): the per-instance work.
        bounds = [(c, list(ctx.peer_locations(c))) for c in ctx.constraints if c.kind in DISTANCE_KINDS]
        distance = ctx.topology.distance_between

        def passes(node: Node) -> bool:
            here = location_of(node)
            for c, places in bounds:
                for there in places:
                    if not self._within(c, distance(here, there)):
                        return False
            return True
        return passes

    @staticmethod
    def _within(c: Constraint, d: Distance) -> bool:
        if c.kind == "max_hops" and d.hops > c.value:
            return False
        if c.kind == "max_latency_ms" and d.latency_ms > c.value + 1e-12:
            return False
        if c.kind == "min_bandwidth_gbps" and d.bandwidth_gbps < c.value - 1e-12:
            return False
        return True


class Weigher:
    name = "weigher"

    def weigh(self, node: Node, ctx: Context) -> float:
        raise NotImplementedError

    def scorer(self, ctx: Context) -> Callable[[Node], float] | float:
        """`weigh` for one instance's candidates: a function of the node, or a number when
        every candidate scores the same (placement then skips it: it cannot change the pick).
        Weighers override it to do per-instance work once instead of per candidate."""
        return lambda node: self.weigh(node, ctx)


def _fill_after(node: Node, ctx: Context) -> float:
    """Mean fraction of the node's consumable capacity in use once this instance lands."""
    fracs = []
    for k, v in ctx.group.demand.items():
        cap = node.capacity.get(k, 0.0)
        if cap > 0:
            fracs.append(min(1.0, (cap - ctx.free(node, k) + v) / cap))
    return sum(fracs) / len(fracs) if fracs else 0.0


def _fill_after_scorer(ctx: Context) -> Callable[[Node], float]:
    """_fill_after for one instance's candidates, with Context.free inlined (same arithmetic)."""
    demand = list(ctx.group.demand.items())
    tentative, ignore_usage = ctx.tentative, ctx.ignore_usage

    def fill(node: Node) -> float:
        capacity, avail = node.capacity, node.avail  # avail[k] == node.free(k)
        mine = tentative.get(node.key)
        total, n = 0.0, 0
        for k, v in demand:
            cap = capacity.get(k, 0.0)
            if cap > 0:
                taken = mine.get(k, 0.0) if mine else 0.0
                free = cap - taken if ignore_usage else avail[k] - taken
                total += min(1.0, (cap - free + v) / cap)
                n += 1
        return total / n if n else 0.0

    return fill


class PackWeigher(Weigher):
    """Prefer fuller nodes: keeps big holes free for big requests (less fragmentation)."""

    name = "pack"

    def weigh(self, node: Node, ctx: Context) -> float:
        return _fill_after(node, ctx)

    def scorer(self, ctx: Context) -> Callable[[Node], float] | float:
        return _fill_after_scorer(ctx)


class SpreadWeigher(Weigher):
    """Prefer emptier nodes: less interference between tenants."""

    name = "spread"

    def weigh(self, node: Node, ctx: Context) -> float:
        return 1.0 - _fill_after(node, ctx)

    def scorer(self, ctx: Context) -> Callable[[Node], float] | float:
        fill = _fill_after_scorer(ctx)
        return lambda node: 1.0 - fill(node)


class TopologyWeigher(Weigher):
    """Prefer nodes close to the request's other instances (seed 003, MANGO).

    MANGO ranks candidate partitions by hop distance and bandwidth to their
    peers; here each criterion is normalised to 0..1 (hops against the
    topology's diameter, bandwidth on a log scale against the same-host
    bandwidth) and they are blended 2:1. Peers are the instances of groups
    this one is constrained against, or, without constraints, every instance
    placed so far: a request is kept compact.
    """

    name = "topology"

    def weigh(self, node: Node, ctx: Context) -> float:
        score = self.scorer(ctx)
        return score if isinstance(score, float) else score(node)

    def scorer(self, ctx: Context) -> Callable[[Node], float] | float:
        me = ctx.group.name
        related = {c.other(me) for c in ctx.constraints if c.kind != "different_host"}
        # Peers counted by location: the score is the mean over the peers, and a peer's term depends on its
        # location alone, so each distinct location is scored once, weighed by its count.
        peers: Counter[tuple[str, str, str]] = Counter()
        for g in related:
            peers.update(ctx.located(g))
        if not peers:
            # Nothing related is placed yet: stay close to what is (own group
            # included), so the related groups still find room nearby.
            for g in ctx.placed:
                peers.update(ctx.located(g))
        if not peers:
            return 0.5
        n_peers = sum(peers.values())
        topo = ctx.topology
        top_bw = math.log1p(max(topo.same_host.bandwidth_gbps, 1e-9))
        max_hops = max(1, topo.max_hops)
        distance = topo.distance_between
        # A peer's term depends on how it relates to the candidate: on its host, in its rack, in another rack
        # of its site (that rack pair's link), in another site (that site pair's link). Peers are counted per
        # site, per rack of a site and per host of a site, so a candidate costs the racks of its site and the
        # sites with peers, however many instances or hosts they hold.
        per_site: dict[str, int] = {}
        per_rack: dict[str, dict[str, int]] = {}
        per_host: dict[tuple[str, str], int] = {}
        for (site, rack, host), count in peers.items():
            per_site[site] = per_site.get(site, 0) + count
            racks = per_rack.get(site)
            if racks is None:
                racks = per_rack[site] = {}
            racks[rack] = racks.get(rack, 0) + count
            if host:
                per_host[(site, host)] = per_host.get((site, host), 0) + count
        sites = list(per_site.items())

        # The few distinct distances (a level, or a level with a link) each score alike.
        per_distance: dict[Distance, float] = {}

        def term(d: Distance) -> float:
            s = per_distance.get(d)
            if s is None:
                hop_score = 1.0 - d.hops / max_hops
                bw_score = math.log1p(d.bandwidth_gbps) / top_bw if top_bw > 0 else 0.0
                s = per_distance[d] = (2 * hop_score + min(1.0, bw_score)) / 3
            return s

        same_host = term(topo.same_host)
        # (site, rack, other rack) / (site, other site) -> the term of a peer there, for a candidate without
        # the peer's host.
        rack_terms: dict[tuple[str, str, str], float] = {}
        site_terms: dict[tuple[str, str], float] = {}

        def score(node: Node) -> float:
            loc = node.location
            site, rack, host = loc.site, loc.rack, loc.host
            total = 0.0
            on_host = per_host.get((site, host), 0) if host else 0
            if on_host:
                total += on_host * same_host
            racks = per_rack.get(site)
            if racks:
                for other, count in racks.items():
                    if on_host:
                        count -= peers.get((site, other, host), 0)  # counted on the host
                        if not count:
                            continue
                    key = (site, rack, other)
                    s = rack_terms.get(key)
                    if s is None:
                        s = rack_terms[key] = term(distance((site, rack, ""), (site, other, "")))
                    total += count * s
            for other, count in sites:
                if other != site:
                    key2 = (site, other)
                    s = site_terms.get(key2)
                    if s is None:
                        s = site_terms[key2] = term(distance((site, rack, ""), (other, "", "")))
                    total += count * s
            return total / n_peers

        return score


def price_key(node: Node) -> tuple:
    """What a manager's price for an instance may depend on: nodes alike in it are quoted once."""
    return (node.manager, tuple(node.capacity.items()), tuple(node.properties.items()), node.traits)


class PriceWeigher(Weigher):
    """Prefer nodes where an instance of the group costs less (used to meet a tenant's max price).

    `prices`: (group name, price_key(node)) -> the manager's quote for one instance there; a node not
    quoted scores as the dearest.
    """

    name = "price"

    def __init__(self, prices: dict[tuple[str, tuple], float]) -> None:
        self.prices = prices
        self.top = max(prices.values(), default=0.0)

    def weigh(self, node: Node, ctx: Context) -> float:
        price = self.prices.get((ctx.group.name, price_key(node)))
        return 0.0 if price is None or self.top <= 0 else 1.0 - price / self.top


# The filter that enforces each kind of constraint: without it enabled, placement would ignore the constraint.
ENFORCED_BY = {"same_host": "affinity", "different_host": "affinity", "max_hops": "distance",
               "max_latency_ms": "distance", "min_bandwidth_gbps": "distance"}

FILTERS: dict[str, type[Filter]] = {f.name: f for f in
                                    (CapacityFilter, PropertiesFilter, TraitsFilter, AffinityFilter, DistanceFilter)}
WEIGHERS: dict[str, type[Weigher]] = {w.name: w for w in (PackWeigher, SpreadWeigher, TopologyWeigher)}


class PipelineError(ValueError):
    pass


@dataclass
class Pipeline:
    filters: list[Filter]
    weighers: list[tuple[Weigher, float]]
    # Feasible candidates scored per instance (kube-scheduler samples nodes to
    # score; Placement caps candidates): keeps placement cost flat in cluster size.
    sample_size: int = 16

    @classmethod
    def from_names(cls, filters: list[str], weighers: dict[str, float], sample_size: int = 16) -> Pipeline:
        unknown = [f for f in filters if f not in FILTERS]
        if unknown:
            raise PipelineError(f"unknown filter(s) {unknown}; available: {sorted(FILTERS)}")
        unknown = [w for w in weighers if w not in WEIGHERS]
        if unknown:
            raise PipelineError(f"unknown weigher(s) {unknown}; available: {sorted(WEIGHERS)}")
        if "capacity" not in filters:
            raise PipelineError("the 'capacity' filter cannot be disabled: without it nodes would be overbooked")
        if sample_size < 1:
            raise PipelineError("sample_size must be >= 1")
        return cls([FILTERS[f]() for f in filters], [(WEIGHERS[w](), float(m)) for w, m in weighers.items()],
                   sample_size)

    def missing_filters(self, constraints: list[Constraint]) -> dict[str, str]:
        """Filters the constraints need that this pipeline lacks: filter name -> the kinds needing it."""
        enabled = {f.name for f in self.filters}
        missing: dict[str, list[str]] = {}
        for c in constraints:
            name = ENFORCED_BY.get(c.kind)
            if name is not None and name not in enabled and c.kind not in missing.setdefault(name, []):
                missing[name].append(c.kind)
        return {name: "/".join(kinds) for name, kinds in missing.items() if kinds}
