"""Review of session 24's CRS changes (deregistration, placing around managers that refuse the CRS's credentials, the
view's up-lists): in-process CRS, managers stood in for."""

from __future__ import annotations

import threading

import grpc
import pytest
from sqlalchemy import select

from cross_resource_scheduler import registration
from cross_resource_scheduler.models import Compensation, Manager
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2, registry_pb2
from services.clock import VirtualClock
from services.errors import FailedPrecondition, Unavailable
from tests.conftest import PeerError
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_review18_addresses import _recorded
from tests.unit.test_crs_service_parse import _group


def test_a_release_before_the_registry_is_filled_still_owes_the_part_to_its_manager(tmp_path) -> None:
    # A restarted CRS serves before start() puts the managers its database knows back in the registry: a release
    # then took "not registered" for "deregistered" and recorded nothing -- the part held at the IRM for good.
    crs = make_crs(tmp_path, VirtualClock(1000.0))
    try:
        crs.db.transact(lambda s: s.add(Manager(name="m", address="127.0.0.1:9", resource_types=["vm"],
                                                registered_at=1.0)))
        rid = _recorded(crs, 0, 900.0)
        out = crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=rid), None)
        assert out.state == irm_pb2.Reservation.STATE_RELEASED
        with crs.db.read() as s:
            assert [(c.manager, c.irm_reservation_id) for c in s.scalars(select(Compensation))] == [("m", "irm-0")]
    finally:
        crs.db.dispose()


class _Refusing:
    """A manager's stub refusing the CRS's credentials (its QuotePrice), or quoting."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    def QuotePrice(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        if self.refuse:
            raise PeerError(grpc.StatusCode.UNAUTHENTICATED,
                            "the call carries a delegation token this service does not accept")
        return irm_pb2.QuotePriceResponse(price_per_minute=1.5, groups=[
            irm_pb2.GroupQuote(name=g.name, price_per_minute=1.5) for g in request.groups])


def _manager(crs, name: str, refuse: bool) -> None:  # noqa: ANN001
    state = ManagerState(name, f"127.0.0.1:{len(crs.registry.managers) + 1}", ["vm"], 0.0)
    state._stub = _Refusing(refuse)  # type: ignore[assignment]
    crs.registry.managers[name] = state


def test_a_quote_is_priced_around_a_manager_refusing_the_crss_credentials_or_unavailable(tmp_path) -> None:
    # It escaped as INTERNAL (a traceback per quote; the AM asks up to 1000 of them), where Reserve places around.
    crs = make_crs(tmp_path)                                  # m's h0, the pack weigher's first choice
    try:
        _manager(crs, "m", refuse=True)
        with pytest.raises(Unavailable) as e:
            crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)
        assert "manager 'm'" in str(e.value) and "same control and delegation tokens" in str(e.value)
        crs.view.upsert("n", common_pb2.PhysicalResource(
            id="h1", resource_type="vm", capacity={"cores": 16, "memory_gb": 64}, used={"cores": 0, "memory_gb": 0},
            location=common_pb2.Location(site="s", rack="r", host="h1"), generation=1))
        _manager(crs, "n", refuse=False)
        quote = crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)
        assert quote.price_per_minute == 1.5 and [q.manager for q in quote.groups] == ["n"]
    finally:
        crs.db.dispose()


def test_a_manager_is_not_deregistered_while_up_nor_one_that_registered_meanwhile(tmp_path, monkeypatch) -> None:
    crs = make_crs(tmp_path)
    regs = crs.registrations
    monkeypatch.setattr(crs.registry, "_follow", lambda state: None)       # no watch stream to follow

    def register(address: str) -> None:
        regs.register(registry_pb2.RegisterManagerRequest(name="m", address=address, resource_types=["vm"],
                                                          instance_id=address), None)
    try:
        register("127.0.0.1:1")
        with pytest.raises(FailedPrecondition, match="is up .*once the CRS marks it down"):
            regs.deregister(registry_pb2.DeregisterManagerRequest(name="m"), None)
        old = crs.registry.get("m")
        old.up = False                                                       # stopped, marked down
        # A new instance registering while the deregistration probes the old address waits for it, and stays.
        late = threading.Thread(target=register, args=("127.0.0.1:2",))
        monkeypatch.setattr(registration, "serving_at", lambda address, timeout=1.0: late.start() or False)
        out = regs.deregister(registry_pb2.DeregisterManagerRequest(name="m"), None)
        late.join(10)
        assert out.name == "m"
        assert crs.registry.get("m") is not old and crs.registry.get("m").address == "127.0.0.1:2"
        with crs.db.read() as s:
            assert s.get(Manager, "m").address == "127.0.0.1:2"
        # The registry takes out only the state it was asked to.
        assert crs.registry.remove("m", expected=old) == [] and crs.registry.get("m") is not None
    finally:
        crs.db.dispose()


def test_an_up_list_read_while_the_index_changes_is_not_kept_stale() -> None:
    # A reader without the view's lock (unit prices) between the shape's bump and the list's change cached the old
    # list under the new shape: a host gone stayed listed.
    v = CapacityView()
    for hid in ("a", "b", "c"):
        v.upsert("up" if hid != "c" else "down", common_pb2.PhysicalResource(
            id=hid, resource_type="vm", capacity={"cores": 8}, location=common_pb2.Location(site="s", host=hid)))
    v.set_down("down", True)

    class Racy(list):
        def remove(self, x) -> None:  # type: ignore[no-untyped-def]
            v.of_type("vm")          # another reader, in the middle of the change
            super().remove(x)

    v._by_type["vm"] = Racy(v._by_type["vm"])
    v.remove("up", "a")
    assert [n.key for n in v.of_type("vm")] == ["up/b"]
