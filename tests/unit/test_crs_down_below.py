"""A CRS (B) following an IRM (I), and a CRS above it (M) following B: while I is down at B, B says its resources
down (PhysicalResource.manager_down) and M keeps them as down. What changes meanwhile at B -- I's reconnect snapshot
pruning a host, or its generations going back (I restarted on a fresh database) -- reaches M too, so that once I
is back nothing stays down at M for good (a review: M kept them down, and answered "retry later" for ever)."""

from __future__ import annotations

import threading

from cross_resource_scheduler.capacity_watch import CapacityWatch
from cross_resource_scheduler.stacking import offered
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2
from tests.conftest import eventually

K = irm_pb2.CapacityEvent


def _host(name: str, generation: int) -> common_pb2.PhysicalResource:
    return common_pb2.PhysicalResource(id=name, resource_type="vm", capacity={"cores": 4}, used={"cores": 0},
                                       generation=generation,
                                       location=common_pb2.Location(site="s", rack="r", host=name))


class _Ctx:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active

    def invocation_metadata(self):  # type: ignore[no-untyped-def]
        return ()

    def peer(self) -> str:
        return "test"


def test_what_changes_below_while_a_manager_is_down_reaches_the_crs_above() -> None:
    at_b, at_m = CapacityView(), CapacityView()
    watch = CapacityWatch(at_b, "")
    events: list[tuple[str, str, int, bool]] = []
    ctx = _Ctx()

    def follow() -> None:        # M following B, as its registry does
        for ev in watch.stream(irm_pb2.WatchCapacityRequest(), ctx):
            ev = offered("B", ev)
            if ev.kind == K.KIND_REMOVED:
                at_m.remove("B", ev.resource.id)
            elif ev.kind in (K.KIND_SNAPSHOT, K.KIND_UPDATED):
                at_m.upsert("B", ev.resource, snapshot=ev.kind == K.KIND_SNAPSHOT)
            events.append((K.Kind.Name(ev.kind), ev.resource.id, ev.resource.generation, ev.resource.manager_down))

    for name in ("h1", "h2"):
        at_b.upsert("I", _host(name, 5), snapshot=True)
    threading.Thread(target=follow, daemon=True).start()
    eventually(lambda: ("KIND_SNAPSHOT_END", "", 0, False) in events, what="M's snapshot of B")

    at_b.set_down("I", True)
    watch.publish_all_of("I", down=True)
    eventually(lambda: all(at_m.node_down(n) for n in at_m.nodes.values()) and len(at_m.nodes) == 2,
               what="I's hosts down at M, kept")
    assert at_m.down_name(at_m.nodes["B/I/h1"]) == "B/I"
    # I comes back on a fresh database without h2: B applies its reconnect snapshot before I's heartbeat.
    at_b.upsert("I", _host("h1", 1), snapshot=True)
    watch.forward("I", K(kind=K.KIND_REMOVED, resource=_host("h1", 5)))     # its generation went back
    watch.forward("I", K(kind=K.KIND_UPDATED, resource=_host("h1", 1)))
    at_b.remove("I", "h2")
    watch.forward("I", K(kind=K.KIND_REMOVED, resource=_host("h2", 5)))     # pruned
    at_b.set_down("I", False)
    watch.publish_all_of("I", down=False)
    eventually(lambda: [n.key for n in at_m.up_nodes()] == ["B/I/h1"], what="h1 up at M, h2 gone")
    assert list(at_m.nodes) == ["B/I/h1"] and at_m.nodes["B/I/h1"].generation == 1
    ctx.active = False
    watch.watchers.close()


def test_an_irms_own_resource_is_never_taken_for_one_down_below() -> None:
    view = CapacityView()
    r = _host("h1", 1)
    r.manager_down = True                       # an IRM has no managers below it: the flag means nothing there
    node = view.upsert("I", r, snapshot=True)
    assert not node.down_below and view.up_nodes() == [node]
