"""Placement plug-ins: filters say yes/no per candidate, weighers score it 0..1.

As in Nova's scheduler, each filter answers `host_passes(node, ctx)` and each
weigher's score is multiplied by a configurable multiplier; the enabled lists
come from configuration, by name: a built-in's (FILTERS, WEIGHERS), a class's
`package.module:Class`, or an entry point's in the groups `harness.crs_filters`
/ `harness.crs_weighers`. Every name is resolved and checked at start-up (an
unknown or ill-formed one stops it); a plug-in that fails while placing fails
that request alone (PluginFailed, INTERNAL), never the CRS.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import math
import numbers
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from cross_resource_scheduler.constraints import Constraint
from cross_resource_scheduler.topology import Distance, TopologyModel
from cross_resource_scheduler.view import Node
from services.errors import HarnessError

log = logging.getLogger(__name__)


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
    # Pinned: instance i goes on the resource whose view key ("<manager>/<physical id>") is pins[i], or nowhere.
    # A CRS above this one sends them (it placed the request on the resources this CRS offers it); empty: free.
    pins: tuple[str, ...] = ()
    # Resources (view keys) a CRS below refused this group on (stacking.py): placed clear of them.
    avoid: frozenset[str] = frozenset()


@dataclass
class Context:
    """What a filter or weigher is told about the instance being placed, besides the node (read-only).

    * `group`: the GroupDemand being placed (name, resource_type, count, demand per instance, properties'
      ranges, required/forbidden traits); `constraints`: those involving it (Constraint: kind, a, b, value);
    * `placed`: group name -> the nodes this request's instances took so far; `tentative`: node key -> the
      demand this request put there so far (not yet in the node's `used`/`avail`);
    * `topology`: distances between locations (`topology.distance_between(location_of(a), location_of(b))`);
    * `ignore_usage`: True while the CRS proves that the request can never fit: the nodes are then shown
      on an empty cloud (Node.empty(): nothing used), so a rule on usage passes there what it could pass
      once capacity is released;
    * `free(node, attribute)`: what is left of the attribute for this instance (the node's free capacity
      less this request's tentative demand there); `located(group)`, `peers(constraint)`,
      `peer_locations(constraint)`: the placed instances a constraint is to be checked against.
    """

    group: GroupDemand
    constraints: list[Constraint]  # those involving this group
    placed: dict[str, list[Node]]  # group -> nodes chosen so far in this request
    tentative: dict[str, dict[str, float]]  # node key -> demand this request put there
    topology: TopologyModel
    # Judge against total capacity: "could this ever fit?" (unresolvable check); nodes are then shown empty.
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
        """What is left of `attribute` on `node` for this instance: its free capacity (all of its capacity
        when `ignore_usage`) less the demand this request already put there."""
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
    """Says whether a node may hold the next instance of `ctx.group` (Nova's BaseHostFilter).

    A plug-in subclasses it and sets:

    * `name`: its own, not a built-in's (refusals say "<name> removed N candidates"; the built-ins' names
      say which constraints are enforced);
    * `host_passes(node, ctx)` -> bool, or `checker(ctx)` -> a function of the node (to do the per-instance
      work once; placement calls it for every candidate it examines);
    * optionally `relevant(ctx)`: False when it passes every node for this group, to be skipped.

    `node` is a cross_resource_scheduler.view.Node: `key`, `manager`, `physical_id`, `resource_type`,
    `capacity`, `used`, `assumed`, `avail` (capacity - used - assumed) and `free(attribute)`, `properties`,
    `traits`, `location` (site, rack, host); `ctx` a Context (the group being placed, its constraints, what
    this request placed so far, the topology, `ctx.free(node, attribute)`: see Context). A filter decides
    both "may it go here now?" and "could it ever go here?": to prove that a request never fits (refused
    FAILED_PRECONDITION NEVER_FITS, "change the request") the CRS runs the filters over the nodes as they are
    on an empty cloud (`used` and `assumed` empty, `avail` == `capacity`, ctx.ignore_usage True), so a rule
    on usage passes there, and a busy cloud is told RESOURCE_EXHAUSTED CAPACITY_IN_USE (retry later).

    It is made once at start-up with no arguments and called from many threads; it must be pure: read the
    node and ctx, change neither (nor itself), no I/O, no clock, and be quick. An exception fails that
    request with INTERNAL naming the filter (PluginFailed); the CRS goes on.
    """

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
    """Scores a node that passed every filter for the next instance of `ctx.group` (Nova's BaseWeigher).

    A score is a number in 0..1, higher is better; placement picks the candidate with the highest sum of
    score x the weigher's configured multiplier (`weighers: {name: multiplier}`), so the multiplier alone
    says how much a weigher counts. (Nova normalises raw weights to 0..1 itself; here the weigher does.)
    A plug-in's score outside 0..1 (infinities included) is clipped to it, so it never counts for more
    than its multiplier; NaN or a non-number is refused: it has no place on the scale (every comparison
    with NaN is false: it would pick a candidate arbitrarily), and the request fails with INTERNAL
    naming the weigher.

    A plug-in subclasses it and sets `name` (its own, not a built-in's) and `weigh(node, ctx)` -> float,
    or `scorer(ctx)` (below). `node` and `ctx` are a filter's (see Filter: a Node, a Context); weighers
    also order the candidates of the never-fits proof, where the nodes are shown on an empty cloud. Made
    once at start-up with no arguments, called from many threads: pure as a Filter is (read node and ctx,
    change nothing, no I/O, no clock); an exception fails that request with INTERNAL naming the weigher
    (PluginFailed); the CRS goes on.
    """

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
    """What a manager's price for an instance may depend on: nodes alike in it are quoted once. A CRS below
    offers several managers' nodes ("<manager>/<id>": stacking.py), each manager with its own prices."""
    return (node.manager, node.physical_id.rpartition("/")[0], tuple(node.capacity.items()),
            tuple(node.properties.items()), node.traits)


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


class PluginFailed(HarnessError):
    """A plug-in filter or weigher raised, or scored NaN or a non-number, while placing: that request fails
    with INTERNAL (HarnessError's code) naming it; the CRS and its view are untouched (placement changes
    nothing until it returns). `problem`: which plug-in failed and how, on one line (the message's start)."""

    problem: str = ""


# Entry point groups a distribution registers its plug-ins in: `[project.entry-points."harness.crs_filters"]`.
FILTER_GROUP, WEIGHER_GROUP = "harness.crs_filters", "harness.crs_weighers"
# A plug-in's exception text in an error, at most: it may be anything, and the whole status is 1 KiB.
_SAID = 200
# What a plug-in may raise while placing without taking its worker thread down with it: anything (a sys.exit(), a
# KeyboardInterrupt or a BaseException of its own too). gRPC's worker catches only Exception: anything else left
# the request unanswered until its deadline, with nothing logged. A real Ctrl-C never reaches a worker thread.
_FAILURES = (BaseException,)


def _said(e: BaseException) -> str:
    """`Type: message` of an exception, on one line and clipped."""
    try:
        text = " ".join(str(e).split())
    except Exception:  # noqa: BLE001 - its __str__ is the plug-in's too
        text = "(its message cannot be printed)"
    if len(text) > _SAID:
        text = text[:_SAID - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _is_numpy_bool(x: object) -> bool:
    """A numpy boolean (a filter computing with numpy answers one), without importing numpy here."""
    t = type(x)
    return t.__module__ == "numpy" and t.__name__ in ("bool_", "bool")


# What each hook a plug-in may implement is called with (after self), for the start-up check of its signature.
_HOOK_ARGUMENTS = {"host_passes": ("node", "ctx"), "checker": ("ctx",), "weigh": ("node", "ctx"), "scorer": ("ctx",),
                   "relevant": ("ctx",)}


def _check_hooks(label: str, obj: type, base: type) -> None:
    """PipelineError if a hook `obj` implements cannot be called as the CRS calls it (found at start-up, not as an
    INTERNAL on every placement)."""
    for hook, args in _HOOK_ARGUMENTS.items():
        fn = getattr(obj, hook, None)
        if fn is None or fn is getattr(base, hook, None) or \
                isinstance(inspect.getattr_static(obj, hook, None), staticmethod | classmethod):
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue            # no signature to be had (a C function, say): not known, not refused
        try:
            sig.bind(None, *args)
        except TypeError:
            raise PipelineError(f"{label}: {obj.__qualname__}.{hook} must take (self, {', '.join(args)}); its "
                                f"signature is {sig}") from None


def _describe(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001
        text = f"a {type(obj).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class _Kind:
    what: str  # "filter" / "weigher"
    base: type
    builtin: dict[str, type]
    group: str
    hooks: tuple[str, str]  # a plug-in implements one of them at least


_FILTER = _Kind("filter", Filter, FILTERS, FILTER_GROUP, ("host_passes", "checker"))
_WEIGHER = _Kind("weigher", Weigher, WEIGHERS, WEIGHER_GROUP, ("weigh", "scorer"))


def _entry_points(group: str) -> dict[str, list[importlib.metadata.EntryPoint]]:
    """The entry points of `group` by name (one distribution seen twice on sys.path counts once)."""
    out: dict[str, dict[str, importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=group):
        out.setdefault(ep.name, {})[ep.value] = ep
    return {name: list(eps.values()) for name, eps in out.items()}


def _import(module: str, attr: str) -> object:
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _resolve(kind: _Kind, name: str) -> tuple[type, str] | None:
    """The class `name` stands for and where it came from ("" for a built-in); None when it names nothing.
    PipelineError, saying what to fix, when it names something that cannot be loaded or is no plug-in."""
    if name in kind.builtin:
        return kind.builtin[name], ""
    module, sep, attr = name.partition(":")
    if sep:
        if not (module and attr) or any(not p.isidentifier() for p in module.split(".") + attr.split(".")):
            raise PipelineError(f"{kind.what} {name!r}: expected a built-in name, an entry point's name, or "
                                f"package.module:Class naming a subclass of {kind.base.__name__}")
        origin = name
        load = lambda: _import(module, attr)  # noqa: E731
    else:
        found = _entry_points(kind.group).get(name)
        if not found:
            return None
        if len(found) > 1:
            raise PipelineError(f"{kind.what} {name!r}: entry points of that name in {kind.group} disagree "
                                f"({', '.join(sorted(ep.value for ep in found))}); uninstall all but one")
        origin = f"entry point {name} = {found[0].value}"
        load = found[0].load
    try:
        obj = load()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit too: a module exiting at import must say so
        hint = ("; is its package installed, or its directory on PYTHONPATH?"
                if isinstance(e, ModuleNotFoundError) else "; fix it, or drop it from the CRS's "
                f"`{kind.what}s` setting")
        raise PipelineError(f"{kind.what} {name!r}: loading {origin} raised {_said(e)}{hint}") from None
    cls = _checked(kind, name, obj)
    return cls, "" if cls in kind.builtin.values() else origin


def _checked(kind: _Kind, name: str, obj: object) -> type:
    """`obj` if it is a usable plug-in class of `kind`, else PipelineError saying why."""
    label, base = f"{kind.what} {name!r}", kind.base.__name__
    if not (isinstance(obj, type) and issubclass(obj, kind.base)):
        raise PipelineError(f"{label}: {_describe(obj)} is not a subclass of cross_resource_scheduler.plugins."
                            f"{base}")
    if obj in kind.builtin.values():
        return obj
    own = getattr(obj, "name", None)
    if not isinstance(own, str) or not own.strip() or own == kind.base.name:
        raise PipelineError(f"{label}: {obj.__qualname__} must set its own class attribute `name` (a non-empty "
                            "string: refusals and errors name the plug-in by it)")
    if own in kind.builtin:
        # The built-ins' names say which constraints are enforced (ENFORCED_BY): a plug-in may not pose as one.
        raise PipelineError(f"{label}: {obj.__qualname__}.name {own!r} is a built-in {kind.what}'s; give it "
                            "another")
    if all(getattr(obj, hook) is getattr(kind.base, hook) for hook in kind.hooks):
        raise PipelineError(f"{label}: {obj.__qualname__} implements neither {kind.hooks[0]}() nor "
                            f"{kind.hooks[1]}()")
    _check_hooks(label, obj, kind.base)
    return obj


def _made(kind: _Kind, name: str, found: tuple[type, str]) -> Filter | Weigher:
    """An instance of the class `name` resolved to, a plug-in's guarded."""
    cls, origin = found
    if not origin:
        return cls()
    try:
        plugin = cls()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - as _resolve's import
        # The hint only when it is the arguments that failed, not whatever its constructor does.
        hint = (" (a plug-in is made with no arguments)" if isinstance(e, TypeError) and _wants_arguments(cls)
                else f"; fix it, or drop it from the CRS's `{kind.what}s` setting")
        raise PipelineError(f"{kind.what} {name!r}: {cls.__qualname__}() raised {_said(e)}{hint}") from None
    return _GuardedFilter(plugin, origin) if kind is _FILTER else _GuardedWeigher(plugin, origin)


def _wants_arguments(cls: type) -> bool:
    """Whether `cls` cannot be called with no arguments (its signature requires some)."""
    try:
        inspect.signature(cls).bind()
    except TypeError:
        return True
    except Exception:  # noqa: BLE001 - no signature to be had (a C type, an odd metaclass): not known
        return False
    return False


def _unknown(kind: _Kind, names: list[str]) -> PipelineError:
    found = set(_entry_points(kind.group))
    installed, shadowed = sorted(found - set(kind.builtin)), sorted(found & set(kind.builtin))
    more = f"; installed ({kind.group}): {installed}" if installed else ""
    if shadowed:        # a built-in's name always means the built-in
        more += f"; entry points named as a built-in, never used: {shadowed}"
    return PipelineError(f"unknown {kind.what}(s) {names}; available: {sorted(kind.builtin)}{more}; or name a "
                         f"{kind.base.__name__} subclass as package.module:Class")


class _GuardedFilter(Filter):
    """A plug-in filter, called so that what it raises fails the request naming it (PluginFailed), and the time
    it takes counted (`spent`: placements run one at a time, so a slow plug-in delays every request)."""

    def __init__(self, plugin: Filter, origin: str) -> None:
        self.plugin, self.origin, self.name = plugin, origin, plugin.name
        self.spent = 0.0

    def relevant(self, ctx: Context) -> bool:
        t = time.perf_counter()
        try:
            return bool(self.plugin.relevant(ctx))
        except _FAILURES as e:
            raise _failed("filter", self, f"calling relevant() for group {ctx.group.name!r}", e) from e
        finally:
            self.spent += time.perf_counter() - t

    def host_passes(self, node: Node, ctx: Context) -> bool:
        return self.checker(ctx)(node)

    def checker(self, ctx: Context) -> Callable[[Node], bool]:
        t = time.perf_counter()
        try:
            check = self.plugin.checker(ctx)
        except _FAILURES as e:
            raise _failed("filter", self, f"calling checker() for group {ctx.group.name!r}", e) from e
        finally:
            self.spent += time.perf_counter() - t
        if not callable(check):
            raise _refused("filter", self, f"checker() returned {_describe(check)}, not a function of the node")

        def passes(node: Node) -> bool:
            t = time.perf_counter()
            try:
                ok = check(node)
            except _FAILURES as e:
                raise _failed("filter", self, f"checking {node.key} for group {ctx.group.name!r}", e) from e
            finally:
                self.spent += time.perf_counter() - t
            if ok is True or ok is False:
                return ok
            if _is_numpy_bool(ok):
                return bool(ok)
            # A None (a path that forgot to return) read as "no" told tenants to change requests the operator's
            # plug-in refused ("never fits"); a "no" read as yes passed every host.
            raise _refused("filter", self, f"returned {_describe(ok)} for {node.key} (group {ctx.group.name!r}), "
                                           "not True or False")
        return passes


class _GuardedWeigher(Weigher):
    """A plug-in weigher, called so that what it raises fails the request naming it, and its scores kept to
    0..1 (clipped; NaN or a non-number refused: see Weigher)."""

    def __init__(self, plugin: Weigher, origin: str) -> None:
        self.plugin, self.origin, self.name = plugin, origin, plugin.name
        self.spent = 0.0

    def weigh(self, node: Node, ctx: Context) -> float:
        score = self.scorer(ctx)
        return score if isinstance(score, float) else score(node)

    def scorer(self, ctx: Context) -> Callable[[Node], float] | float:
        t = time.perf_counter()
        try:
            score = self.plugin.scorer(ctx)
        except _FAILURES as e:
            raise _failed("weigher", self, f"calling scorer() for group {ctx.group.name!r}", e) from e
        finally:
            self.spent += time.perf_counter() - t
        if not callable(score):
            return self._clipped(score, "scorer()")  # every candidate alike: placement skips it

        def scored(node: Node) -> float:
            t = time.perf_counter()
            try:
                value = score(node)
            except _FAILURES as e:
                raise _failed("weigher", self, f"weighing {node.key} for group {ctx.group.name!r}", e) from e
            finally:
                self.spent += time.perf_counter() - t
            return self._clipped(value, f"for {node.key}")
        return scored

    def _clipped(self, value: object, where: str) -> float:
        if isinstance(value, numbers.Real):
            try:
                score = float(value)
            except OverflowError:  # an int past float's range: clipped as an infinity would be
                score = math.inf if value > 0 else -math.inf
            if not math.isnan(score):
                return min(1.0, max(0.0, score))
        raise _refused("weigher", self, f"scored {_describe(value)} {where}: a score is a number in 0..1")


def _failed(what: str, plugin: _GuardedFilter | _GuardedWeigher, doing: str, e: BaseException) -> PluginFailed:
    # The traceback goes to the CRS's log (its operator fixes the plug-in); the client gets one line.
    log.error("placement plug-in failed", exc_info=e,
              extra={"plugin": plugin.name, "origin": plugin.origin, "doing": doing})
    return _refused(what, plugin, f"raised {_said(e)} (while {doing})")


def running_plugin(frame: FrameType | None) -> str | None:
    """Which plug-in a thread whose innermost frame is `frame` is running, and where ("filter 'forever'
    (mylab.filters:Forever), at /x/mylab/filters.py:12 in host_passes"), or None if it is in none: the frames of
    the guards around plug-in calls (_GuardedFilter, _GuardedWeigher) name them; the deepest frame of the
    plug-in's own module says where (else the one the guard called)."""
    inner: list[FrameType] = []         # the frames inside the one looked at, innermost first
    while frame is not None:
        code = frame.f_code
        if code.co_filename == __file__ and code.co_qualname.startswith(("_GuardedFilter.", "_GuardedWeigher.")):
            me = frame.f_locals.get("self")
            if isinstance(me, _GuardedFilter | _GuardedWeigher):
                kind = "filter" if isinstance(me, _GuardedFilter) else "weigher"
                own = getattr(sys.modules.get(type(me.plugin).__module__), "__file__", None)
                at = next((f for f in inner if f.f_code.co_filename == own), inner[-1] if inner else None)
                where = "" if at is None else f", at {at.f_code.co_filename}:{at.f_lineno} in {at.f_code.co_name}"
                return f"{kind} {me.name!r} ({me.origin}){where}"
        inner.append(frame)
        frame = frame.f_back
    return None


def _refused(what: str, plugin: _GuardedFilter | _GuardedWeigher, problem: str) -> PluginFailed:
    said = " ".join(f"{what} plug-in {plugin.name!r} ({plugin.origin}) {problem}".split())
    failed = PluginFailed(f"the CRS's {said}; the request was not placed and nothing was reserved: the CRS's "
                          "operator must fix or disable the plug-in")
    failed.problem = f"the {said}"
    return failed


@dataclass
class Pipeline:
    filters: list[Filter]
    weighers: list[tuple[Weigher, float]]
    # Feasible candidates scored per instance (kube-scheduler samples nodes to
    # score; Placement caps candidates): keeps placement cost flat in cluster size.
    sample_size: int = 16

    @property
    def has_plugin_filters(self) -> bool:
        """Whether a filter is a plug-in: it may refuse one of nodes the built-ins find alike (by its id, its
        host), so the search and the never-fits proof must judge each node for itself (see placement._Classes).
        A weigher changes no verdict: alike nodes stay one class."""
        return any(isinstance(f, _GuardedFilter) for f in self.filters)

    @classmethod
    def from_names(cls, filters: list[str], weighers: dict[str, float], sample_size: int = 16) -> Pipeline:
        """The pipeline the names stand for (see the module's docstring), every plug-in loaded and checked
        now: PipelineError, saying what to fix, is what stops a CRS from starting with a bad one."""
        found_filters = [(f, _resolve(_FILTER, f)) for f in filters]
        unknown = [f for f, found in found_filters if found is None]
        if unknown:
            raise _unknown(_FILTER, unknown)
        found_weighers = [(w, _resolve(_WEIGHER, w)) for w in weighers]
        unknown = [w for w, found in found_weighers if found is None]
        if unknown:
            raise _unknown(_WEIGHER, unknown)
        if not any(found[0] is CapacityFilter for _, found in found_filters if found):
            raise PipelineError("the 'capacity' filter cannot be disabled: without it nodes would be overbooked")
        if sample_size < 1:
            raise PipelineError("sample_size must be >= 1")
        made_filters = [_made(_FILTER, f, found) for f, found in found_filters if found]
        made_weighers = [(_made(_WEIGHER, w, found), float(weighers[w])) for w, found in found_weighers if found]
        for what, made in (("filter", made_filters), ("weigher", [w for w, _ in made_weighers])):
            # Refusals and the constraints' enforcement go by name: two plug-ins of one name could not be told
            # apart.
            names = Counter(p.name for p in made)
            twice = sorted(n for n, k in names.items() if k > 1)
            if twice:
                raise PipelineError(f"{what}s named {twice} are enabled more than once; keep one of each")
        return cls(made_filters, made_weighers, sample_size)  # type: ignore[arg-type]

    def take_spent(self) -> dict[str, float]:
        """Seconds each plug-in took since the last call (built-ins are not timed), and start counting afresh."""
        out: dict[str, float] = {}
        for p in [*self.filters, *(w for w, _ in self.weighers)]:
            if isinstance(p, _GuardedFilter | _GuardedWeigher):
                out[p.name], p.spent = out.get(p.name, 0.0) + p.spent, 0.0
        return out

    def missing_filters(self, constraints: list[Constraint]) -> dict[str, str]:
        """Filters the constraints need that this pipeline lacks: filter name -> the kinds needing it."""
        enabled = {f.name for f in self.filters}
        missing: dict[str, list[str]] = {}
        for c in constraints:
            name = ENFORCED_BY.get(c.kind)
            if name is not None and name not in enabled and c.kind not in missing.setdefault(name, []):
                missing[name].append(c.kind)
        return {name: "/".join(kinds) for name, kinds in missing.items() if kinds}
