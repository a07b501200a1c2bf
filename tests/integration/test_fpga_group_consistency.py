"""The Orchestrator's database stays the truth about FPGA groups when calls to the FPGA-servers fail half-way.

A resize that one server fails puts the others back; the reconcile rounds set every part to its recorded size and
drop parts a group's row does not have; an Orchestrator that dies while making a group leaves a group whose parts
the database knows; an attach no server takes leaves no client row; and an Orchestrator starts while one of its
servers is down. FPGA-servers are real processes; the Orchestrator is one too where its start-up is the subject,
else it is driven in this process so a failure can be placed between two of its calls.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from harness.v1 import fpga_pb2, fpga_pb2_grpc, irm_pb2
from irm_fpga.models import Client
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig, ServerHandle
from services.errors import Aborted, FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from services.tls import plain_channel
from tests.conftest import eventually, start_again

FAST = {"devices": 4, "reconfig_mean_s": 0.01, "reconfig_std_s": 0.0}
NOWHERE = "127.0.0.1:9"        # nothing answers there: a partition
ROOT = Path(__file__).resolve().parents[2]


def held(address: str) -> dict[str, int]:
    """The parts an FPGA-server holds, asked of it directly: group -> devices."""
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(address))
    return {p.group_id: p.target for p in stub.GetServer(fpga_pb2.GetServerRequest(), timeout=10).groups}


@pytest.fixture
def servers(suite):
    return {name: suite.start("fpga-server", name=name, **FAST) for name in ("A", "B")}


def _orchestrator(servers, db_url: str) -> Orchestrator:  # noqa: ANN001
    o = Orchestrator(OrchestratorConfig(servers=[p.address for p in servers.values()], database=db_url,
                                        autoscaler="none", reconcile_interval_s=0, server_timeout_s=2.0))
    o._discover_servers(strict=True)
    return o


@pytest.fixture
def orch(servers, db_url):
    o = _orchestrator(servers, db_url)
    yield o
    o.stop()


@pytest.fixture
def other_orch(servers, db_url):
    """A second Orchestrator on the same database: what the database's own guards are for (calls within one
    Orchestrator under one client id take turns before they reach it)."""
    o = _orchestrator(servers, db_url)
    yield o
    o.stop()


def test_a_resize_one_server_fails_puts_the_other_servers_back(orch, servers, monkeypatch):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    real_spread = orch._spread

    def placed_then_partitioned(*args, **kwargs):  # noqa: ANN202 - B stops answering once the plan is made
        plan = real_spread(*args, **kwargs)
        orch.servers["B"].address = NOWHERE
        return plan

    monkeypatch.setattr(orch, "_spread", placed_then_partitioned)
    with pytest.raises(Unavailable, match="'B'"):
        orch.resize(g, 7)                      # A: 2 -> 4 done, then B: 0 -> 3 fails
    assert orch._group(g.id).parts == {"A": 2}
    assert held(servers["A"].address) == {g.id: 2}      # not 4: A was put back
    assert held(servers["B"].address) == {}


def test_reconcile_sets_parts_to_their_recorded_size_and_drops_parts_the_row_lacks(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    # Drift of any origin (a put-back that could not reach its server, a resize cut short by a crash).
    a = fpga_pb2_grpc.FpgaServerStub(plain_channel(servers["A"].address))
    a.ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(group_id=g.id, size=4), timeout=10)
    b = fpga_pb2_grpc.FpgaServerStub(plain_channel(servers["B"].address))
    b.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=g.id, design="sleep", size=3), timeout=10)
    assert orch.reconcile_once() == {"made": 1, "dropped": 1}
    assert held(servers["A"].address) == {g.id: 2}
    assert held(servers["B"].address) == {}
    assert orch.reconcile_once() == {"made": 0, "dropped": 0}
    # The devices the drift held are for sale again: 2 + 6 of the 8.
    assert sum(orch.create_group("bob", "h", "sleep", 6).parts.values()) == 6


CRASHING_CHILD = """
import os, sys
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
o = Orchestrator(OrchestratorConfig(servers=[sys.argv[1]], database=sys.argv[2], autoscaler="none",
                                    reconcile_interval_s=0))
o._discover_servers(strict=True)
setattr(o, sys.argv[3], lambda *a, **k: os._exit(9))   # the process dies there (SIGKILL, OOM)
o.create_group("alice", "req-1", "sleep", 3)
"""


@pytest.mark.parametrize("dies_in", ["_publish", "_apply"])   # after the servers made the parts / before
def test_an_orchestrator_that_dies_while_making_a_group_leaves_a_whole_group(suite, db_url, dies_in):
    a = suite.start("fpga-server", name="A", **FAST)
    child = subprocess.run([sys.executable, "-c", CRASHING_CHILD, a.address, db_url, dies_in], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 9, child.stderr
    o = suite.start("fpga", servers=a.address, database=db_url, autoscaler="none", reconcile_interval_s=0,
                    server_timeout_s=2.0)
    stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(o.address))
    (g,) = stub.ListGroups(fpga_pb2.ListGroupsRequest(tenant="alice"), timeout=10).groups
    assert dict(g.parts) == {"A": 3}
    # Serving once the re-made part's devices are configured (`active` counts devices serving now).
    eventually(lambda: [x.active for x in stub.ListGroups(fpga_pb2.ListGroupsRequest(tenant="alice"),
                                                          timeout=10).groups] == [3], what="the group serving")
    assert held(a.address) == {g.id: 3}         # made by the restarted Orchestrator, or found there
    retry = stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id="req-1", design="sleep",
                                                         size=3), timeout=20)
    assert retry.id == g.id and dict(retry.parts) == {"A": 3}
    assert stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="bob", request_id="r", design="sleep", size=1),
                            timeout=20).size == 1                       # the fourth device, and no more
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="bob", request_id="r2", design="sleep", size=1),
                         timeout=20)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_client_id_with_a_nul_is_refused_before_anything_is_stored(orch):
    g = orch.create_group("owner", "g", "sleep", 2, shared=True, pinned=["A"])
    with pytest.raises(InvalidArgument) as e:
        orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="guest", group_id=g.id, client_id="evil\x00id"), None)
    assert [v.field for v in e.value.violations] == ["client_id"]
    assert orch._attached([g.id]) == {}
    # The owner's group still grows onto another server.
    assert orch.resize(orch._group(g.id), 6).parts == {"A": 4, "B": 2}


def test_an_attach_no_server_takes_leaves_no_client(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    h = orch.servers["A"]
    real, h.address = h.address, NOWHERE
    with pytest.raises(Unavailable):
        orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    assert orch._attached([g.id]) == {}         # nothing for the reconcile rounds to attach again
    h.address = real
    att = orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    assert att.client_id == "c1" and [p.server for p in att.parts] == ["A"]



def clients_on(address: str, group_id: str) -> list[str]:
    """The clients an FPGA-server holds attached to its part of `group_id` (asked of it directly)."""
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(address))
    return sorted(c for p in stub.GetServer(fpga_pb2.GetServerRequest(), timeout=10).groups
                  if p.group_id == group_id for c in p.clients)


def test_a_revoke_while_a_resize_adds_a_part_leaves_the_client_on_no_part(orch, servers, monkeypatch):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    reached, go = threading.Event(), threading.Event()
    real = orch.clients._to_servers

    def held_before_the_servers(group, method, client_id):  # noqa: ANN001, ANN202 - a slow revoke
        if method == "RevokeClient":
            reached.set()
            assert go.wait(10)
        return real(group, method, client_id)

    monkeypatch.setattr(orch.clients, "_to_servers", held_before_the_servers)
    revoke = threading.Thread(target=orch.RevokeClient, args=(fpga_pb2.ClientRequest(
        tenant="alice", group_id=g.id, client_id="c1"), None))
    revoke.start()
    assert reached.wait(10)
    assert orch.resize(orch._group(g.id), 6).parts == {"A": 4, "B": 2}       # grows onto B meanwhile
    go.set()
    revoke.join(10)
    assert clients_on(servers["A"].address, g.id) == [] and clients_on(servers["B"].address, g.id) == []


def test_the_rounds_take_off_a_client_revoked_while_its_server_was_silent(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    h = orch.servers["A"]
    real, h.address = h.address, NOWHERE
    with pytest.raises(Unavailable):
        orch.RevokeClient(fpga_pb2.ClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    h.address = real
    assert clients_on(real, g.id) == ["c1"]          # the server never heard of it
    assert orch._attached([g.id]) == {}               # the database says revoked: the rounds make it so
    assert orch.reconcile_once() == {"made": 0, "dropped": 1}
    assert clients_on(real, g.id) == []


def test_an_attach_with_one_server_silent_uses_the_others_and_the_rounds_add_it_there(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 6)
    assert g.parts == {"A": 4, "B": 2}
    h = orch.servers["B"]
    real, h.address = h.address, NOWHERE
    asked: list[str] = []
    real_handle = orch._handle
    orch._handle = lambda name: (asked.append(name), real_handle(name))[1]    # type: ignore[method-assign]
    att = orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    orch._handle = real_handle                                                # type: ignore[method-assign]
    assert [p.server for p in att.parts] == ["A"]     # was UNAVAILABLE for everyone while B was silent
    assert asked.count("B") == 1                      # not asked again under the lock (it held every placement)
    assert clients_on(servers["A"].address, g.id) == ["c1"]
    h.address = real
    assert clients_on(real, g.id) == []
    assert orch.reconcile_once() == {"made": 1, "dropped": 0}
    assert clients_on(real, g.id) == ["c1"]
    again = orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    assert sorted(p.server for p in again.parts) == ["A", "B"]


def test_the_rounds_let_a_detached_client_drain(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 1, pinned=["A"])
    att = orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(servers["A"].address))
    t = fpga_pb2.Task(id=1)
    t.params["duration"].number = 3.0
    out: list = []
    run = threading.Thread(target=lambda: out.append(stub.RunBatch(fpga_pb2.TaskBatch(
        client_id="c1", group_id=g.id, token=att.token, tasks=[t]), timeout=30)))
    run.start()
    eventually(lambda: any(d.state == fpga_pb2.DeviceInfo.STATE_BUSY for d in stub.GetServer(
        fpga_pb2.GetServerRequest(), timeout=10).devices), what="the task running")
    orch.DetachClient(fpga_pb2.ClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    assert clients_on(servers["A"].address, g.id) == ["c1"]      # draining: listed until its task ends
    assert orch.reconcile_once() == {"made": 0, "dropped": 0}
    run.join(30)
    assert out and out[0].results[0].error == ""                 # not revoked by the round: it ran to its end


def test_a_refresh_that_read_the_client_attached_does_not_undo_a_revoke(orch, servers, monkeypatch):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    request = fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1")
    orch.AttachClient(request, None)
    reached, go = threading.Event(), threading.Event()
    real_handle = orch._handle

    def paused(name: str):  # noqa: ANN202 - the refresh has read the row "attached", not yet asked the servers
        if threading.current_thread().name == "refresh" and not reached.is_set():
            reached.set()
            assert go.wait(10)
        return real_handle(name)

    monkeypatch.setattr(orch, "_handle", paused)
    out: list = []

    def refresh() -> None:
        try:
            out.append(orch.AttachClient(request, None))
        except Exception as e:  # noqa: BLE001 - asserted below
            out.append(e)

    t = threading.Thread(target=refresh, name="refresh")
    t.start()
    assert reached.wait(10)
    orch.RevokeClient(fpga_pb2.ClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    go.set()
    t.join(10)
    assert isinstance(out[0], FailedPrecondition) and "revoked" in str(out[0])
    assert clients_on(servers["A"].address, g.id) == []


def test_a_revoke_a_silent_server_holds_up_is_done_on_the_others_and_names_it(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 6)
    assert g.parts == {"A": 4, "B": 2}
    orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    h = orch.servers["A"]
    real, h.address = h.address, NOWHERE
    with pytest.raises(Unavailable, match="'A'") as e:
        orch.RevokeClient(fpga_pb2.ClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    assert "done on B" in str(e.value)
    assert clients_on(servers["B"].address, g.id) == []          # not left to the rounds behind a silent server
    h.address = real

def _race(orch, other, monkeypatch, first: fpga_pb2.AttachClientRequest,  # noqa: ANN001, ANN202
          second: fpga_pb2.AttachClientRequest):
    """`second` is attached by `other`, and `first` by `orch`, whose insert the other call's lands just before
    (both found no client): (what `first` returned or raised, what `second` returned)."""
    real_transact = orch.db.transact
    theirs: list[object] = []

    def the_other_call_writes_first(fn):  # noqa: ANN001, ANN202
        if not theirs:
            theirs.append(None)
            t = threading.Thread(target=lambda: theirs.append(other.AttachClient(second, None)))
            t.start()
            t.join()
        return real_transact(fn)

    monkeypatch.setattr(orch.db, "transact", the_other_call_writes_first)
    try:
        mine: object = orch.AttachClient(first, None)
    except Exception as e:  # noqa: BLE001 - the outcome is what is checked
        mine = e
    monkeypatch.undo()
    return mine, theirs[1]


def test_concurrent_attaches_under_one_client_id_get_one_client(orch, other_orch, monkeypatch):
    g = orch.create_group("alice", "g", "sleep", 1, shared=True)
    request = fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1")
    mine, theirs = _race(orch, other_orch, monkeypatch, request, request)
    assert isinstance(mine, fpga_pb2.Attachment), mine
    assert mine.token == theirs.token and mine.client_id == "c1" and len(mine.parts) == 1
    with orch.db.read() as s:
        assert [c.id for c in s.scalars(select(Client))] == ["c1"]
    # Another tenant racing for an id is refused as if it had come second.
    mallory = fpga_pb2.AttachClientRequest(tenant="mallory", group_id=g.id, client_id="c2")
    mine, theirs = _race(orch, other_orch, monkeypatch, mallory, fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id,
                                                                                   client_id="c2"))
    assert isinstance(mine, PermissionDenied), mine
    assert orch._attached([g.id]) == {g.id: ["c1", "c2"]}


def test_a_retry_that_comes_while_the_first_attach_fails_is_attached(orch, servers, monkeypatch):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    request = fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1")
    real_handle, real_hold = orch._handle, getattr(orch.clients, "_attach_lock", None)
    retry: list[object] = []
    waiting = threading.Event()       # the retry is waiting for its turn, or (without turns) has finished

    def retry_arrives_then_this_server_fails(name: str):  # noqa: ANN202
        if threading.current_thread() is not threading.main_thread():
            return real_handle(name)
        if not retry:
            t = threading.Thread(target=lambda: (retry.append(orch.AttachClient(request, None)), waiting.set()))
            retry.append(t)
            t.start()
            assert waiting.wait(10)
        return type(real_handle(name))(name=name, address=NOWHERE)   # the first call's server does not answer

    def turn(client_id: str):  # noqa: ANN202
        if threading.current_thread() is not threading.main_thread():
            waiting.set()
        return real_hold(client_id)

    monkeypatch.setattr(orch, "_handle", retry_arrives_then_this_server_fails)
    monkeypatch.setattr(orch.clients, "_attach_lock", turn, raising=False)   # (absent: calls do not take turns)
    with pytest.raises(Unavailable):
        orch.AttachClient(request, None)
    retry[0].join(10)
    att = retry[1]
    assert isinstance(att, fpga_pb2.Attachment) and [p.server for p in att.parts] == ["A"]
    # The retry's client is the one the database and the server hold: the failing first call did not take it back.
    assert orch._attached([g.id]) == {g.id: ["c1"]}
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(servers["A"].address))
    parts = stub.GetServer(fpga_pb2.GetServerRequest(), timeout=10).groups
    assert [list(p.clients) for p in parts if p.group_id == g.id] == [["c1"]]


def test_a_retry_through_another_orchestrator_while_the_first_attach_fails_is_told_to_retry(orch, other_orch,
                                                                                               servers, monkeypatch):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    request = fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1")
    real_handle = orch._handle
    meanwhile: list[object] = []

    def the_retry_comes_then_this_server_fails(name: str):  # noqa: ANN202
        try:
            meanwhile.append(other_orch.AttachClient(request, None))
        except Exception as e:  # noqa: BLE001 - the outcome is what is checked
            meanwhile.append(e)
        return type(real_handle(name))(name=name, address=NOWHERE)

    monkeypatch.setattr(orch, "_handle", the_retry_comes_then_this_server_fails)
    with pytest.raises(Unavailable):
        orch.AttachClient(request, None)
    monkeypatch.undo()
    # Not "attached" while the first call could still fail and take the client back: retry.
    assert isinstance(meanwhile[0], Aborted), meanwhile[0]
    assert orch._attached([g.id]) == {}
    att = other_orch.AttachClient(request, None)
    assert [p.server for p in att.parts] == ["A"]
    assert orch._attached([g.id]) == {g.id: ["c1"]}
    parts = fpga_pb2_grpc.FpgaServerStub(plain_channel(servers["A"].address)).GetServer(
        fpga_pb2.GetServerRequest(), timeout=10).groups
    assert [list(p.clients) for p in parts if p.group_id == g.id] == [["c1"]]


def test_an_attach_cut_short_by_a_crash_is_taken_back_at_start(orch, servers):
    g = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
    orch.db.transact(lambda s: s.add(Client(id="c1", group_id=g.id, tenant="alice", token="t" * 32,
                                            state="attaching")))
    with pytest.raises(Aborted):            # while its row says a call is attaching it
        orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    orch._reassert()                        # what a restarted Orchestrator does first
    with orch.db.read() as s:
        assert s.get(Client, "c1") is None
    att = orch.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id, client_id="c1"), None)
    assert att.client_id == "c1" and orch._attached([g.id]) == {g.id: ["c1"]}


def test_a_silent_unmapped_server_is_not_asked_again_at_every_placement(servers, db_url, monkeypatch):
    silent = "10.255.255.1:50081"            # the host drops packets: each try costs a whole timeout
    o = Orchestrator(OrchestratorConfig(servers=[servers["A"].address, silent], database=db_url, autoscaler="none",
                                        reconcile_interval_s=0, server_timeout_s=2.0))
    asked: list[str] = []
    real_stub = ServerHandle.stub

    def stub(self):  # type: ignore[no-untyped-def]
        if self.address != silent:
            return real_stub(self)
        asked.append(self.address)

        class Silent:
            def GetServer(self, request, timeout):  # type: ignore[no-untyped-def]  # noqa: N802
                raise _Timeout()
        return Silent()

    class _Timeout(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.DEADLINE_EXCEEDED

    monkeypatch.setattr(ServerHandle, "stub", stub)
    try:
        o._discover_servers(strict=True)
        for _ in range(3):                   # placements and listings, one after another
            assert set(o._server_infos()) == {"A"}
        assert asked == [silent]             # once, at start: not under every placement's lock again
        o._silent_until[silent] = 0.0        # its wait is over
        o._server_infos()
        assert asked == [silent, silent]
    finally:
        o.stop()


def test_a_reservation_larger_than_the_cluster_names_the_group_and_its_devices(orch):
    def group(name: str, devices: int) -> irm_pb2.ResourceGroup:
        g = irm_pb2.ResourceGroup(name=name, resource_type="vfpga", count=1)
        g.attributes["design"].text = "sleep"
        g.attributes["devices"].number = devices
        return g

    with pytest.raises(InvalidArgument) as e:
        orch.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[group("small", 1),
                                                                                 group("big", 9)]), None)
    assert [v.field for v in e.value.violations] == ["groups[1].attributes[devices]"]
    assert "'big'" in e.value.violations[0].description and "8" in e.value.violations[0].description
    assert orch._find_reservation("t", "r") is None     # nothing claimed: a corrected retry may use the id


def test_a_retried_reservation_is_answered_whatever_the_servers_state_and_a_down_server_is_no_bad_request(
        orch, servers):
    g = irm_pb2.ResourceGroup(name="v", resource_type="vfpga", count=1)
    g.attributes["design"].text = "sleep"
    g.attributes["devices"].number = 6              # more than one server's 4: needs both
    made = orch.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[g]), None)
    servers["B"].stop()
    # The retry of a request already made gets it back (the capacity check came first: INVALID_ARGUMENT).
    again = orch.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[g]), None)
    assert again.id == made.id and again.state == made.state
    # A new request short only of the server that is down now: retry later, not "your request is wrong".
    with pytest.raises(Unavailable, match="1 of the 2 FPGA-servers answer"):
        orch.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[g]), None)


@pytest.mark.parametrize("reconcile_s", [0.2, 0.0])     # 0: no reconcile rounds; placements map it
def test_an_orchestrator_starts_with_a_server_down_and_uses_it_once_it_answers(suite, reconcile_s: float):
    a = suite.start("fpga-server", name="A", **FAST)
    b = suite.start("fpga-server", name="B", **FAST)
    b_address = b.address
    b.stop()
    o = suite.start("fpga", servers=f"{a.address},{b_address}", autoscaler="none", reconcile_interval_s=reconcile_s,
                    server_timeout_s=1.0)
    stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(o.address))
    g = stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id="g1", design="sleep", size=2),
                         timeout=20)
    assert dict(g.parts) == {"A": 2}
    start_again(lambda: suite.start("fpga-server", name="B", address=b_address, **FAST), "FPGA-server B")

    if reconcile_s > 0:       # mapped by a reconcile round (else the placement below must map it itself)
        eventually(lambda: "B" in {s.name for s in stub.ListDevices(fpga_pb2.ListDevicesRequest(tenant="t"),
                                                                     timeout=10).servers},
                   what="the Orchestrator to map FPGA-server B")
    grown = stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id="g2", design="sleep", size=6),
                             timeout=20)
    assert dict(grown.parts) == {"A": 2, "B": 4}


def test_a_group_made_while_a_reconcile_round_reads_the_servers_is_no_drift(orch, servers, monkeypatch):
    # The round reads the servers before taking the lock (a silent one must not stall placements); a group made
    # in between looked missing from its server: made again, and the operator warned of drift that was none.
    real = orch._server_infos
    made: list = []

    def read_then_a_group_is_made():  # noqa: ANN202
        infos = real()
        if not made:
            made.append(None)                   # once (making the group reads the servers too)
            made[0] = orch.create_group("alice", "g", "sleep", 2, pinned=["A"])
        return infos

    monkeypatch.setattr(orch, "_server_infos", read_then_a_group_is_made)
    assert orch.reconcile_once() == {"made": 0, "dropped": 0}
    assert held(servers["A"].address) == {made[0].id: 2}
