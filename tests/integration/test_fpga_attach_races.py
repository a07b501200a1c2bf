"""AttachClient racing a resize or a delete of its group (irm_fpga.orchestrator_clients.ClientAttachments.attach): the client ends up on
every part the group has when the attach completes, and an attach to a group deleted meanwhile is refused and
taken back. In-process FPGA-servers and Orchestrator; the attach is paused after its first server took it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from irm_fpga import server as fsrv
from irm_fpga.models import Client
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services import client as rpc
from services import server as srv
from services.errors import HarnessError, NotFound


@pytest.fixture
def orch(tmp_path) -> Iterator[Orchestrator]:
    running = [srv.start("127.0.0.1:0", [fsrv.component(fsrv.FpgaServerConfig(
        name=f"s{i}", devices=1, reconfig_mean_s=0.0, reconfig_std_s=0.0))]) for i in range(2)]
    addresses = [f"127.0.0.1:{r.port}" for r in running]
    o = Orchestrator(OrchestratorConfig(database=f"sqlite:///{tmp_path}/o.db", servers=addresses,
                                        autoscaler="none", reconcile_interval_s=0, server_backoff_s=0))
    o._discover_servers(strict=True)
    yield o
    o.stop()
    for r, a in zip(running, addresses, strict=True):
        r.stop(0)
        rpc.drop(a)


def paused_attach(o: Orchestrator, group_id: str) -> tuple[threading.Thread, dict, threading.Event]:
    """AttachClient of client "c" to `group_id`, stopped right after the first server took it."""
    reached, go = threading.Event(), threading.Event()
    handle = o._handle

    class Stub:
        def __init__(self, real):  # type: ignore[no-untyped-def]
            self.real = real

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(self.real, name)

        def AttachClient(self, *a, **kw):  # type: ignore[no-untyped-def]  # noqa: N802
            out = self.real.AttachClient(*a, **kw)
            if threading.current_thread().name == "attacher" and not reached.is_set():
                reached.set()
                assert go.wait(10)
            return out

    class Handle:
        def __init__(self, real):  # type: ignore[no-untyped-def]
            self.real, self.name, self.address = real, real.name, real.address

        def stub(self):  # type: ignore[no-untyped-def]
            return Stub(self.real.stub())

    o._handle = lambda name: Handle(handle(name))                  # type: ignore[method-assign]
    box: dict = {}

    def call() -> None:
        try:
            box["attachment"] = o._attach("alice", o._group(group_id), "c")
        except HarnessError as e:
            box["error"] = e

    t = threading.Thread(target=call, name="attacher")
    t.start()
    assert reached.wait(10)
    return t, box, go


def clients_on(o: Orchestrator, group_id: str) -> dict[str, list[str]]:
    return {name: list(p.clients) for name, info in o._server_infos().items() for p in info.groups
            if p.group_id == group_id}


def test_an_attach_racing_a_resize_onto_a_new_server_is_on_the_new_part_too(orch) -> None:
    g = orch.create_group("alice", "r1", "sleep", 1, max_size=2)
    t, box, go = paused_attach(orch, g.id)
    orch.resize(orch._group(g.id), 2)                             # a part on the other server, meanwhile
    go.set()
    t.join(10)
    attachment = box["attachment"]
    assert sorted(p.server for p in attachment.parts) == ["s0", "s1"]
    assert clients_on(orch, g.id) == {"s0": ["c"], "s1": ["c"]}


def test_an_attach_racing_a_delete_of_its_group_is_refused_and_taken_back(orch) -> None:
    g = orch.create_group("alice", "r1", "sleep", 1)
    t, box, go = paused_attach(orch, g.id)
    orch.delete(orch._group(g.id))
    go.set()
    t.join(10)
    assert "attachment" not in box and isinstance(box["error"], NotFound), box
    with orch.db.read() as s:
        assert s.get(Client, "c") is None                           # no client row left for a deleted group
