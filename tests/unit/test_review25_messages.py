"""Review 25 (a client fuzzing every service from the protos): messages that misled.

* A request id too long was called "required" (the CRS, the FPGA IRM's Reserve, CreateGroup, RegisterJob).
* A constraint too long said "at most 1000 at character 1001".
* A manager's refusal of a QuotePrice at the CRS ended "nothing was reserved" (nothing was to be).
(The FPGA IRM's wording of an unknown request id: tests/integration/test_fpga_irm_review22.py.)
"""

from __future__ import annotations

import grpc
import pytest

from cross_resource_scheduler.constraints import ConstraintSyntaxError, parse
from cross_resource_scheduler.registry import ManagerState
from harness.v1 import irm_pb2
from services.errors import FailedPrecondition, InvalidArgument
from services.idempotency import request_id_problem
from tests.conftest import PeerError
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_service_parse import _group


def test_a_request_id_missing_and_one_too_long_are_told_apart():
    assert request_id_problem("", 128) == "required: a client-chosen idempotency key of 1-128 characters"
    assert request_id_problem("x" * 129, 128) == \
        "at most 128 characters, got 129 (a client-chosen idempotency key of 1-128 characters)"
    assert request_id_problem("x" * 128, 128) is None


def test_the_crs_says_a_long_request_id_is_too_long(tmp_path) -> None:
    crs = make_crs(tmp_path)
    try:
        with pytest.raises(InvalidArgument) as e:
            crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r" * 1_000_000, groups=[_group(1)]), None)
        assert [(v.field, v.description) for v in e.value.violations] == [
            ("request_id", "at most 128 characters, got 1000000 (a client-chosen idempotency key of 1-128 characters)")]
    finally:
        crs.db.dispose()


def test_a_constraint_too_long_is_said_without_a_position():
    with pytest.raises(ConstraintSyntaxError) as e:
        parse("hops(a, b) <= 1 " + " " * 2000)
    assert str(e.value) == "too long: 2016 characters, at most 1000" and e.value.position is None


class _Refusing:
    def QuotePrice(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        raise PeerError(grpc.StatusCode.FAILED_PRECONDITION, "no host has the requested frequency and traits")


def test_a_managers_refusal_of_a_quote_does_not_say_nothing_was_reserved(tmp_path) -> None:
    crs = make_crs(tmp_path)
    try:
        state = ManagerState("m", "127.0.0.1:1", ["vm"], 0.0)
        state._stub = _Refusing()  # type: ignore[assignment]
        crs.registry.managers["m"] = state
        with pytest.raises(FailedPrecondition) as e:
            crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)
        assert str(e.value) == "manager 'm': no host has the requested frequency and traits"
    finally:
        crs.db.dispose()
