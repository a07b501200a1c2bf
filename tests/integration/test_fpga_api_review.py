"""The FPGA APIs: what one tenant sees of others, paging, precise bad-request statuses (a BadRequest naming the
field), and the cap on WatchCapacity streams. Over gRPC between processes first; then the FPGA-server's handlers
and the Orchestrator's ListReservations in-process, for the cases a process cannot set up (ties in creation time)
or that are many (every way a task's parameters can be wrong)."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator

import grpc
import pytest

from harness.v1 import common_pb2, fpga_pb2, fpga_pb2_grpc, irm_pb2, irm_pb2_grpc
from irm_fpga.models import Reservation
from irm_fpga.orchestrator import MAX_WATCHES, Orchestrator, OrchestratorConfig
from irm_fpga.server import FpgaServerConfig, FpgaServerService
from services import errors
from services.clock import VirtualClock
from services.errors import InvalidArgument, field_violations
from services.tls import plain_channel
from tests.conftest import Suite, eventually

FAST = {"reconfig_mean_s": 0.05, "reconfig_std_s": 0.0}
_ids = itertools.count()


@pytest.fixture(scope="module")
def fpga(tmp_path_factory):
    suite = Suite(str(tmp_path_factory.mktemp("fpga-review")))
    try:
        server = suite.start("fpga-server", name="fpga-0", devices=4, **FAST)
        orch = suite.start("fpga", servers=server.address, autoscaler="none")
        yield {
            "orch": fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address)),
            "irm": irm_pb2_grpc.ResourceManagerStub(plain_channel(orch.address)),
            "server": fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address)),
        }
    finally:
        suite.stop_all()


def create(stub, tenant: str, size: int = 1, **kw) -> fpga_pb2.FpgaGroup:
    return stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant=tenant, request_id=f"{tenant}-{next(_ids)}",
                                                        design=kw.pop("design", "sleep"), size=size, **kw), timeout=30)


def attach(stub, tenant: str, group_id: str) -> fpga_pb2.Attachment:
    return stub.AttachClient(fpga_pb2.AttachClientRequest(tenant=tenant, group_id=group_id), timeout=30)


def refused(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=30)
    return e.value


def test_list_devices_shows_a_tenant_its_own_groups_and_clients_and_others_only_as_devices_in_use(fpga):
    orch = fpga["orch"]
    private = create(orch, "alice")
    shared = create(orch, "alice", sharing=fpga_pb2.FpgaGroup.SHARING_SHARED)
    bobs = create(orch, "bob", size=2)
    a1, a2 = attach(orch, "alice", private.id), attach(orch, "alice", shared.id)
    b1, b2 = attach(orch, "bob", bobs.id), attach(orch, "bob", shared.id)
    try:
        def view(tenant):
            return orch.ListDevices(fpga_pb2.ListDevicesRequest(tenant=tenant), timeout=30)

        # A stranger sees all four devices, all of them taken, and not one group or client id.
        stranger = view("mallory")
        wire = stranger.SerializeToString()
        for secret in (private.id, shared.id, bobs.id, a1.client_id, a2.client_id, b1.client_id, b2.client_id):
            assert secret.encode() not in wire, secret
        (srv,) = stranger.servers
        assert len(srv.devices) == 4
        assert [(p.group_id, list(p.clients), p.target) for p in srv.groups] == [("", [], 4)]

        # The owner sees her groups with every client of them (she may revoke any); bob's group only as devices.
        alice = view("alice").servers[0]
        parts = {p.group_id: set(p.clients) for p in alice.groups}
        assert parts == {private.id: {a1.client_id}, shared.id: {a2.client_id, b2.client_id}, "": set()}
        assert next(p.target for p in alice.groups if not p.group_id) == 2
        assert bobs.id.encode() not in alice.SerializeToString()
        assert b1.client_id.encode() not in alice.SerializeToString()
        eventually(lambda: {d.group_id for d in view("alice").servers[0].devices} == {private.id, shared.id, ""},
                   what="alice's devices carrying her group ids")

        # A guest of alice's shared group sees that group, but only his own client in it.
        bob = view("bob").servers[0]
        parts = {p.group_id: set(p.clients) for p in bob.groups}
        assert parts == {bobs.id: {b1.client_id}, shared.id: {b2.client_id}, "": set()}
        assert next(p.target for p in bob.groups if not p.group_id) == 1
        assert private.id.encode() not in bob.SerializeToString()
        assert a2.client_id.encode() not in bob.SerializeToString()

        e = refused(orch.ListDevices, fpga_pb2.ListDevicesRequest())
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and [f for f, _ in field_violations(e)] == ["tenant"]
    finally:
        for tenant, g in (("alice", private), ("alice", shared), ("bob", bobs)):
            orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant=tenant, group_id=g.id), timeout=30)


def vfpga(name: str = "f") -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vfpga", count=1, attributes={
        "devices": common_pb2.AttributeRequest(number=1), "design": common_pb2.AttributeRequest(text="sleep")})


def test_list_reservations_pages_by_page_size_and_token(fpga):
    irm = fpga["irm"]
    made = []
    for i in range(5):
        r = irm.Reserve(irm_pb2.ReserveRequest(tenant="pager", request_id=f"pg-{i}", groups=[vfpga()]), timeout=60)
        made.append(r.id)
        if i % 2 == 0:  # 0, 2, 4 released; 1 and 3 stay active
            irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="pager", reservation_id=r.id), timeout=30)
    try:
        def pages(page_size, include_released):
            out, token = [], ""
            while True:
                page = irm.ListReservations(irm_pb2.ListReservationsRequest(
                    tenant="pager", include_released=include_released, page_size=page_size, page_token=token),
                    timeout=30)
                out.append([r.id for r in page.reservations])
                token = page.next_page_token
                if not token:
                    return out

        assert pages(2, True) == [made[0:2], made[2:4], made[4:5]]        # in the order they were made
        assert pages(1, False) == [[made[1]], [made[3]]]
        assert pages(0, True) == [made]                                   # 0: the default page (100)
        assert pages(5000, True) == [made]                                # above the maximum: the maximum

        for token in ("not-a-token!!", base64.urlsafe_b64encode(b"anything-I-like").decode()):
            e = refused(irm.ListReservations, irm_pb2.ListReservationsRequest(tenant="pager", page_token=token))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert [f for f, _ in field_violations(e)] == ["page_token"]
        e = refused(irm.ListReservations, irm_pb2.ListReservationsRequest(tenant="pager", page_size=-1))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and [f for f, _ in field_violations(e)] == ["page_size"]
    finally:
        for rid in (made[1], made[3]):
            irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="pager", reservation_id=rid), timeout=30)


def test_unknown_sharing_and_scaling_are_refused_naming_both(fpga):
    orch = fpga["orch"]
    e = refused(orch.CreateGroup, fpga_pb2.CreateGroupRequest(tenant="enum", request_id="e-1", design="sleep",
                                                               size=1, sharing=7, scaling=9))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = dict(field_violations(e))
    assert set(got) == {"sharing", "scaling"}
    assert "7" in got["sharing"] and "SHARING_SHARED" in got["sharing"]
    assert "9" in got["scaling"] and "SCALING_ELASTIC" in got["scaling"]
    assert not orch.ListGroups(fpga_pb2.ListGroupsRequest(tenant="enum"), timeout=30).groups
    # The documented meaning of the unspecified value stays: private and static.
    g = create(orch, "enum")
    try:
        assert (g.sharing, g.scaling) == (fpga_pb2.FpgaGroup.SHARING_PRIVATE, fpga_pb2.FpgaGroup.SCALING_STATIC)
    finally:
        orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="enum", group_id=g.id), timeout=30)


def test_fpga_server_bad_requests_name_the_field_on_the_wire(fpga):
    orch, server = fpga["orch"], fpga["server"]
    g = create(orch, "bq", design="black_scholes")
    att = attach(orch, "bq", g.id)
    try:
        def run(*tasks, **kw):
            return refused(server.RunBatch, fpga_pb2.TaskBatch(client_id=att.client_id, group_id=g.id,
                                                               token=att.token, tasks=tasks, **kw))

        good = {"strike": 100.0, "rate": 0.01, "volatility": 0.2, "maturity": 1.0}
        params = {k: fpga_pb2.Value(number=v) for k, v in good.items()}
        cases = [
            (run(fpga_pb2.Task(id=1, params={**params, "spot": fpga_pb2.Value(number=1), "bogus": fpga_pb2.Value(
                number=1)})), ["tasks[0].params.bogus"]),
            (run(fpga_pb2.Task(id=1, params={k: v for k, v in params.items() if k != "rate"}
                               | {"spot": fpga_pb2.Value(number=1)})), ["tasks[0].params.rate"]),
            (run(fpga_pb2.Task(id=1, params={**params, "spot": fpga_pb2.Value(number=1)}),
                 fpga_pb2.Task(id=2, params={**params, "spot": fpga_pb2.Value(text="x")})), ["tasks[1].params.spot"]),
            (run(fpga_pb2.Task(id=1, kind=9)), ["tasks[0].kind"]),
        ]
        for e, fields in cases:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
            assert [f for f, _ in field_violations(e)] == fields, e.details()
        e = refused(server.CreateGroupPart, fpga_pb2.CreateGroupPartRequest(group_id="zz", design="sleep", size=-3))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and [f for f, _ in field_violations(e)] == ["size"]
    finally:
        orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="bq", group_id=g.id), timeout=30)


def test_watch_capacity_streams_are_capped_and_the_server_keeps_answering(fpga):
    irm = fpga["irm"]

    def watch(tenant: str = "late"):
        """A stream that has delivered its first event (so it holds a slot), or the error that refused it."""
        stream = irm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=tenant))
        try:
            first = next(stream)
        except grpc.RpcError as e:
            return None, e
        assert first.kind in (irm_pb2.CapacityEvent.KIND_SNAPSHOT, irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)
        return stream, None

    open_ = []
    try:
        for i in range(MAX_WATCHES):
            stream, error = watch(f"t{i}")       # tenants of their own: one may hold 2 of them
            assert error is None, error
            open_.append(stream)
        _, error = watch()
        assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "WatchCapacity" in error.details()
        assert errors.error_info(error)[0] == "STREAM_CAP"     # machine-readable, as every service's stream cap
        # The workers the streams do not hold still answer everything else.
        spec = irm.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(), timeout=5)
        assert [t.name for t in spec.resource_types] == ["vfpga"]
        # A stream that ends gives its slot back (once its handler sees the cancellation).
        open_.pop().cancel()

        def reopened():
            stream, error = watch()
            if stream is not None:
                open_.append(stream)
                return True
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            return False
        eventually(reopened, timeout=20, what="a slot freed by the cancelled stream")
        assert len(open_) == MAX_WATCHES
    finally:
        for stream in open_:
            stream.cancel()


# -- in-process ----------------------------------------------------------------------------------------------


class Ctx:
    """The bits of a grpc.ServicerContext the handlers use."""

    def time_remaining(self) -> float:
        return 10.0

    def is_active(self) -> bool:
        return True


@pytest.fixture
def svc() -> Iterator[FpgaServerService]:
    s = FpgaServerService(FpgaServerConfig(name="fpga-t", devices=4, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    s.start()
    try:
        yield s
    finally:
        s.stop()


def part(s: FpgaServerService, design: str) -> None:
    """Group part "g" of one device, client "c" attached with token "tok"."""
    s.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="g", design=design, size=1), None)
    s.AttachClient(fpga_pb2.ServerAttachRequest(group_id="g", client_id="c", token="tok"), None)
    eventually(lambda: s.engine.group_info("g").size == 1, timeout=5)


def numbers(**kw: float) -> dict[str, fpga_pb2.Value]:
    return {k: fpga_pb2.Value(number=v) for k, v in kw.items()}


BS = {"spot": 100.0, "strike": 100.0, "rate": 0.01, "volatility": 0.2, "maturity": 1.0}


def task_violations(s: FpgaServerService, *tasks: fpga_pb2.Task, **kw) -> list[str]:
    batch = fpga_pb2.TaskBatch(client_id="c", group_id="g", token="tok", tasks=tasks, **kw)
    with pytest.raises(InvalidArgument) as e:
        s.RunBatch(batch, Ctx())
    assert s.engine.queue_lengths("c") == [0] * 4  # refused whole: nothing queued
    return [v.field for v in e.value.violations]


def test_run_batch_parameter_errors_name_the_parameter_where_the_batch_carried_it(svc: FpgaServerService) -> None:
    part(svc, "black_scholes")
    rest = {k: v for k, v in BS.items() if k != "spot"}
    no_rate = {k: v for k, v in rest.items() if k != "rate"}
    text_spot = {**numbers(**rest), "spot": fpga_pb2.Value(text="x")}
    assert task_violations(svc, fpga_pb2.Task(id=1, params=numbers(**BS, bogus=1.0, other=2.0))) == [
        "tasks[0].params.bogus", "tasks[0].params.other"]
    assert task_violations(svc, fpga_pb2.Task(id=1)) == [f"tasks[0].params.{k}" for k in BS]
    assert task_violations(svc, fpga_pb2.Task(id=1, params=text_spot)) == ["tasks[0].params.spot"]
    assert task_violations(svc, fpga_pb2.Task(id=1, params=numbers(**BS)),
                           fpga_pb2.Task(id=2, params=numbers(**rest, spot=-1.0))) == ["tasks[1].params.spot"]
    # A parameter the batch shares is named where it was given; a missing one where the task should give it.
    assert task_violations(svc, fpga_pb2.Task(id=1, params=numbers(**rest)),
                           shared_params={"spot": fpga_pb2.Value(flag=True)}) == ["shared_params.spot"]
    assert task_violations(svc, fpga_pb2.Task(id=1, params=numbers(**no_rate)),
                           shared_params=numbers(spot=1.0)) == ["tasks[0].params.rate"]
    # A malformed array: the wire names the map entry.
    bad = fpga_pb2.Task(id=1, params=numbers(**rest))
    bad.params["spot"].array.dtype, bad.params["spot"].array.data = "<f8", b"xyz"
    assert task_violations(svc, bad) == ["tasks[0].params.spot"]


def test_unknown_task_kinds_are_refused_naming_the_field_and_the_kinds(svc: FpgaServerService) -> None:
    part(svc, "sleep")
    ok = fpga_pb2.Task(id=1, params=numbers(duration=0.001))
    batch = fpga_pb2.TaskBatch(client_id="c", group_id="g", token="tok", tasks=[fpga_pb2.Task(id=1, kind=9)])
    with pytest.raises(InvalidArgument) as e:
        svc.RunBatch(batch, Ctx())
    ((field, description),) = [(v.field, v.description) for v in e.value.violations]
    assert field == "tasks[0].kind"
    assert "9" in description and all(k in description for k in ("KIND_RUN", "KIND_LOCK", "KIND_UNLOCK"))
    unknown = fpga_pb2.Task(id=2, kind=-1, params=numbers(duration=0.001))
    assert task_violations(svc, ok, unknown) == ["tasks[1].kind"]
    with pytest.raises(InvalidArgument) as e:
        svc.RunDirect(fpga_pb2.RunDirectRequest(device=3, design="sleep", task=fpga_pb2.Task(id=1, kind=7)), Ctx())
    assert [v.field for v in e.value.violations] == ["task.kind"]
    # The documented default still runs: KIND_UNSPECIFIED is KIND_RUN.
    (r,) = svc.RunBatch(fpga_pb2.TaskBatch(client_id="c", group_id="g", token="tok", tasks=[ok]), Ctx()).results
    assert (r.error, r.kind) == ("", fpga_pb2.Task.KIND_RUN)


def test_control_plane_and_direct_errors_name_their_field(svc: FpgaServerService) -> None:
    for size in (-3, 5):
        with pytest.raises(InvalidArgument) as e:
            svc.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="g", design="sleep", size=size), None)
        assert [v.field for v in e.value.violations] == ["size"] and str(size) in str(e.value)
    part(svc, "sleep")
    with pytest.raises(InvalidArgument) as e:
        svc.ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(group_id="g", size=-1), None)
    assert [v.field for v in e.value.violations] == ["size"]
    with pytest.raises(InvalidArgument) as e:
        svc.RunDirect(fpga_pb2.RunDirectRequest(device=3, design="sleep",
                                                task=fpga_pb2.Task(id=1, params=numbers(duration=-1.0))), Ctx())
    assert [v.field for v in e.value.violations] == ["task.params.duration"]


@pytest.fixture(params=["sqlite", "postgresql"])
def orch(request, tmp_path) -> Iterator[Orchestrator]:
    url = f"sqlite:///{tmp_path / 'o.db'}" if request.param == "sqlite" else request.getfixturevalue("fresh_pg_url")
    o = Orchestrator(OrchestratorConfig(database=url, servers=[], autoscaler="none"), VirtualClock(0.0))
    try:
        yield o
    finally:
        o.db.engine.dispose()


def test_list_reservations_pages_through_reservations_made_at_the_same_time(orch: Orchestrator) -> None:
    # Ten reservations made at one instant, two at a later one: page boundaries fall inside the tie.
    times = [1.5] * 10 + [2.25] * 2
    ids = [f"fres-{i:02d}" for i in range(len(times))]

    def add(s) -> None:  # type: ignore[no-untyped-def]
        for rid, at in zip(ids, times, strict=True):
            s.add(Reservation(id=rid, tenant="t", request_id=rid, state="active", price_per_minute=0.0,
                              created_at=at, released_at=0.0, groups=[]))
        s.add(Reservation(id="fres-other", tenant="u", request_id="x", state="active", price_per_minute=0.0,
                          created_at=1.5, released_at=0.0, groups=[]))
    orch.db.transact(add)
    seen, token, pages = [], "", 0
    while True:
        page = orch.ListReservations(irm_pb2.ListReservationsRequest(tenant="t", page_size=3, page_token=token), None)
        assert len(page.reservations) <= 3
        seen += [r.id for r in page.reservations]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == ids and pages == 4
