"""The shared server bootstrap: error mapping, health, reflection, diagnostics
(services.server, services.errors), against a real in-process gRPC server."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from harness.v1 import common_pb2, diagnostics_pb2, diagnostics_pb2_grpc, irm_pb2, irm_pb2_grpc
from services import errors
from services.errors import FieldViolation, InvalidArgument, NotFound, Violations
from services.server import Component, Running, start
from services.tls import plain_channel

RM = irm_pb2.DESCRIPTOR.services_by_name["ResourceManager"].full_name
DIAG = diagnostics_pb2.DESCRIPTOR.services_by_name["Diagnostics"].full_name
SECRET = "password=hunter2 at /srv/secret/path.py"
TIMEOUT = 10.0

DOMAIN = {
    "invalid": errors.InvalidArgument("bad", [FieldViolation("groups[0].count", "must be >= 1")]),
    "not_found": errors.NotFound("reservation 'r1' does not exist"),
    "exhausted": errors.ResourceExhausted("no room"),
    "precondition": errors.FailedPrecondition("never fits"),
    "aborted": errors.Aborted("concurrent update"),
    "denied": errors.PermissionDenied("not yours"),
    "unavailable": errors.Unavailable("irm down"),
}
CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "aborted": grpc.StatusCode.ABORTED,
    "denied": grpc.StatusCode.PERMISSION_DENIED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
}


class FailingIrm(irm_pb2_grpc.ResourceManagerServicer):
    """Each method fails in one particular way."""

    def Reserve(self, request, context):  # noqa: N802
        v = Violations()
        v.add("request_id", "required: a client-chosen idempotency key")
        v.check(len(request.groups) > 0, "groups", "at least one group is required")
        v.check(True, "tenant", "never reported")
        v.raise_if_any()
        return irm_pb2.Reservation(id="never")

    def GetReservation(self, request, context):  # noqa: N802
        if request.reservation_id == "ok":
            return irm_pb2.Reservation(id="ok", tenant=request.tenant)
        raise NotFound(f"reservation {request.reservation_id!r} does not exist")

    def ReleaseReservation(self, request, context):  # noqa: N802
        raise RuntimeError(SECRET)

    def QuotePrice(self, request, context):  # noqa: N802
        raise DOMAIN[request.tenant]

    def ListReservations(self, request, context):  # noqa: N802
        {}["missing key " + SECRET]  # a plain bug: KeyError
        return irm_pb2.ListReservationsResponse()

    def DiscoverResources(self, request, context):  # noqa: N802
        # A handler that aborts on purpose keeps its own status.
        context.abort(grpc.StatusCode.OUT_OF_RANGE, "deliberate abort")

    def GetMetrics(self, request, context):  # noqa: N802
        raise InvalidArgument.of("since", "must be >= 0")

    def WatchCapacity(self, request, context):  # noqa: N802
        for i in range(2):
            yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED,
                                        resource=common_pb2.PhysicalResource(id=f"h{i}"))
        if request.resource_type == "domain":
            raise NotFound("the watched type went away")
        if request.resource_type == "invalid":
            raise InvalidArgument.of("resource_type", "unknown type")
        raise RuntimeError(SECRET)


class Server:
    def __init__(self, running: Running, hooks: list[str]) -> None:
        self.running = running
        self.hooks = hooks
        self.channel = plain_channel(f"127.0.0.1:{running.port}")
        self.irm = irm_pb2_grpc.ResourceManagerStub(self.channel)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    hooks: list[str] = []
    component = Component(
        name="failing",
        register=lambda s: irm_pb2_grpc.add_ResourceManagerServicer_to_server(FailingIrm(), s),
        service_names=[RM],
        start=lambda: hooks.append("start"),
        stop=lambda: hooks.append("stop"),
    )
    running = start("127.0.0.1:0", [component], max_workers=8)
    srv = Server(running, hooks)
    yield srv
    srv.channel.close()
    running.stop(grace=0)
    assert hooks == ["start", "stop"]


def _error(call, *args, **kwargs) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=TIMEOUT, **kwargs)
    return info.value


def test_start_binds_a_port_and_runs_start_hooks(server: Server) -> None:
    assert server.running.port > 0
    assert server.hooks == ["start"]
    ok = server.irm.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id="ok"), timeout=TIMEOUT)
    assert ok.id == "ok" and ok.tenant == "t"


def test_invalid_argument_carries_every_field_violation(server: Server) -> None:
    e = _error(server.irm.Reserve, irm_pb2.ReserveRequest(tenant="t"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.field_violations(e) == [
        ("request_id", "required: a client-chosen idempotency key"),
        ("groups", "at least one group is required"),
    ]
    assert "request_id: required" in e.details() and "groups: at least one" in e.details()
    status = rpc_status.from_call(e)
    assert status is not None and status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_invalid_argument_of_one_field(server: Server) -> None:
    e = _error(server.irm.GetMetrics, irm_pb2.GetMetricsRequest(tenant="t"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.field_violations(e) == [("since", "must be >= 0")]
    assert e.details() == "since: must be >= 0"


def test_not_found(server: Server) -> None:
    e = _error(server.irm.GetReservation, irm_pb2.GetReservationRequest(tenant="t", reservation_id="r9"))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert e.details() == "reservation 'r9' does not exist"
    assert errors.field_violations(e) == []


@pytest.mark.parametrize("kind", sorted(DOMAIN))
def test_every_domain_error_maps_to_its_status(server: Server, kind: str) -> None:
    e = _error(server.irm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=kind))
    assert e.code() == CODES[kind]
    assert e.details() == DOMAIN[kind].message


@pytest.mark.parametrize("method", ["ReleaseReservation", "ListReservations"])
def test_plain_exception_is_internal_without_leaking(server: Server, method: str) -> None:
    request = {"ReleaseReservation": irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id="r"),
               "ListReservations": irm_pb2.ListReservationsRequest(tenant="t")}[method]
    e = _error(getattr(server.irm, method), request)
    assert e.code() == grpc.StatusCode.INTERNAL
    assert e.code() != grpc.StatusCode.UNKNOWN
    text = e.details() + repr(e.trailing_metadata())
    assert "Traceback" not in text and 'File "' not in text
    assert "hunter2" not in text and "/srv/secret" not in text
    assert method in e.details()  # says where, so the log line can be found


def test_deliberate_abort_keeps_its_status(server: Server) -> None:
    e = _error(server.irm.DiscoverResources, irm_pb2.DiscoverResourcesRequest(tenant="t"))
    assert e.code() == grpc.StatusCode.OUT_OF_RANGE
    assert e.details() == "deliberate abort"


@pytest.mark.parametrize(("rtype", "code"), [
    ("domain", grpc.StatusCode.NOT_FOUND),
    ("invalid", grpc.StatusCode.INVALID_ARGUMENT),
    ("plain", grpc.StatusCode.INTERNAL),
])
def test_stream_failing_mid_way_delivers_items_then_a_proper_status(server: Server, rtype: str,
                                                                     code: grpc.StatusCode) -> None:
    got: list[str] = []
    with pytest.raises(grpc.RpcError) as info:
        for ev in server.irm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="t", resource_type=rtype),
                                           timeout=TIMEOUT):
            got.append(ev.resource.id)
    e = info.value
    assert got == ["h0", "h1"]
    assert e.code() == code
    assert "hunter2" not in (e.details() or "") and "Traceback" not in (e.details() or "")
    if rtype == "invalid":
        assert errors.field_violations(e) == [("resource_type", "unknown type")]


def test_health_reports_serving_for_the_component_services(server: Server) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    for name in (RM, ""):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
    e = _error(health.Check, health_pb2.HealthCheckRequest(service="harness.v1.Nothing"))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_health_reports_serving_for_diagnostics(server: Server) -> None:
    # Diagnostics answers (see below), so health must not call it NOT_SERVING.
    health = health_pb2_grpc.HealthStub(server.channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=DIAG), timeout=TIMEOUT)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(server: Server) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    replies = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                             timeout=TIMEOUT))
    assert len(replies) == 1
    names = {s.name for s in replies[0].list_services_response.service}
    assert {RM, DIAG, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


def _reflect_v1(server: Server, *requests: reflection_pb2.ServerReflectionRequest) -> list:
    """Replies of grpc.reflection.v1 (no stub in grpcio-reflection: the same messages on v1's method path)."""
    call = server.channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    return list(call(iter(requests), timeout=TIMEOUT))


def test_reflection_v1_lists_the_services_and_describes_itself(server: Server) -> None:
    # Newer clients (grpcurl, buf curl) ask grpc.reflection.v1 first; v1alpha alone left them to fall back.
    from google.protobuf import descriptor_pb2

    listed, = _reflect_v1(server, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in listed.list_services_response.service}
    assert {RM, DIAG, "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= names
    own, = _reflect_v1(server, reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="grpc.reflection.v1.ServerReflection"))
    assert own.WhichOneof("message_response") == "file_descriptor_response", own
    fd = descriptor_pb2.FileDescriptorProto.FromString(own.file_descriptor_response.file_descriptor_proto[0])
    assert fd.package == "grpc.reflection.v1"
    method = fd.service[0].method[0]
    assert (method.name, method.input_type) == ("ServerReflectionInfo", ".grpc.reflection.v1.ServerReflectionRequest")
    assert all("v1alpha" not in f.type_name for m in fd.message_type for f in m.field)
    api, = _reflect_v1(server, reflection_pb2.ServerReflectionRequest(file_containing_symbol=RM))
    assert api.WhichOneof("message_response") == "file_descriptor_response"


def test_reflection_serves_the_file_of_a_service(server: Server) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    replies = list(stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=RM)]), timeout=TIMEOUT))
    assert replies[0].WhichOneof("message_response") == "file_descriptor_response"
    assert replies[0].file_descriptor_response.file_descriptor_proto


@pytest.mark.parametrize("symbol", [f"{RM}.Reserve", f"{RM}.WatchCapacity"])
def test_reflection_finds_a_methods_file_by_its_full_name(server: Server, symbol: str) -> None:
    # `grpcurl describe harness.v1.ResourceManager.Reserve` asks for <package>.<service>.<method>.
    from google.protobuf import descriptor_pb2

    for replies in (_reflect_v1(server, reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)),
                    list(reflection_pb2_grpc.ServerReflectionStub(server.channel).ServerReflectionInfo(
                        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)]),
                        timeout=TIMEOUT))):
        reply, = replies
        assert reply.WhichOneof("message_response") == "file_descriptor_response", reply
        names = [descriptor_pb2.FileDescriptorProto.FromString(raw).name
                 for raw in reply.file_descriptor_response.file_descriptor_proto]
        assert names[0] == "harness/v1/irm.proto"
    missing, = _reflect_v1(server, reflection_pb2.ServerReflectionRequest(file_containing_symbol=f"{RM}.NoSuch"))
    assert missing.WhichOneof("message_response") == "error_response"
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_reflection_serves_the_apis_comments_and_the_error_details(server: Server) -> None:
    # A client with reflection alone (grpcurl describe, another language) reads the documentation, and can
    # decode google.rpc.Status details.
    from google.protobuf import descriptor_pb2

    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    replies = list(stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=RM),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="google.rpc.BadRequest"),
    ]), timeout=TIMEOUT))
    files = {}
    for r in replies:
        assert r.WhichOneof("message_response") == "file_descriptor_response", r
        for raw in r.file_descriptor_response.file_descriptor_proto:
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[fd.name] = fd
    assert "google/rpc/error_details.proto" in files
    irm = files["harness/v1/irm.proto"]
    comments = " ".join(loc.leading_comments for loc in irm.source_code_info.location)
    assert "Refuse (FAILED_PRECONDITION) if the quoted price per minute is higher." in comments


def test_diagnostics_echo_names_the_components(server: Server) -> None:
    stub = diagnostics_pb2_grpc.DiagnosticsStub(server.channel)
    reply = stub.Echo(diagnostics_pb2.EchoRequest(payload=b"ping"), timeout=TIMEOUT)
    assert reply.payload == b"ping" and reply.service == "failing"


def test_concurrent_failures_are_all_mapped(server: Server) -> None:
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        try:
            server.irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=str(i)),
                                          timeout=TIMEOUT)
        except grpc.RpcError as e:
            with lock:
                codes.append(e.code())

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert codes == [grpc.StatusCode.INTERNAL] * 16


# -- errors without a server ---------------------------------------------------

def test_to_status_packs_bad_request_details() -> None:
    err = InvalidArgument("two problems", [FieldViolation("a", "x"), FieldViolation("b.c", "y")])
    st = errors.to_status(err)
    assert st.code == 3 and st.message == "two problems" and len(st.details) == 1
    assert errors.to_status(NotFound("gone")).details == []
    assert errors.to_status(NotFound("gone")).code == 5


def test_violations_collects_and_raises_once() -> None:
    v = Violations()
    v.raise_if_any()  # nothing yet
    assert v.check(True, "a", "fine") is True
    assert v.check(False, "b", "bad") is False
    v.add("c", "worse")
    with pytest.raises(InvalidArgument) as info:
        v.raise_if_any()
    assert [(x.field, x.description) for x in info.value.violations] == [("b", "bad"), ("c", "worse")]
    assert str(info.value) == "b: bad; c: worse"
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_tenant_helpers() -> None:
    assert errors.require_tenant("acme") == "acme"
    with pytest.raises(InvalidArgument) as info:
        errors.require_tenant("")
    assert info.value.violations[0].field == "tenant"
    with pytest.raises(InvalidArgument):
        errors.require_tenant("x" * 129)
    errors.owned("a", "a", "thing")
    with pytest.raises(errors.PermissionDenied):
        errors.owned("a", "b", "thing")


@pytest.mark.parametrize(("request_", "path"), [
    (irm_pb2.GetReservationRequest(tenant="ali\x00ce", reservation_id="ok"), "tenant"),
    (irm_pb2.ReserveRequest(tenant="t", groups=[irm_pb2.ResourceGroup(name="a"),
                                                irm_pb2.ResourceGroup(name="b", required_traits=["x", "y\x00"])]),
     "groups[1].required_traits"),
    (irm_pb2.ReserveRequest(tenant="t", groups=[irm_pb2.ResourceGroup(name="a", attributes={"c\x00": common_pb2.AttributeRequest()})]),
     "groups[0].attributes['c\\x00']"),
])
def test_a_nul_character_in_any_string_field_is_bad_input_before_the_handler_runs(server: Server, request_,
                                                                                   path: str) -> None:
    # PostgreSQL cannot store one (the driver's error read as INTERNAL); refused the same on every database.
    method = server.irm.GetReservation if isinstance(request_, irm_pb2.GetReservationRequest) else server.irm.Reserve
    e = _error(method, request_)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.field_violations(e) == [(path, "must not contain a NUL character (\\x00)")]


def test_a_nul_character_is_refused_on_server_streams_too(server: Server) -> None:
    e = _error(lambda r, timeout: list(server.irm.WatchCapacity(r, timeout=timeout)),
               irm_pb2.WatchCapacityRequest(resource_type="vm\x00"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "resource_type" in e.details()


def _undecodable_cases() -> dict[str, bytes]:
    whole = irm_pb2.GetReservationRequest(tenant="abc", reservation_id="ok").SerializeToString()
    return {
        # protobuf.js encodes a JS string holding a lone surrogate as these bytes: invalid UTF-8.
        "lone surrogate": whole.replace(b"abc", b"\xed\xa0\x80"),
        "truncated": whole[:-1],
        "field number 0": b"\x00\x01" + whole,
    }


@pytest.mark.parametrize("case", sorted(_undecodable_cases()))
def test_bytes_that_are_no_such_message_are_bad_input_not_an_internal_error(server: Server, case: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    raw = server.channel.unary_unary(f"/{RM}/GetReservation", request_serializer=None,
                                     response_deserializer=irm_pb2.Reservation.FromString)
    with caplog.at_level("DEBUG"):
        e = _error(raw, _undecodable_cases()[case])
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert "harness.v1.GetReservationRequest" in e.details() and "UTF-8" in e.details()
    assert errors.field_violations(e)[0][0] == "request"
    # grpc logs a traceback for each such call when its deserializer raises: nothing is logged now.
    assert not [r for r in caplog.records if "deserializ" in r.getMessage()]
    # The server goes on answering well-formed calls.
    assert server.irm.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id="ok"),
                                     timeout=TIMEOUT).id == "ok"


def test_an_undecodable_message_in_a_client_stream_ends_it_invalid_argument_after_what_was_answered() -> None:
    seen: list[str] = []

    def echo_each(requests, context):  # type: ignore[no-untyped-def]
        for r in requests:
            seen.append(r.tenant)
            yield irm_pb2.Reservation(id=r.tenant)

    handler = grpc.method_handlers_generic_handler("test.Streams", {
        "Echo": grpc.stream_stream_rpc_method_handler(
            echo_each, request_deserializer=irm_pb2.GetReservationRequest.FromString,
            response_serializer=irm_pb2.Reservation.SerializeToString)})
    running = start("127.0.0.1:0", [Component(name="streams", register=lambda s: s.add_generic_rpc_handlers((handler,)),
                                              service_names=["test.Streams"])], max_workers=4)
    try:
        with plain_channel(f"127.0.0.1:{running.port}") as channel:
            call = channel.stream_stream("/test.Streams/Echo", request_serializer=None,
                                         response_deserializer=irm_pb2.Reservation.FromString)
            good = irm_pb2.GetReservationRequest(tenant="fine").SerializeToString()
            bad = irm_pb2.GetReservationRequest(tenant="xyz").SerializeToString().replace(b"xyz", b"\xed\xa0\x80")
            replies = call(iter([good, bad, good]), timeout=TIMEOUT)
            got = []
            with pytest.raises(grpc.RpcError) as info:
                for reply in replies:
                    got.append(reply.id)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "harness.v1.GetReservationRequest" in info.value.details()
        assert got == ["fine"] and seen == ["fine"]
    finally:
        running.stop(grace=0)


def test_a_method_the_service_does_not_implement_is_unimplemented_without_a_traceback(
        server: Server, caplog: pytest.LogCaptureFixture) -> None:
    # FailingIrm leaves ReserveBatch to the generated base class (as the Orchestrator does; a CRS tries it first).
    with caplog.at_level("DEBUG"):
        e = _error(server.irm.ReserveBatch, irm_pb2.ReserveBatchRequest())
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED
    assert e.details() == f"/{RM}/ReserveBatch is not implemented by this service"
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info], caplog.records
