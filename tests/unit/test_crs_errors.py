"""The CRS's errors for types whose managers cannot answer, and how a manager's refusal is passed on (in-process)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from cross_resource_scheduler.delegation import Refused
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, CrsConfig, tenant_paths
from harness.v1 import irm_pb2
from services.errors import InvalidArgument, Unavailable, from_rpc_error
from tests.unit.test_crs_service_parse import _group, _specs


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = Crs(CrsConfig(state_dir=str(tmp_path)))
    yield c
    c.db.dispose()


def _known(crs: Crs, name: str, up: bool, described: bool, registered: tuple[str, ...] = ("vm",)) -> None:
    """A manager of 'vm' in the registry (no watcher thread: nothing here dials it)."""
    specs = [irm_pb2.ResourceTypeSpec(name="vm", attributes=list(_specs()["vm"].values()))] if described else []
    crs.registry.managers[name] = ManagerState(name, "127.0.0.1:9", list(registered), 0.0, specs=specs, up=up)


def test_a_type_registered_but_not_yet_described_is_unavailable(crs: Crs) -> None:
    _known(crs, "compute", up=True, described=False)
    with pytest.raises(Unavailable, match=r"the manager of 'vm' \(compute\) has not described it yet; retry later"):
        crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)


def test_every_down_manager_of_a_type_is_named(crs: Crs) -> None:
    _known(crs, "compute-a", up=False, described=True)
    _known(crs, "compute-b", up=False, described=False)
    with pytest.raises(Unavailable) as e:
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[_group(2)]), None)
    assert e.value.message == "the managers of 'vm' (compute-a, compute-b) are down; retry later"


def test_a_type_a_manager_registered_but_does_not_describe_is_invalid(crs: Crs) -> None:
    # Its description is what it offers: "gpu" will not come with a retry.
    _known(crs, "compute", up=False, described=True, registered=("vm", "gpu"))
    with pytest.raises(InvalidArgument) as e:
        crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[
            irm_pb2.ResourceGroup(name="g", resource_type="gpu", count=1)]), None)
    assert [v.field for v in e.value.violations] == ["groups[0].resource_type"]


def test_bad_input_for_a_down_type_is_invalid_before_unavailable(crs: Crs) -> None:
    _known(crs, "compute", up=False, described=True)
    with pytest.raises(InvalidArgument) as e:
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[_group(64)]), None)
    assert [v.field for v in e.value.violations] == ["groups[0].attributes[cores]"]


def test_a_managers_group_paths_are_renamed_to_the_tenants() -> None:
    parts = [irm_pb2.ResourceGroup(name="workers"), irm_pb2.ResourceGroup(name="db")]
    path = tenant_paths(parts, {"master": 0, "db": 1, "workers": 2})
    assert path("groups[0].attributes[cores]") == "groups[2].attributes[cores]"
    assert path("groups[1].count") == "groups[1].count"
    assert path("groups[1]") == "groups[1]"
    # Not a group the CRS sent, or a field of the manager's own request: as the manager said it.
    assert path("groups[5].name") == "groups[5].name"
    assert path("request_id") == "request_id"
    assert path("groups") == "groups"


def test_a_batch_refusals_field_violations_reach_the_tenant_renamed() -> None:
    # A ReserveBatch outcome carries its BadRequest as field_violations: the same answer as a Reserve alone.
    refused = Refused(grpc.StatusCode.INVALID_ARGUMENT, "groups[0].attributes[cores]: whole cores only",
                      [("groups[0].attributes[cores]", "whole cores only")])
    e = from_rpc_error("manager 'm'", refused, "nothing was reserved",
                       tenant_paths([irm_pb2.ResourceGroup(name="g")], {"g": 3}))
    assert isinstance(e, InvalidArgument)
    assert [(v.field, v.description) for v in e.violations] == [("groups[3].attributes[cores]", "whole cores only")]
    assert e.message == "manager 'm': groups[3].attributes[cores]: whole cores only; nothing was reserved"


def test_a_refusal_without_a_rich_status_is_passed_on_with_its_text() -> None:
    # A refusal from inside a ReserveBatch carries a code and a message only.
    e = from_rpc_error("manager 'm'", Refused(grpc.StatusCode.INVALID_ARGUMENT, "groups[0].count: too many"),
                       "nothing was reserved", tenant_paths([irm_pb2.ResourceGroup(name="g")], {"g": 3}))
    assert isinstance(e, InvalidArgument) and e.violations == []
    assert e.message == "manager 'm': groups[0].count: too many; nothing was reserved"


def test_a_crs_describes_the_types_of_its_managers_that_are_down_too(crs: Crs) -> None:
    # What may be asked for, not what is free: a CRS above that describes this one while its IRMs are down must not
    # take their type for unknown (INVALID_ARGUMENT) rather than waiting for them (they are down: retry later).
    _known(crs, "compute-a", up=False, described=True)
    _known(crs, "compute-b", up=True, described=False)
    spec = crs.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(), None)
    assert [(t.name, sorted(a.name for a in t.attributes)) for t in spec.resource_types] == [
        ("vm", ["cores", "memory_gb"])]
