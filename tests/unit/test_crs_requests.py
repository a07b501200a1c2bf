"""The CRS's reading of requests: attribute limits merged across a type's managers, non-consumable numbers
checked, a reused request_id with other content refused, and a down manager's resources answered
UNAVAILABLE (in-process; the managers' side is stood in for)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, CrsConfig, merged_attribute
from harness.v1 import common_pb2, irm_pb2
from services.errors import FailedPrecondition, InvalidArgument, Unavailable

NUMBER = irm_pb2.AttributeSpec.KIND_NUMBER


def _spec(max_cores: float, freqs: tuple[float, float]) -> irm_pb2.ResourceTypeSpec:
    return irm_pb2.ResourceTypeSpec(name="vm", attributes=[
        irm_pb2.AttributeSpec(name="cores", kind=NUMBER, unit="cores", consumable=True,
                              domain=common_pb2.Range(min=1, max=max_cores)),
        irm_pb2.AttributeSpec(name="memory_gb", kind=NUMBER, unit="GB", consumable=True,
                              domain=common_pb2.Range(min=0.5, max=64)),
        irm_pb2.AttributeSpec(name="frequency_ghz", kind=NUMBER, unit="GHz",
                              domain=common_pb2.Range(min=freqs[0], max=freqs[1]))])


def _vm(cores: float, count: int = 1, name: str = "g", **extra: common_pb2.AttributeRequest) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=2),
        **extra})


def _manager(crs: Crs, name: str, spec: irm_pb2.ResourceTypeSpec, up: bool = True) -> None:
    crs.registry.managers[name] = ManagerState(name, "127.0.0.1:9", ["vm"], 0.0, specs=[spec], up=up)


def _host(crs: Crs, manager: str, hid: str, cores: float, freq: float = 2.4) -> None:
    crs.view.upsert(manager, common_pb2.PhysicalResource(
        id=hid, resource_type="vm", capacity={"cores": cores, "memory_gb": 64}, used={"cores": 0, "memory_gb": 0},
        properties={"frequency_ghz": freq}, location=common_pb2.Location(site="s", rack=manager, host=hid),
        generation=1))


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = Crs(CrsConfig(state_dir=str(tmp_path)))
    yield c
    c.db.dispose()


@pytest.mark.parametrize("first_small", [True, False])
def test_limits_are_merged_across_a_types_managers_whoever_registered_first(crs: Crs, first_small: bool) -> None:
    managers = [("small", _spec(8, (2.0, 2.6))), ("big", _spec(16, (2.2, 3.0)))]
    for name, spec in managers if first_small else managers[::-1]:
        _manager(crs, name, spec)
    req = crs._parse([_vm(16, frequency_ghz=common_pb2.AttributeRequest(number=2.0))], [])
    assert req.groups[0].demand["cores"] == 16 and req.groups[0].properties["frequency_ghz"] == (2.0, 2.0)
    with pytest.raises(InvalidArgument, match=r"17 cores is outside \[1, 16\]"):
        crs._parse([_vm(17)], [])


def test_merging_keeps_a_side_either_manager_leaves_open() -> None:
    a = irm_pb2.AttributeSpec(name="x", domain=common_pb2.Range(min=1, max=4))
    b = irm_pb2.AttributeSpec(name="x", domain=common_pb2.Range(min=2))
    m = merged_attribute(a, b)
    assert m.domain.min == 1 and not m.domain.HasField("max")
    assert not merged_attribute(a, irm_pb2.AttributeSpec(name="x")).HasField("domain")


@pytest.mark.parametrize(("asked", "says"), [
    (common_pb2.AttributeRequest(number=math.nan), "not NaN"),
    (common_pb2.AttributeRequest(range=common_pb2.Range(min=math.nan, max=3)), "not NaN"),
    (common_pb2.AttributeRequest(number=-1), "-1 GHz is outside [2, 3]"),
    (common_pb2.AttributeRequest(range=common_pb2.Range(min=3.5)), "the range [3.5, inf] GHz is outside [2, 3]"),
    (common_pb2.AttributeRequest(number=math.inf), "a finite number"),
])
def test_a_bad_non_consumable_number_is_invalid_not_unplaceable(crs: Crs, asked, says) -> None:
    _manager(crs, "m", _spec(8, (2.0, 3.0)))
    with pytest.raises(InvalidArgument) as e:
        crs._parse([_vm(1, frequency_ghz=asked)], [])
    assert [v.field for v in e.value.violations] == ["groups[0].attributes[frequency_ghz]"]
    assert says in e.value.violations[0].description
    # An open-ended range that meets the domain is fine.
    crs._parse([_vm(1, frequency_ghz=common_pb2.AttributeRequest(range=common_pb2.Range(min=2.5)))], [])


def _delegating(crs: Crs) -> None:
    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        return [irm_pb2.AllocatedGroup(name=g.name, manager=m, manager_reservation_id=f"irm-{res_id}")
                for m, parts in pinned.items() for g in parts], [], {}

    crs._delegate = delegate  # type: ignore[method-assign]


def test_a_request_id_reused_with_other_content_is_refused(crs: Crs) -> None:
    _manager(crs, "m", _spec(8, (2.0, 3.0)))
    _host(crs, "m", "h0", 8)
    _delegating(crs)
    first = crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="k1", groups=[_vm(1)]), None)
    # The same request again: the same reservation (a retry).
    assert crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="k1", groups=[_vm(1)]), None).id == first.id
    for other in (irm_pb2.ReserveRequest(tenant="t", request_id="k1", groups=[_vm(2)]),
                  irm_pb2.ReserveRequest(tenant="t", request_id="k1", groups=[_vm(1)], priority=3)):
        with pytest.raises(InvalidArgument) as e:
            crs.Reserve(other, None)
        assert [(v.field, v.description) for v in e.value.violations] == [
            ("request_id", "request_id reused with a different request; use a new request_id")]
    # Another tenant's k1 is its own.
    assert crs.Reserve(irm_pb2.ReserveRequest(tenant="u", request_id="k1", groups=[_vm(2)]), None).id != first.id


def test_a_row_from_before_hashes_replays_unchecked(crs: Crs) -> None:
    _manager(crs, "m", _spec(8, (2.0, 3.0)))
    _host(crs, "m", "h0", 8)
    _delegating(crs)
    first = crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="old", groups=[_vm(1)]), None)
    crs.db.transact(lambda s: s.execute(
        crs_reservations().update().where(crs_reservations().c.id == first.id).values(request_hash="")))
    assert crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="old", groups=[_vm(4)]), None).id == first.id


def crs_reservations():  # type: ignore[no-untyped-def]
    from cross_resource_scheduler.models import Reservation
    return Reservation.__table__


def test_a_request_only_a_down_managers_resources_hold_is_unavailable(crs: Crs) -> None:
    _manager(crs, "up", _spec(8, (2.0, 2.6)))
    _manager(crs, "down", _spec(16, (2.2, 3.0)), up=False)
    _host(crs, "up", "u1", 8)
    _host(crs, "down", "d1", 16)
    crs.view.set_down("down", True)
    _delegating(crs)
    with pytest.raises(Unavailable, match="manager down, which is down; retry later"):
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[_vm(12)]), None)
    with pytest.raises(FailedPrecondition, match="cannot fit even on an empty cloud"):
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[_vm(8, count=4)],
                                           constraints=[irm_pb2.GroupConstraint(expression="same_host(g, g)")]),
                    None)


def test_merging_keeps_required_and_integer_only_where_every_manager_says_so() -> None:
    both = irm_pb2.AttributeSpec(name="x", required=True, integer=True)
    assert merged_attribute(both, irm_pb2.AttributeSpec(name="x", required=True, integer=True)).required
    loose = merged_attribute(both, irm_pb2.AttributeSpec(name="x"))
    assert not loose.required and not loose.integer
