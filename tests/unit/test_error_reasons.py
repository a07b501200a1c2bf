"""Machine-readable error reasons: a status code alone does not say what to do (FAILED_PRECONDITION is "never
fits", "over your price cap" and "no model yet"), so errors carry a google.rpc.ErrorInfo (domain "harness.v1")
and, where waiting helps, a google.rpc.RetryInfo. Decoded here only with the google.rpc protos
(grpc_status.rpc_status.from_call + error_details_pb2), as a Go or Java client would: never from the message."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

import examples
from application_manager import service as am_service
from application_manager.local import LocalBackend, RunDetail
from application_manager.profilers.base import BENCHMARK, Observation
from harness.v1 import application_manager_pb2 as am_pb
from harness.v1 import application_manager_pb2_grpc as am_pb_grpc
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute.service import ComputeConfig, ComputeIrm
from irm_compute.service import component as compute_component
from services import errors, server
from services.errors import (
    MAX_DETAILS_BYTES,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from services.tls import plain_channel
from services.watch import Broadcaster
from tests.unit.test_compute_review12 import INVENTORY as COMPUTE_INVENTORY

TIMEOUT = 30
T = "alice"
ROOT = Path(__file__).resolve().parents[2]


# -- decoding, as a client in another language does ------------------------------------------------------------

@dataclass
class Rich:
    code: int
    reason: str | None
    domain: str | None
    metadata: dict[str, str]
    retry_s: float | None
    violations: list[tuple[str, str]]


def _rich_details(details: list[any_pb2.Any], code: int) -> Rich:
    out = Rich(code, None, None, {}, None, [])
    for d in details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            out.reason, out.domain, out.metadata = info.reason, info.domain, dict(info.metadata)
        elif d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            d.Unpack(retry)
            out.retry_s = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
        elif d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            out.violations += [(v.field, v.description) for v in bad.field_violations]
    return out


def rich(e: grpc.RpcError) -> Rich:
    """The google.rpc details of a failed call (grpc-status-details-bin)."""
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert status is not None, f"no rich status with {e.code()}: {e.details()}"  # type: ignore[attr-defined]
    return _rich_details(list(status.details), status.code)


def refused(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=TIMEOUT)
    return info.value


# -- to_status ---------------------------------------------------------------------------------------------------

def test_an_error_with_a_reason_carries_error_info_and_retry_info() -> None:
    st = errors.to_status(ResourceExhausted("full now", reason="CAPACITY_IN_USE", retry_after_s=2.5,
                                            metadata={"manager": "compute-a"}))
    assert isinstance(st, status_pb2.Status) and st.code == 8 and st.message == "full now"
    got = _rich_details(list(st.details), st.code)
    assert (got.reason, got.domain, got.metadata) == ("CAPACITY_IN_USE", "harness.v1", {"manager": "compute-a"})
    assert got.retry_s == pytest.approx(2.5)
    # A reason without a delay: an ErrorInfo only.
    st = errors.to_status(FailedPrecondition("never", reason="NEVER_FITS"))
    assert [d.type_url.rsplit("/", 1)[1] for d in st.details] == ["google.rpc.ErrorInfo"]
    # No reason: no details (as before).
    assert errors.to_status(NotFound("gone")).details == []


def test_invalid_argument_keeps_its_bad_request_beside_a_reason() -> None:
    err = InvalidArgument("two problems", [FieldViolation("a", "x"), FieldViolation("b.c", "y")])
    assert _rich_details(list(errors.to_status(err).details), 3).violations == [("a", "x"), ("b.c", "y")]
    err = InvalidArgument("over", [FieldViolation("max_price_per_minute", "too low")], reason="OVER_PRICE")
    got = _rich_details(list(errors.to_status(err).details), 3)
    assert got.reason == "OVER_PRICE" and got.violations == [("max_price_per_minute", "too low")]


def test_a_reason_set_when_raising_again_is_sent() -> None:
    e = ResourceExhausted("8 watch streams are open").with_reason("STREAM_CAP")
    assert _rich_details(list(errors.to_status(e).details), 8).reason == "STREAM_CAP"


@pytest.mark.parametrize("kw", [{"reason": "never_fits"}, {"reason": "NEVER FITS"}, {"reason": "X" * 64},
                                {"retry_after_s": -1.0}, {"retry_after_s": float("nan")}])
def test_a_malformed_reason_or_delay_is_refused_where_it_is_raised(kw: dict) -> None:
    with pytest.raises(ValueError):
        FailedPrecondition("x", **kw)


def test_huge_metadata_and_violations_stay_within_the_bounds() -> None:
    metadata = {f"key{i}" + "k" * 100: "v" * 5000 for i in range(50)}
    violations = [FieldViolation(f"groups[{i}].name" + "f" * 300, "d" * 2000) for i in range(100)]
    st = errors.to_status(InvalidArgument("m" * 100_000, violations, reason="NEVER_FITS", retry_after_s=1,
                                          metadata=metadata))
    assert sum(d.ByteSize() for d in st.details) <= MAX_DETAILS_BYTES
    got = _rich_details(list(st.details), st.code)
    assert got.reason == "NEVER_FITS" and got.retry_s == 1 and got.violations   # the reason is never cut off
    assert 0 < len(got.metadata) <= 8 and all(len(v.encode()) <= 256 for v in got.metadata.values())


def test_every_reason_is_documented_in_common_proto() -> None:
    header = (ROOT / "protos/harness/v1/common.proto").read_text().split("syntax =")[0]
    documented = re.findall(r"^//   ([A-Z][A-Z_]+)\s", header, re.MULTILINE)
    assert sorted(documented) == sorted(errors.REASONS)
    assert '"harness.v1"' in header and "google.rpc.ErrorInfo" in header and "google.rpc.RetryInfo" in header


# -- the compute IRM over gRPC -------------------------------------------------------------------------------------

INVENTORY = COMPUTE_INVENTORY      # two 16-core hosts, b the faster one with trait "fast"


@dataclass
class Compute:
    irm: ComputeIrm
    rm: irm_pb2_grpc.ResourceManagerStub
    running: server.Running
    channel: grpc.Channel


@pytest.fixture
def compute(tmp_path: Path) -> Iterator[Compute]:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    comp = compute_component(ComputeConfig(state_dir=str(tmp_path), address="127.0.0.1:0",
                                           inventory=str(tmp_path / "hosts.yaml")))
    running = server.start("127.0.0.1:0", [comp])
    channel = plain_channel(f"127.0.0.1:{running.port}")
    yield Compute(comp.extra["irm"], irm_pb2_grpc.ResourceManagerStub(channel), running, channel)
    channel.close()
    running.stop(0)


def group(name: str = "g", cores: float = 1, count: int = 1, placement=(), **attrs) -> irm_pb2.ResourceGroup:  # type: ignore[no-untyped-def]
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, placement=list(placement), attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=1),
        **attrs})


def reserve_request(rid: str, *groups: irm_pb2.ResourceGroup, tenant: str = T, **kw) -> irm_pb2.ReserveRequest:  # type: ignore[no-untyped-def]
    return irm_pb2.ReserveRequest(tenant=tenant, request_id=rid, groups=list(groups), **kw)


def test_compute_reserve_over_the_price_cap_is_over_price(compute: Compute) -> None:
    e = refused(compute.rm.Reserve, reserve_request("r", group(cores=4), max_price_per_minute=0.001))
    got = rich(e)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (got.reason, got.domain) == ("OVER_PRICE", "harness.v1")
    assert float(got.metadata["maxPricePerMinute"]) == pytest.approx(0.001)
    assert float(got.metadata["pricePerMinute"]) > 0.001


@pytest.mark.parametrize("groups", [
    [group(count=40)],                                                 # more VMs than every host holds empty
    [group("x", cores=10, placement=["a"]), group("y", cores=10, placement=["a"])],   # pinned beyond one host
    [irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, required_traits=["gpu"],
                           attributes=group().attributes)],           # a trait no host has
    [group(placement=["a"], frequency_ghz=common_pb2.AttributeRequest(number=3.0))],  # pinned host cannot match
], ids=["too-many", "pinned-beyond-host", "no-such-trait", "pinned-mismatch"])
def test_compute_reserve_that_can_never_fit_is_never_fits(compute: Compute, groups) -> None:  # type: ignore[no-untyped-def]
    e = refused(compute.rm.Reserve, reserve_request("r", *groups))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    got = rich(e)
    assert got.reason == "NEVER_FITS" and got.retry_s is None


@pytest.mark.parametrize(("attrs", "path", "said"), [
    ({"cores": common_pb2.AttributeRequest(number=64)}, "groups[0].attributes[cores]", "64 cores is outside [1, 16]"),
    ({"memory_gb": common_pb2.AttributeRequest(number=100)}, "groups[0].attributes[memory_gb]",
     "100 GB is outside [0.000976562, 64]"),
    ({"frequency_ghz": common_pb2.AttributeRequest(number=9)}, "groups[0].attributes[frequency_ghz]",
     "9 GHz is outside [2.2, 3]"),
    ({"frequency_ghz": common_pb2.AttributeRequest(range=common_pb2.Range(min=3.5, max=4))},
     "groups[0].attributes[frequency_ghz]", "[3.5, 4] GHz is outside [2.2, 3]"),
], ids=["cores", "memory", "frequency", "frequency-range"])
def test_compute_attribute_beyond_every_host_is_invalid_argument_on_it_as_at_the_crs(compute: Compute, attrs,  # type: ignore[no-untyped-def]
                                                                                       path: str, said: str) -> None:
    # common.proto: outside every resource's range is INVALID_ARGUMENT on that field; NEVER_FITS is for what is
    # within the ranges but no host has together (the CRS answers so; the IRM said NEVER_FITS).
    g = group()
    for key, value in attrs.items():
        g.attributes[key].CopyFrom(value)
    for call, request in ((compute.rm.Reserve, reserve_request("r", g)),
                          (compute.rm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=T, groups=[g]))):
        e = refused(call, request)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
        (field, description), = errors.field_violations(e)
        assert field == path and description.startswith(said), description
    # Pinned, the same group is judged on its host (the CRS places again on PIN_REFUSED or NEVER_FITS).
    g.placement.append("a")
    assert refused(compute.rm.Reserve, reserve_request("p", g)).code() == grpc.StatusCode.FAILED_PRECONDITION


def test_compute_reserve_of_capacity_in_use_now_is_capacity_in_use_with_a_retry_delay(compute: Compute) -> None:
    compute.rm.Reserve(reserve_request("hold", group(cores=10, placement=["a"]), tenant="bob"), timeout=TIMEOUT)
    for req in (reserve_request("r1", group(cores=10, placement=["a"])),      # the pinned host is full
                reserve_request("r2", group(cores=10, count=2))):             # every matching host is too full
        e = refused(compute.rm.Reserve, req)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        got = rich(e)
        assert got.reason == "CAPACITY_IN_USE" and got.retry_s is not None and 0 < got.retry_s <= 60


def test_compute_watch_beyond_the_stream_cap_is_stream_cap(compute: Compute) -> None:
    compute.irm.watchers = Broadcaster(max_streams=0, full="WatchCapacity streams are open on this compute IRM")
    stream = compute.rm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=T), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stream))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rich(info.value).reason == "STREAM_CAP"


# -- the Application Manager over gRPC ------------------------------------------------------------------------------

def _measured(backend, proposal):  # noqa: ANN001, ANN202
    c = backend.space.configs[proposal.config]
    t = (1.0 if proposal.input == BENCHMARK else 10.0) * (1.0 / c["%master_cores"] + 25.6 / c["%master_mem"])
    return RunDetail(Observation(proposal.config, True, t, t * 0.01, proposal.input, 50.0, 50.0))


@pytest.fixture
def am(tmp_path: Path, monkeypatch) -> Iterator[am_pb_grpc.ApplicationManagerStub]:  # noqa: ANN001
    monkeypatch.setattr(am_service.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    monkeypatch.setattr(LocalBackend, "run", lambda self, p, **kw: _measured(self, p))
    comp = am_service.component(am_service.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                            address="127.0.0.1:0"))
    running = server.start("127.0.0.1:0", [comp])
    channel = plain_channel(f"127.0.0.1:{running.port}")
    yield am_pb_grpc.ApplicationManagerStub(channel)
    channel.close()
    running.stop(0)


def _submit(stub: am_pb_grpc.ApplicationManagerStub) -> am_pb.Application:
    return stub.SubmitApplication(am_pb.SubmitApplicationRequest(
        tenant=T, manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
        app_dir="/x"), timeout=TIMEOUT)


def test_am_execute_without_a_performance_model_is_no_model(am: am_pb_grpc.ApplicationManagerStub) -> None:
    app = _submit(am)
    e = refused(am.ExecuteApplication, am_pb.ExecuteApplicationRequest(tenant=T, application_id=app.id))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    got = rich(e)
    assert (got.reason, got.domain) == ("NO_MODEL", "harness.v1")


def test_am_execute_whose_slo_no_profiled_configuration_meets_is_slo_unattainable(
        am: am_pb_grpc.ApplicationManagerStub) -> None:
    app = _submit(am)
    for _ in am.StartProfiling(am_pb.StartProfilingRequest(tenant=T, application_id=app.id, profiler="uniform",
                                                           max_runs=4, seed=1), timeout=TIMEOUT):
        pass
    slo = json.dumps({"Objective": {"Constraints": ["%execution_time <= 0.000001"]}})
    e = refused(am.ExecuteApplication, am_pb.ExecuteApplicationRequest(tenant=T, application_id=app.id,
                                                                        slo_json=slo))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rich(e).reason == "SLO_UNATTAINABLE"


def test_errors_passed_on_from_a_peer_keep_its_reason_and_retry_delay() -> None:
    """services.errors.from_rpc_error over a real call: the peer's ErrorInfo and RetryInfo reach our caller."""
    def fail(request, context):  # type: ignore[no-untyped-def]
        raise Unavailable("agent away", reason="MANAGER_UNAVAILABLE", retry_after_s=3, metadata={"manager": "m"})

    def register(s: grpc.Server) -> None:
        s.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("demo.Demo", {
            "Fail": grpc.unary_unary_rpc_method_handler(fail)})])

    running = server.start("127.0.0.1:0", [server.Component("demo", register, ["demo.Demo"])])
    try:
        with plain_channel(f"127.0.0.1:{running.port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary("/demo.Demo/Fail")(b"", timeout=TIMEOUT)
        passed = errors.from_rpc_error("agent 'x'", info.value, "nothing ran")
        assert isinstance(passed, Unavailable) and passed.reason == "MANAGER_UNAVAILABLE"
        assert passed.retry_after_s == 3 and passed.metadata == {"manager": "m"}
        assert errors.error_info(info.value) == ("MANAGER_UNAVAILABLE", {"manager": "m"})
        assert errors.retry_delay_s(info.value) == 3
    finally:
        running.stop(0)
