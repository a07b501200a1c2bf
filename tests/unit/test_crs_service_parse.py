"""The CRS's request parsing cache and its idle compensation poll (in-process, no IRMs)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import common_pb2, irm_pb2
from services.errors import HarnessError, InvalidArgument


def _specs() -> dict[str, dict[str, irm_pb2.AttributeSpec]]:
    number = irm_pb2.AttributeSpec.KIND_NUMBER
    return {"vm": {
        "cores": irm_pb2.AttributeSpec(name="cores", kind=number, consumable=True,
                                       domain=common_pb2.Range(min=1, max=32)),
        "memory_gb": irm_pb2.AttributeSpec(name="memory_gb", kind=number, consumable=True,
                                           domain=common_pb2.Range(min=0.5, max=256))}}


def _group(cores: float, count: int = 1) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name="g", resource_type="vm", count=count, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=2)})


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = Crs(CrsConfig(state_dir=str(tmp_path)))
    yield c
    c.db.dispose()


def test_a_repeated_request_is_parsed_once_while_the_specs_stay(crs: Crs) -> None:
    specs = _specs()
    crs._specs = lambda: specs  # type: ignore[method-assign]
    first = crs._parse([_group(2)], [])
    assert first.groups[0].demand == {"cores": 2.0, "memory_gb": 2.0}
    assert crs._parse([_group(2)], []) is first
    other = crs._parse([_group(4, count=2)], [])
    assert other is not first and other.groups[0].count == 2 and other.groups[0].demand["cores"] == 4.0
    # New specs (a manager came or went): parsed afresh against them.
    changed = _specs()
    crs._specs = lambda: changed  # type: ignore[method-assign]
    again = crs._parse([_group(2)], [])
    assert again is not first and again.groups[0].demand == first.groups[0].demand


def test_an_invalid_request_is_refused_every_time_not_cached(crs: Crs) -> None:
    specs = _specs()
    crs._specs = lambda: specs  # type: ignore[method-assign]
    for _ in range(2):
        with pytest.raises(HarnessError):
            crs._parse([_group(64)], [])  # outside the domain
    assert crs._parsed[1] == {}


def test_the_compensation_poll_with_nothing_pending_touches_no_manager(crs: Crs) -> None:
    asked: list[str] = []
    crs.registry.get = lambda name: asked.append(name)  # type: ignore[method-assign, assignment, return-value]
    crs._compensate_pending()
    assert asked == [] and crs.pending_compensations() == 0
    crs._remember("m", "t", "crs-x@m")
    crs._compensate_pending()  # m is unknown (not up): not asked; the row stays, to be retried
    assert asked == [] and crs.pending_compensations() == 1


def test_a_nan_price_cap_is_refused_not_ignored(crs: Crs) -> None:
    # Every comparison with NaN is false: the cap would have capped nothing.
    with pytest.raises(InvalidArgument) as e:
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[_group(2)],
                                           max_price_per_minute=math.nan), None)
    assert [v.field for v in e.value.violations] == ["max_price_per_minute"]


def test_a_negative_price_cap_is_invalid_not_over_price(crs: Crs) -> None:
    # No price is below 0: the request could never be met, whatever the cloud had (was FAILED_PRECONDITION).
    with pytest.raises(InvalidArgument) as e:
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[_group(2)],
                                           max_price_per_minute=-1.0), None)
    assert [v.field for v in e.value.violations] == ["max_price_per_minute"]
    assert ">= 0" in e.value.violations[0].description
