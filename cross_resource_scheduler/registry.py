"""Managers known to the CRS, their liveness, and the capacity they stream.

Each registered manager gets a watcher thread that follows its WatchCapacity
stream into the capacity view. A manager whose heartbeats stop for longer
than the timeout is marked down: its resources leave scheduling until it
heartbeats again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from cross_resource_scheduler.delegation import Delegator
from cross_resource_scheduler.stacking import offered
from cross_resource_scheduler.view import CapacityView
from harness.v1 import irm_pb2, irm_pb2_grpc
from services import client, control, tenants
from services.clock import Clock

log = logging.getLogger(__name__)
DEFAULT_MAX_DELEGATIONS = 8


@dataclass
class ManagerState:
    name: str
    address: str
    resource_types: list[str]
    last_heartbeat: float
    specs: list[irm_pb2.ResourceTypeSpec] = field(default_factory=list)
    up: bool = True
    stop: threading.Event = field(default_factory=threading.Event)
    synced: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    call: grpc.Future | None = None  # the open WatchCapacity stream, cancelled on stop
    # Why its capacity is not followed now (the last failure of its WatchCapacity stream; "" once a snapshot
    # arrived): `harness status` shows it, as a token mismatch otherwise shows only as an empty view.
    follow_error: str = ""
    # Managers whose resources it offers under their names (it is a CRS: stacking.py), as its stream showed them.
    below: set[str] = field(default_factory=set)
    _stub: irm_pb2_grpc.ResourceManagerStub | None = field(default=None, repr=False)
    # Its Reserve calls, batched when they overlap (see delegation.py).
    delegator: Delegator = field(init=False, repr=False)
    # Delegations that may wait on it at once (taken without blocking: a caller finding none is refused, not
    # queued on a worker thread; see CrsConfig.max_delegations_per_manager).
    max_delegations: int = DEFAULT_MAX_DELEGATIONS
    slots: threading.BoundedSemaphore = field(init=False, repr=False)
    # Sent with every call to it: the CRS acts for tenants there (services.tenants).
    delegation_token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.delegator = Delegator(self.stub)
        self.slots = threading.BoundedSemaphore(max(1, self.max_delegations))

    def stub(self) -> irm_pb2_grpc.ResourceManagerStub:
        # Built once: a stub makes a callable per method (~0.15 ms), on the shared channel.
        if self._stub is None:
            self._stub = irm_pb2_grpc.ResourceManagerStub(tenants.delegating(client.channel(self.address),
                                                                             self.delegation_token))
        return self._stub


class Registry:
    def __init__(self, view: CapacityView, clock: Clock, heartbeat_timeout_s: float,
                 on_change: Callable[[str, irm_pb2.CapacityEvent], None],
                 on_up: Callable[[str], None], max_delegations: int = DEFAULT_MAX_DELEGATIONS,
                 on_down: Callable[[str], None] | None = None, control_token: str = "",
                 delegation_token: str = "") -> None:
        """`on_change(manager, event)`: each event of a manager's stream, after the view applied it, and the
        changes a (re)connect's snapshot made that no event of the manager's says: resources it added or changed
        (KIND_UPDATED) and resources it no longer has (KIND_REMOVED). `on_up(manager)`: a manager registered or
        came back; `on_down(manager)`: it was marked down (each after the view knows). `control_token`: sent with
        each manager's WatchCapacity, which takes a stream without a tenant from the control plane only;
        `delegation_token`: with every other call, made for a tenant (services.tenants)."""
        self.view = view
        self.clock = clock
        self.timeout = heartbeat_timeout_s
        self.on_change = on_change
        self.on_up = on_up
        self.on_down = on_down
        self.max_delegations = max_delegations
        self.control_token = control_token
        self.delegation_token = delegation_token
        self.lock = threading.Lock()
        self.managers: dict[str, ManagerState] = {}

    def register(self, name: str, address: str, resource_types: list[str]) -> ManagerState:
        state = self._register(name, address, resource_types, remembered=False)
        assert state is not None
        return state

    def remember(self, name: str, address: str, resource_types: list[str]) -> ManagerState | None:
        """A manager the database knows, at a CRS's start: followed, but down until it heartbeats -- unless it has
        registered meanwhile (the CRS serves before it starts): that live registration is left as it is (None)."""
        return self._register(name, address, resource_types, remembered=True)

    def _register(self, name: str, address: str, resource_types: list[str], remembered: bool) -> ManagerState | None:
        with self.lock:
            old = self.managers.get(name)
            if remembered and old is not None:
                return None
            if old is not None and old.address == address and old.thread and old.thread.is_alive():
                old.last_heartbeat = self.clock.now()
                old.resource_types = list(resource_types)
                self._mark_up(old)
                return old
            if old is not None:
                old.stop.set()
            state = ManagerState(name, address, list(resource_types), -math.inf if remembered else self.clock.now(),
                                 max_delegations=self.max_delegations, delegation_token=self.delegation_token)
            self.managers[name] = state
        self.view.set_down(name, False)
        state.thread = threading.Thread(target=self._follow, args=(state,), name=f"watch-{name}", daemon=True)
        state.thread.start()
        self.on_up(name)
        return state

    def heartbeat(self, name: str, address: str = "") -> bool:
        """A heartbeat from the manager `name` (at `address`, when the sender says): False if it is not known,
        or the name is registered at another address (another process took it over: the sender registers again,
        and is refused while that one answers)."""
        with self.lock:
            state = self.managers.get(name)
            if state is None or state.stop.is_set() or (address and address != state.address):
                return False
            state.last_heartbeat = self.clock.now()
            self._mark_up(state)
            return True

    def _mark_up(self, state: ManagerState) -> None:
        if not state.up:
            state.up = True
            self.view.set_down(state.name, False)
            log.info("manager up again", extra={"manager": state.name})
            self.on_up(state.name)

    def check_liveness(self) -> None:
        downs = []
        with self.lock:
            # The verdict and the view's down flag change together under the lock a heartbeat takes: marked down
            # outside it, a heartbeat landing between `up = False` and `set_down(True)` (which waits for the
            # view's lock through a whole placement) cleared the flag first, and the manager stayed up in the
            # registry but down in the view -- unschedulable for good, since later heartbeats saw it up.
            now = self.clock.now()
            for s in self.managers.values():
                if s.up and now - s.last_heartbeat > self.timeout:
                    s.up = False
                    self.view.set_down(s.name, True)
                    downs.append((s.name, now - s.last_heartbeat))
        for name, silent in downs:
            if math.isinf(silent):
                # Known from the database, not heard from since this CRS started: no news, not an outage (and
                # Infinity is no JSON number for the log's parsers).
                log.info("manager known from before this CRS started has not registered since",
                         extra={"manager": name})
            else:
                log.warning("manager down: no heartbeat", extra={"manager": name, "silent_s": round(silent, 1)})
            if self.on_down is not None:
                self.on_down(name)

    def remove(self, name: str, expected: ManagerState | None = None, wait_s: float = 5.0
               ) -> list[irm_pb2.PhysicalResource]:
        """Forget the manager `name` (deregistered; only while it is still `expected`, when given): stop following
        it and take its resources out of the view; returns them as they were. Its watcher is waited for (up to
        `wait_s`), so an event it was applying cannot put a resource back after the view dropped them."""
        with self.lock:
            state = self.managers.get(name)
            if state is None or (expected is not None and state is not expected):
                return []
            del self.managers[name]
        state.stop.set()
        if state.thread is not None and state.thread is not threading.current_thread():
            state.thread.join(wait_s)
        with self.view.lock:
            gone = [n.to_proto() for n in self.view.nodes.values() if n.manager == name]
        self.view.drop_manager(name)
        self.view.set_down(name, False)
        return gone

    def get(self, name: str) -> ManagerState | None:
        with self.lock:
            return self.managers.get(name)

    def up(self) -> list[ManagerState]:
        with self.lock:
            return [s for s in self.managers.values() if s.up]

    def all(self) -> list[ManagerState]:
        with self.lock:
            return list(self.managers.values())

    def providing(self, resource_type: str) -> list[ManagerState]:
        """The registered managers (up or not) that offer `resource_type`: by their description of their types,
        or, until they have given one, by the types they registered with."""
        with self.lock:
            return [s for s in self.managers.values()
                    if any(spec.name == resource_type for spec in s.specs)
                    or (not s.specs and resource_type in s.resource_types)]

    def stop(self) -> None:
        with self.lock:
            for s in self.managers.values():
                s.stop.set()

    @staticmethod
    def _describe_again(state: ManagerState, stub: irm_pb2_grpc.ResourceManagerStub) -> None:
        """`state.specs` as the manager describes them now; as they were if it does not answer (the event that
        prompted it is passed on all the same, and the next reconnect describes it again)."""
        try:
            state.specs = list(stub.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(),
                                                           timeout=5).resource_types)
        except grpc.RpcError as e:
            log.info("manager not described again", extra={"manager": state.name, "code": str(e.code())})

    def _follow(self, state: ManagerState) -> None:
        """Keep the view in step with one manager, reconnecting until told to stop."""
        def cancel_on_stop() -> None:
            state.stop.wait()
            if state.call is not None:
                state.call.cancel()

        threading.Thread(target=cancel_on_stop, name=f"unwatch-{state.name}", daemon=True).start()
        # Its stream has no tenant: the manager keeps it a control-plane slot when the token comes with it.
        watch = irm_pb2_grpc.ResourceManagerStub(control.channel(client.channel(state.address), self.control_token))
        backoff = 0.1
        while not state.stop.is_set():
            call = None
            try:
                stub = state.stub()
                state.specs = list(stub.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(),
                                                               timeout=5).resource_types)
                call = state.call = watch.WatchCapacity(irm_pb2.WatchCapacityRequest())
                seen: set[str] = set()
                state.below = set()
                for ev in call:
                    if state.stop.is_set():
                        break
                    backoff = 0.1
                    ev = offered(state.name, ev)
                    if ev.kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END:
                        pruned = []
                        for node in list(self.view.nodes.values()):
                            if node.manager == state.name and node.physical_id not in seen:
                                pruned.append(node.to_proto())
                                self.view.remove(state.name, node.physical_id)
                        if pruned:
                            self.on_change(state.name, irm_pb2.CapacityEvent(
                                kind=irm_pb2.CapacityEvent.KIND_REMOVED, resource=pruned[0], more=pruned[1:]))
                        state.synced.set()
                        state.follow_error = ""
                        if state.below:
                            # A CRS below: a manager of its may have joined between its description and its
                            # snapshot.
                            self._describe_again(state, stub)
                        continue
                    changed = []
                    went_back = []
                    joined = False
                    # One message may carry several resources (`more`: the IRM coalesced them).
                    for r in (ev.resource, *ev.more):
                        if r.manager and r.manager != state.name and r.manager not in state.below:
                            state.below.add(r.manager)
                            joined = True       # a manager new below it (of a type, or ranges, not described)
                        if ev.kind == irm_pb2.CapacityEvent.KIND_REMOVED:
                            self.view.remove(state.name, r.id)
                        else:
                            snapshot = ev.kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT
                            if snapshot:
                                seen.add(r.id)
                                before = self.view.nodes.get(f"{state.name}/{r.id}")
                                was = before.to_proto() if before is not None else None
                            # A stream's snapshot is the manager's state now, even with older generations
                            # (restarted on an older or fresh database); updates within a stream are ordered.
                            node = self.view.upsert(state.name, r, snapshot=snapshot)
                            if snapshot:
                                now = node.to_proto()
                                if now != was:
                                    changed.append(now)  # new (it joined), or changed while not followed
                                    if was is not None and now.generation < was.generation:
                                        # Restarted on an older or fresh database: a watcher (a CRS above)
                                        # would take the change for stale; told it left first, it takes it new.
                                        went_back.append(was)
                    if joined and ev.kind == irm_pb2.CapacityEvent.KIND_UPDATED:
                        # Since the snapshot (the snapshot's end describes it again for those in the snapshot).
                        self._describe_again(state, stub)
                    self.on_change(state.name, ev)
                    if went_back:
                        self.on_change(state.name, irm_pb2.CapacityEvent(
                            kind=irm_pb2.CapacityEvent.KIND_REMOVED, resource=went_back[0], more=went_back[1:]))
                    if changed:
                        self.on_change(state.name, irm_pb2.CapacityEvent(
                            kind=irm_pb2.CapacityEvent.KIND_UPDATED, resource=changed[0], more=changed[1:]))
            except grpc.RpcError as e:
                if not state.stop.is_set():
                    state.follow_error = f"{e.code().name}: {e.details() or ''}"[:500]
                    log.info("watch of manager interrupted", extra={"manager": state.name, "code": str(e.code()),
                                                                    "details": e.details() or ""})
            finally:
                if call is not None:
                    call.cancel()
            state.stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)
