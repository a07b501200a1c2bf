"""The CRS's picture of capacity: every physical resource of every manager that is up.

IRMs stay authoritative (they refuse what no longer fits); this view is what
placement reads. It is fed by each IRM's WatchCapacity stream and by
"assumptions": demand the CRS has placed but whose commit it has not yet seen
reported, so two concurrent requests are not both placed in the same hole.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.v1 import common_pb2


@dataclass
class Node:
    """One physical resource as the CRS sees it; placement's filters and weighers read it (never change it).

    * `manager`, `physical_id`, `key` ("<manager>/<physical id>", unique), `resource_type`;
    * `capacity`, `used` (as its manager last reported), `assumed` (demand the CRS placed whose commit the
      manager has not reported yet), `avail` (capacity - used - assumed, per attribute; `free(attribute)` is
      one of them): consumable attributes (cores, memory_gb, ...) -> amount;
    * `properties` (fixed numbers, e.g. frequency_ghz), `traits` (a frozenset of strings), `location`
      (`site`, `rack`, `host`), `generation` and `epoch` (the manager's version of it).

    `empty()` is the same resource on an empty cloud (nothing used or assumed): what plug-ins see while
    the CRS proves that a request can never fit.
    """

    manager: str
    physical_id: str
    resource_type: str
    capacity: dict[str, float]
    used: dict[str, float]
    properties: dict[str, float]
    traits: frozenset[str]
    location: common_pb2.Location
    generation: int = 0
    assumed: dict[str, float] = field(default_factory=dict)
    # Bumped when a snapshot's generation went back (the manager restarted on an older or fresh
    # database): generations from before belong to a history the manager no longer has.
    epoch: int = 0
    # Its manager below `manager` (a CRS's) is down, as that CRS said (PhysicalResource.manager_down).
    down_below: bool = False

    key: str = ""  # "<manager>/<physical id>", unique across managers
    # free() of every attribute, as of the last change the view made (placement reads it
    # for every candidate); refresh() after changing capacity, used or assumed.
    avail: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    # empty()'s node, made when first asked for after the last refresh().
    _empty: Node | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = f"{self.manager}/{self.physical_id}"
        self.refresh()

    def empty(self) -> Node:
        """This resource as it is on an empty cloud: `used` and `assumed` empty, `avail` equal to `capacity`,
        everything else the same (shared: read-only, as every Node for placement). The never-fits proof
        shows these to the filters and weighers, so that one reading usage any way (`used`, `avail`,
        `free()`, Context.free) judges the empty cloud. Made once until the node next changes (refresh())."""
        twin = self._empty
        if twin is None:
            twin = Node.__new__(Node)
            twin.__dict__.update(self.__dict__)
            twin.used, twin.assumed, twin.avail = {}, {}, dict(self.capacity)
            twin._empty = twin
            self._empty = twin
        return twin

    def free(self, attribute: str) -> float:
        return self.capacity.get(attribute, 0.0) - self.used.get(attribute, 0.0) - self.assumed.get(attribute, 0.0)

    def refresh(self) -> None:
        self._empty = None
        cap, used, assumed = self.capacity, self.used, self.assumed
        self.avail = {k: cap.get(k, 0.0) - used.get(k, 0.0) - assumed.get(k, 0.0)
                      for k in (cap.keys() | used.keys() | assumed.keys())}

    def to_proto(self) -> common_pb2.PhysicalResource:
        used = {k: self.used.get(k, 0.0) for k in self.capacity}
        return common_pb2.PhysicalResource(
            id=self.physical_id, resource_type=self.resource_type, capacity=self.capacity, used=used,
            properties=self.properties, traits=sorted(self.traits), location=self.location,
            generation=self.generation, manager=self.manager, manager_down=self.down_below)


@dataclass
class Assumption:
    token: str
    node: str
    demand: dict[str, float]
    base_generation: int
    committed: bool = False
    # The node's generation at which its reported usage includes this demand (0: unknown).
    until: int = 0
    # The node's epoch when placed: a commit is settled by generations of that history only.
    epoch: int = 0


class CapacityView:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self._by_type: dict[str, list[Node]] = defaultdict(list)
        self._by_rack: dict[tuple[str, str, str], list[Node]] = defaultdict(list)
        self._by_site: dict[tuple[str, str], list[Node]] = defaultdict(list)
        self._down: set[str] = set()
        self._below: set[str] = set()   # keys of nodes whose manager below is down (none: the common case is O(1))
        # While some node is down, the up members of each index list, as of `_shape` (bumped whenever a node joins
        # or leaves an index or goes down or up): a placement asks for them once per instance, and filtering 20 000
        # nodes each time made it five times slower with one manager down. Usage changes keep them (same nodes).
        self._shape = 0
        self._up_lists: dict[tuple, tuple[int, list[Node]]] = {}
        self._assumptions: dict[str, list[Assumption]] = defaultdict(list)  # node key -> assumptions
        self._tokens: dict[str, set[str]] = defaultdict(set)  # token -> node keys it assumed on
        # Nodes removed while assumptions still named them: node key -> (generation, epoch) when removed. Back with
        # older generations (its manager restarted on an older or fresh database meanwhile), the node starts a new
        # epoch, as a snapshot that went back does: commits awaiting generations of the old history settle.
        self._left: dict[str, tuple[int, int]] = {}
        self.version = 0  # bumped on every change a manager reports
        self.assumptions_made = 0  # bumped on every assume and forget: what the CRS's own placements change

    # -- feeding ---------------------------------------------------------
    def upsert(self, manager: str, r: common_pb2.PhysicalResource, snapshot: bool = False) -> Node:
        """Apply a resource as `manager` reported it.

        `snapshot`: it comes from the full snapshot that opens a (re)connected manager's stream. That is
        the manager's state now, whatever its generation: after a restart on an older or fresh database
        the generations go back, and keeping the newer-numbered old usage would refuse fitting requests
        for good. Within a stream, events older than what the view holds are stale (a snapshot raced a
        newer event) and ignored.
        """
        with self.lock:
            key = f"{manager}/{r.id}"
            node = self.nodes.get(key)
            went_back = False
            if node is not None and r.generation < node.generation:
                if not snapshot:
                    return node  # stale (a snapshot raced a newer event)
                went_back = True
            if node is None or node.resource_type != r.resource_type or node.location != r.location:
                node = self._replace(manager, r, node)
            else:
                node.capacity, node.used, node.properties = dict(r.capacity), dict(r.used), dict(r.properties)
                node.traits, node.generation = frozenset(r.traits), r.generation
                node.refresh()
            # Said of resources a CRS offers from the managers below it ("<manager>/<id>"), not of an IRM's own.
            down_below = r.manager_down and "/" in r.id
            if down_below != node.down_below:
                node.down_below = down_below
                self._shape += 1
            (self._below.add if node.down_below else self._below.discard)(node.key)
            if went_back:
                node.epoch += 1
            self._settle(node)
            self.version += 1
            return node

    def _replace(self, manager: str, r: common_pb2.PhysicalResource, old: Node | None) -> Node:
        """A new node for `r` (new, or changed type or location), in the indexes in place of `old`."""
        if old is not None:
            self._unindex(old)
        epoch = old.epoch if old is not None else 0
        left = self._left.pop(f"{manager}/{r.id}", None) if old is None else None
        if left is not None:
            epoch = left[1] + (1 if r.generation < left[0] else 0)
        node = Node(manager, r.id, r.resource_type, dict(r.capacity), dict(r.used), dict(r.properties),
                    frozenset(r.traits), common_pb2.Location(site=r.location.site, rack=r.location.rack,
                                                             host=r.location.host), r.generation,
                    epoch=epoch)
        self.nodes[node.key] = node
        self._index(node)
        self._recount(node)  # pending assumptions follow the resource
        return node

    def remove(self, manager: str, physical_id: str) -> None:
        with self.lock:
            node = self.nodes.pop(f"{manager}/{physical_id}", None)
            if node is not None:
                self._unindex(node)
                self._leaves(node)
                self.version += 1

    def drop_manager(self, manager: str) -> None:
        with self.lock:
            for node in [n for n in self.nodes.values() if n.manager == manager]:
                self.nodes.pop(node.key)
                self._unindex(node)
                self._leaves(node)
            self.version += 1

    def _leaves(self, node: Node) -> None:
        items = self._assumptions.get(node.key)
        if items:
            # The newest generation of its history known here: its own, or one a commit's reply named (the IRM
            # had reached it when it answered). Back below that, it is another history.
            self._left[node.key] = (max([node.generation, *(a.until for a in items)]), node.epoch)

    def set_down(self, manager: str, down: bool) -> None:
        with self.lock:
            (self._down.add if down else self._down.discard)(manager)
            self._shape += 1
            self.version += 1

    def is_down(self, manager: str) -> bool:
        return manager in self._down

    def node_down(self, node: Node) -> bool:
        """Whether nothing may be placed on `node` now: its manager is down, or the manager below it (a CRS's)."""
        return node.down_below or node.manager in self._down

    @staticmethod
    def down_name(node: Node) -> str:
        """The manager whose being down keeps `node` out: its own, or "<CRS>/<manager>" below it."""
        return f"{node.manager}/{node.physical_id.rsplit('/', 1)[0]}" if node.down_below else node.manager

    def _index(self, node: Node) -> None:
        self._by_type[node.resource_type].append(node)
        self._by_rack[(node.resource_type, node.location.site, node.location.rack)].append(node)
        self._by_site[(node.resource_type, node.location.site)].append(node)
        self._shape += 1        # after the lists changed (see _up)

    def _unindex(self, node: Node) -> None:
        self._below.discard(node.key)
        for lst in (self._by_type[node.resource_type],
                    self._by_rack[(node.resource_type, node.location.site, node.location.rack)],
                    self._by_site[(node.resource_type, node.location.site)]):
            try:
                lst.remove(node)
            except ValueError:
                pass
        self._shape += 1        # after the lists changed (see _up)

    # -- reading ---------------------------------------------------------
    def of_type(self, resource_type: str) -> list[Node]:
        return self._up(("type", resource_type), self._by_type.get(resource_type, []))

    def all_of_type(self, resource_type: str) -> list[Node]:
        """Every node of the type, its manager down or not (of_type: the up ones): what a claim about all the
        resources under a prefix must be judged against."""
        return list(self._by_type.get(resource_type, []))

    def in_rack(self, resource_type: str, site: str, rack: str) -> list[Node]:
        return self._up(("rack", resource_type, site, rack), self._by_rack.get((resource_type, site, rack), []))

    def in_site(self, resource_type: str, site: str) -> list[Node]:
        return self._up(("site", resource_type, site), self._by_site.get((resource_type, site), []))

    def _up(self, key: tuple, nodes: list[Node]) -> list[Node]:
        """`nodes` (an index list, `key`) without the down ones: the list itself while none is down."""
        if not (self._down or self._below):
            return nodes
        # Under the lock (reentrant: placements hold it already): a reader without it (unit prices) could
        # otherwise cache a list being changed under the shape of after the change.
        with self.lock:
            shape = self._shape
            kept = self._up_lists.get(key)
            if kept is not None and kept[0] == shape:
                return kept[1]
            up = [n for n in nodes if not (n.down_below or n.manager in self._down)]
            if len(self._up_lists) > 4096:      # one per type, site and rack asked for: bounded all the same
                self._up_lists.clear()
            self._up_lists[key] = (shape, up)
            return up

    def resource_types(self) -> list[str]:
        return sorted(t for t, nodes in self._by_type.items() if nodes)

    def up_nodes(self) -> list[Node]:
        with self.lock:
            return [n for n in self.nodes.values() if not self.node_down(n)]

    # -- assumptions -----------------------------------------------------
    def assume(self, token: str, node: Node, demand: dict[str, float]) -> None:
        with self.lock:
            self._assumptions[node.key].append(Assumption(token, node.key, dict(demand), node.generation,
                                                          epoch=node.epoch))
            self._tokens[token].add(node.key)
            for k, v in demand.items():
                node.assumed[k] = node.assumed.get(k, 0.0) + v
            node.refresh()
            self.assumptions_made += 1

    def commit(self, token: str, caught_up: Mapping[str, int] | None = None) -> None:
        """The IRM committed: keep the assumption until the watch stream shows the change.

        `caught_up`: per node key, the generation from which the node's reported usage
        includes the commit (the IRM's reply says it). Without it, any generation newer
        than the one placed against is taken to show it; when another change lands
        first, that drops the assumption early and the view under-counts until the
        commit's own event arrives (the IRM then refuses what does not fit).
        """
        with self.lock:
            for key in self._tokens.pop(token, ()):
                for a in self._assumptions.get(key, ()):
                    if a.token == token:
                        a.committed = True
                        a.until = (caught_up or {}).get(key, 0)
                        if key in self._left and a.until > self._left[key][0]:
                            # Gone meanwhile: the IRM had reached `until` when it answered (see _leaves).
                            self._left[key] = (a.until, self._left[key][1])
                if key in self.nodes:
                    self._settle(self.nodes[key])

    def forget(self, token: str) -> None:
        """The delegation failed: the assumed demand was never taken."""
        with self.lock:
            self.assumptions_made += 1
            for key in self._tokens.pop(token, ()):
                items = self._assumptions.get(key, [])
                keep = [a for a in items if a.token != token]
                if len(keep) != len(items):
                    self._assumptions[key] = keep
                    if key in self.nodes:
                        self._recount(self.nodes[key])
                    elif not keep:
                        # Gone from the view, and nothing of ours on it any more: nothing to remember of it.
                        self._assumptions.pop(key, None)
                        self._left.pop(key, None)

    def _settle(self, node: Node) -> None:
        items = self._assumptions.get(node.key)
        if not items:
            return
        keep = [a for a in items if not (a.committed and self._shown(a, node))]
        if len(keep) != len(items):
            self._assumptions[node.key] = keep
            self._recount(node)

    @staticmethod
    def _shown(a: Assumption, node: Node) -> bool:
        """Whether the node's reported usage includes the committed assumption `a`."""
        if a.epoch != node.epoch:
            # Its generations are of a history the manager no longer has, so none will ever show it: what the
            # manager reports now is the truth. A commit the restart lost is not held for good; one made since
            # may be under-counted until its event arrives (the manager refuses what does not fit).
            return True
        gen = node.generation
        return gen >= a.until if a.until else gen > a.base_generation

    def _recount(self, node: Node) -> None:
        assumed: dict[str, float] = {}
        for a in self._assumptions.get(node.key, []):
            for k, v in a.demand.items():
                assumed[k] = assumed.get(k, 0.0) + v
        node.assumed = assumed
        node.refresh()
        if not self._assumptions.get(node.key):
            self._assumptions.pop(node.key, None)
