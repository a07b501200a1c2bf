"""The CRS's WatchCapacity streams: a snapshot of the capacity view, then its managers' changes as they come,
to every open stream (services.watch.Broadcaster, which caps them).

A manager marked down has its resources REMOVED downstream and UPDATED again when it is back; none of its own
events may slip in between (see CapacityWatch.forward).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from cross_resource_scheduler.view import CapacityView
from harness.v1 import irm_pb2
from services import control
from services.watch import CAPACITY_TENANT_FULL, CAPACITY_WATCHES_PER_TENANT, Broadcaster

# Open WatchCapacity streams at most (the Broadcaster refuses more): each holds one of the server's 32 worker
# threads (services.server), which Reserve, the IRMs' heartbeats and the health checks share; 32 idle watches
# froze the CRS.
MAX_WATCHES = 8


class CapacityWatch:
    """The streams of one CRS, fed from its view (`view`) and its managers' changes (forward). `control_token`:
    a stream without a tenant is the control plane's with it (services.control)."""

    def __init__(self, view: CapacityView, control_token: str) -> None:
        self.view = view
        self.control_token = control_token
        self.watchers: Broadcaster[irm_pb2.CapacityEvent] = Broadcaster(
            max_streams=MAX_WATCHES,
            full="WatchCapacity streams are open on this CRS; close one, or poll DiscoverResources",
            per_tenant=CAPACITY_WATCHES_PER_TENANT, tenant_full=CAPACITY_TENANT_FULL)
        # Watch events are published under this lock, with a manager's state checked: a manager marked down
        # has its resources REMOVED downstream, and no event of its stream may slip in after that.
        self._publishing = threading.Lock()

    def stream(self, request, context) -> Iterator[irm_pb2.CapacityEvent]:  # noqa: ANN001
        """WatchCapacity's stream: the view's resources (of `request.resource_type`, if it names one) as a
        snapshot, its end, then their changes as they come."""
        # Its caps: a tenant's, or the control plane's for a caller with the control token (services.control).
        who = control.watch_tenant(request.tenant, self.control_token, context)

        def snapshot():
            # Down managers' resources too, said down (manager_down): a CRS above tells "retry later" by them.
            with self.view.lock:
                nodes = [(n, self.view.node_down(n)) for n in self.view.nodes.values()
                         if not request.resource_type or n.resource_type == request.resource_type]
            for n, down in nodes:
                r = n.to_proto()
                r.manager_down = down
                yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT, resource=r)
            yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)

        # A stream over the Broadcaster's caps is refused there (RESOURCE_EXHAUSTED, STREAM_CAP).
        for ev in self.watchers.stream(snapshot, context.is_active, who):
            # The snapshot's end names no resource: it passes every filter (a client waits for it).
            if (not request.resource_type or ev.kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END
                    or ev.resource.resource_type == request.resource_type):
                yield ev

    def forward(self, manager: str, ev: irm_pb2.CapacityEvent) -> None:
        """A change of `manager`'s resources to the CRS's watchers; while it is down, said down (manager_down):
        a CRS above keeps its resources as down, and must see them pruned, or their generations go back, as they
        do here (a reconnect snapshot applied before the manager's heartbeat), or it would keep them down for good."""
        if (ev.kind in (irm_pb2.CapacityEvent.KIND_UPDATED, irm_pb2.CapacityEvent.KIND_REMOVED)
                and self.watchers.has_subscribers()):
            with self._publishing:
                down = self.view.is_down(manager)
                # One event per resource downstream, as the CRS always sent them.
                out = []
                for r in (ev.resource, *ev.more):
                    one = irm_pb2.CapacityEvent(kind=ev.kind, resource=r)
                    one.resource.manager = manager
                    if down:
                        one.resource.manager_down = True
                    out.append(one)
                self.watchers.publish(out)

    def publish_all_of(self, manager: str, down: bool) -> None:
        """Every resource of `manager` in the view to the watchers, UPDATED, said down (manager_down) or not. Not
        REMOVED when it goes down: a CRS above would take a request they could hold for one that never fits."""
        if not self.watchers.has_subscribers():
            return
        with self._publishing:
            if self.view.is_down(manager) != down:
                return  # it changed again meanwhile: that change publishes
            with self.view.lock:
                mine = [n.to_proto() for n in self.view.nodes.values() if n.manager == manager]
            for r in mine:
                r.manager_down = r.manager_down or down
            self.watchers.publish(irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED, resource=r)
                                  for r in mine)
