"""The compute IRM's servicer in-process (irm_compute.service): ReserveBatch, the generation in
replies, and capacity events coalesced into one watch message."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from harness.v1 import common_pb2, irm_pb2
from irm_compute.service import ComputeConfig, ComputeIrm, coalesce
from services.watch import Broadcaster

INVENTORY = """
hosts:
  - {id: a, site: s1, rack: r1, cores: 4, memory_gb: 8, frequency_ghz: 2.2}
  - {id: b, site: s1, rack: r1, cores: 4, memory_gb: 8, frequency_ghz: 2.2}
"""


@pytest.fixture
def irm(tmp_path: Path) -> Iterator[ComputeIrm]:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    c = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml")))
    yield c
    c.watchers.close()
    c.db.dispose()


def req(rid: str, cores: float, *hosts: str, tenant: str = "t") -> irm_pb2.ReserveRequest:
    return irm_pb2.ReserveRequest(
        tenant=tenant,
        request_id=rid,
        groups=[
            irm_pb2.ResourceGroup(
                name="g",
                resource_type="vm",
                count=len(hosts),
                placement=list(hosts),
                attributes={
                    "cores": common_pb2.AttributeRequest(number=cores),
                    "memory_gb": common_pb2.AttributeRequest(number=1),
                },
            )
        ],
    )


def generations(irm: ComputeIrm) -> dict[str, int]:
    return {h.id: h.generation for h in irm.store.hosts()}


def test_reserve_batch_answers_each_request_as_reserve_would(irm: ComputeIrm) -> None:
    before = generations(irm)
    out = irm.ReserveBatch(
        irm_pb2.ReserveBatchRequest(
            requests=[
                req("r1", 2, "a", "b"),
                req("r2", 4, "a"),  # a has 2 cores left
                req("", 1, "a"),  # no request id
                req("r3", 1, "a"),
            ]
        ),
        None,
    ).outcomes
    assert [o.WhichOneof("result") for o in out] == ["reservation", "error", "error", "reservation"]
    assert (
        out[1].error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and "no room" in out[1].error.message
    )
    assert (
        out[2].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        and "request_id" in out[2].error.message
    )
    assert [v.field for v in out[2].error.field_violations] == ["request_id"]   # as Reserve's BadRequest
    # each reply says the host's generation right after its own take
    r1 = {r.physical_id: r.physical_generation for r in out[0].reservation.groups[0].resources}
    r3 = {r.physical_id: r.physical_generation for r in out[3].reservation.groups[0].resources}
    assert r1 == {"a": before["a"] + 1, "b": before["b"] + 1} and r3 == {"a": before["a"] + 2}
    # a retry of the batch changes nothing and answers the same reservations
    again = irm.ReserveBatch(
        irm_pb2.ReserveBatchRequest(requests=[req("r1", 2, "a", "b"), req("r3", 1, "a")]), None
    ).outcomes
    assert [o.reservation.id for o in again] == [out[0].reservation.id, out[3].reservation.id]
    assert generations(irm) == {"a": before["a"] + 2, "b": before["b"] + 1}
    assert irm.store.overbooking() == []


def test_a_batch_publishes_its_changes_as_one_watch_message(irm: ComputeIrm) -> None:
    stream = irm.WatchCapacity(
        irm_pb2.WatchCapacityRequest(), type("Ctx", (), {"is_active": lambda self: True})()
    )
    snapshot = next(stream)
    assert snapshot.kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT
    assert sorted([snapshot.resource.id, *(r.id for r in snapshot.more)]) == ["a", "b"]
    assert next(stream).kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END
    irm.ReserveBatch(
        irm_pb2.ReserveBatchRequest(requests=[req("r1", 1, "a"), req("r2", 1, "b"), req("r3", 1, "a")]), None
    )
    ev = next(stream)
    assert ev.kind == irm_pb2.CapacityEvent.KIND_UPDATED
    # a once, at its newest usage; b once
    assert {r.id: (r.used["cores"], r.generation) for r in (ev.resource, *ev.more)} == {
        "a": (2, 2),
        "b": (1, 1),
    }
    stream.close()


def res(rid: str, gen: int, used: float = 0) -> common_pb2.PhysicalResource:
    return common_pb2.PhysicalResource(id=rid, generation=gen, used={"cores": used})


def test_coalesce_keeps_kinds_apart_and_each_resource_once_at_its_newest() -> None:
    up, snap, end = (
        irm_pb2.CapacityEvent.KIND_UPDATED,
        irm_pb2.CapacityEvent.KIND_SNAPSHOT,
        irm_pb2.CapacityEvent.KIND_SNAPSHOT_END,
    )
    lone = irm_pb2.CapacityEvent(kind=up, resource=res("a", 1))
    assert list(coalesce([lone])) == [lone]
    events = [
        irm_pb2.CapacityEvent(kind=snap, resource=res("a", 1)),
        irm_pb2.CapacityEvent(kind=snap, resource=res("b", 1)),
        irm_pb2.CapacityEvent(kind=end),
        irm_pb2.CapacityEvent(kind=up, resource=res("a", 3, 2)),
        irm_pb2.CapacityEvent(kind=up, resource=res("b", 2)),
        irm_pb2.CapacityEvent(kind=up, resource=res("a", 2, 1)),
    ]  # older than the one before: dropped
    out = list(coalesce(events))
    assert [
        (e.kind, [r.id for r in (e.resource, *e.more)] if e.HasField("resource") else []) for e in out
    ] == [(snap, ["a", "b"]), (end, []), (up, ["a", "b"])]
    assert out[2].resource.generation == 3 and out[2].resource.used["cores"] == 2


def test_stream_batches_hands_out_what_is_queued_at_once() -> None:
    b: Broadcaster[int] = Broadcaster()
    stream = b.stream_batches(lambda: [0, 1], lambda: True, max_batch=3)
    assert next(stream) == [0, 1]  # the snapshot; now subscribed
    b.publish([2, 3, 4, 5])
    assert next(stream) == [2, 3, 4] and next(stream) == [5]
    b.close()
    assert list(stream) == []


@contextmanager
def irm_on(tmp_path: Path, *hosts: tuple[str, int, float]) -> Iterator[ComputeIrm]:
    """A compute IRM over hosts (id, cores, GHz), 32 GB each."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + "".join(
        f"  - {{id: {h}, site: s, rack: r, cores: {c}, memory_gb: 32, frequency_ghz: {f}}}\n" for h, c, f in hosts))
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml")))
    try:
        yield irm
    finally:
        irm.watchers.close()
        irm.db.dispose()


def test_a_quote_is_what_reserve_charges_and_a_reserve_capped_at_it_passes(tmp_path: Path) -> None:
    # Reserve packs (fullest host with room first, then by id), whatever the host's frequency; the quote priced
    # the cheapest matching host, so a Reserve capped at it was refused.
    with irm_on(tmp_path, ("a-fast", 8, 3.0), ("b-slow", 8, 2.0)) as irm:
        for rid, cores in (("first", 4), ("second", 2), ("third", 4)):
            r = req(rid, cores, "")
            del r.groups[0].placement[:]
            quote = irm.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=r.groups), None)
            r.max_price_per_minute = quote.price_per_minute
            got = irm.Reserve(r, None)
            assert got.price_per_minute == pytest.approx(quote.price_per_minute), rid
        # first and second packed a-fast (6 of 8 cores), third went to b-slow: the quotes followed.
        hosts = {h.id: h.used_cores for h in irm.store.hosts()}
        assert hosts == {"a-fast": 6, "b-slow": 4}


def test_a_quote_follows_reserve_across_the_groups_of_one_request(tmp_path: Path) -> None:
    # big (8 cores) fits only b-fast; then small (1 core) goes to the fullest host with room, b-fast again --
    # not to a-slow, first by id among the hosts as they were before the request.
    with irm_on(tmp_path, ("a-slow", 4, 2.0), ("b-fast", 16, 3.0)) as irm:
        r = req("r", 8, "")
        del r.groups[0].placement[:]
        small = r.groups.add()
        small.CopyFrom(r.groups[0])
        small.name, small.attributes["cores"].number = "small", 1
        quote = irm.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=r.groups), None)
        r.max_price_per_minute = quote.price_per_minute
        assert irm.Reserve(r, None).price_per_minute == pytest.approx(quote.price_per_minute)
        assert {h.id: h.used_cores for h in irm.store.hosts()} == {"a-slow": 0, "b-fast": 9}


def test_open_streams_are_capped_and_a_closed_one_frees_its_slot() -> None:
    import pytest

    from services.errors import ResourceExhausted

    b: Broadcaster[int] = Broadcaster(max_streams=2, full="watches here; close one")
    first, second = (b.stream(lambda: [0], lambda: True, tenant="t") for _ in range(2))
    assert next(first) == 0 and next(second) == 0          # both subscribed
    third = b.stream(lambda: [0], lambda: True, tenant="t")
    with pytest.raises(ResourceExhausted, match="^2 watches here; close one$"):
        next(third)
    first.close()                                           # the client went away: its slot is free
    fourth = b.stream(lambda: [0], lambda: True, tenant="u")
    assert next(fourth) == 0
    b.publish([1])
    assert next(second) == 1 and next(fourth) == 1


def test_tenants_streams_never_take_the_control_planes_slots() -> None:
    import pytest

    from services.errors import ResourceExhausted

    b: Broadcaster[int] = Broadcaster(max_streams=2, control_streams=1, full="watches here")
    tenants = [b.stream(lambda: [0], lambda: True, tenant=t) for t in ("alice", "bob")]
    assert [next(s) for s in tenants] == [0, 0]
    with pytest.raises(ResourceExhausted, match="^2 watches here$"):
        next(b.stream(lambda: [0], lambda: True, tenant="carol"))
    crs = b.stream(lambda: [0], lambda: True)              # no tenant: the CRS following this manager
    assert next(crs) == 0
    with pytest.raises(ResourceExhausted, match="^1 control-plane watches here$"):
        next(b.stream(lambda: [0], lambda: True))


def test_the_compute_irm_caps_its_capacity_watches(tmp_path: Path) -> None:
    import pytest

    from harness.v1 import irm_pb2
    from services.errors import ResourceExhausted
    from services.watch import MAX_STREAMS

    class Ctx:
        def is_active(self) -> bool:
            return True

    with irm_on(tmp_path, ("h1", 4, 2.0)) as irm:
        streams = [irm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=f"t{i}"), Ctx()) for i in range(MAX_STREAMS)]
        for s in streams:
            next(s)
        with pytest.raises(ResourceExhausted, match="WatchCapacity streams are open on this compute IRM"):
            next(irm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="t"), Ctx()))
        for s in streams:
            s.close()


def test_with_a_control_token_get_vm_answers_the_agents_only(tmp_path: Path) -> None:
    import pytest

    from harness.v1 import compute_pb2
    from services.errors import NotFound, Unauthenticated

    class Ctx:
        def __init__(self, token: str) -> None:
            self.metadata = (("x-harness-control-token", token),) if token else ()

        def invocation_metadata(self):  # type: ignore[no-untyped-def]
            return self.metadata

    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8}\n")
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml"),
                                   control_token="s3cret"))
    try:
        for token in ("", "guess"):
            with pytest.raises(Unauthenticated):
                irm.GetVm(compute_pb2.GetVmRequest(vm_id="vm-x"), Ctx(token))   # who owns vm-x: not said
        with pytest.raises(NotFound):
            irm.GetVm(compute_pb2.GetVmRequest(vm_id="vm-x"), Ctx("s3cret"))   # the agent: a real answer
    finally:
        irm.watchers.close()
        irm.db.dispose()


def test_a_reserve_refused_for_its_price_takes_nothing_and_leaves_its_id_free(irm: ComputeIrm) -> None:
    from services.errors import FailedPrecondition

    before = generations(irm)
    capped = req("k", 1, "a")
    capped.max_price_per_minute = 0.01
    with pytest.raises(FailedPrecondition, match="exceeds max_price_per_minute"):
        irm.Reserve(capped, None)
    [refused] = irm.ReserveBatch(irm_pb2.ReserveBatchRequest(requests=[capped]), None).outcomes
    assert refused.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    # never recorded (not even as released), capacity never taken
    listed = irm.ListReservations(irm_pb2.ListReservationsRequest(tenant="t", include_released=True), None)
    assert list(listed.reservations) == [] and generations(irm) == before
    capped.max_price_per_minute = 1.0          # the retry with a higher cap is a reservation of its own
    assert irm.Reserve(capped, None).state == irm_pb2.Reservation.STATE_ACTIVE


def test_a_price_cap_that_is_not_a_number_is_invalid_argument(irm: ComputeIrm) -> None:
    from services.errors import InvalidArgument

    capped = req("k", 1, "a")
    capped.max_price_per_minute = float("nan")
    with pytest.raises(InvalidArgument, match="max_price_per_minute"):
        irm.Reserve(capped, None)


def test_a_request_id_reused_for_a_different_request_is_invalid_argument_on_request_id(irm: ComputeIrm) -> None:
    from services.errors import InvalidArgument

    first = irm.Reserve(req("k", 1, "a"), None)
    assert irm.Reserve(req("k", 1, "a"), None).id == first.id                 # a retry: its reservation
    capped = req("k", 1, "a")
    capped.max_price_per_minute = 1.0
    for different in (req("k", 2, "b"), capped):                              # other shape, or other cap
        with pytest.raises(InvalidArgument) as e:
            irm.Reserve(different, None)
        assert [(v.field, v.description) for v in e.value.violations] == [
            ("request_id", "request_id reused with a different request; use a new request_id")]
    [batched] = irm.ReserveBatch(irm_pb2.ReserveBatchRequest(requests=[req("k", 2, "b")]), None).outcomes
    assert batched.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert [v.field for v in batched.error.field_violations] == ["request_id"]
    assert generations(irm)["b"] == 0 and irm.store.overbooking() == []


def test_the_request_hash_ignores_the_request_id_and_the_order_attributes_were_set_in() -> None:
    from services.idempotency import request_hash

    one = req("k1", 2, "a")
    other = req("k2", 2, "a")
    reordered = irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, placement=["a"])
    reordered.attributes["memory_gb"].number = 1
    reordered.attributes["cores"].number = 2
    del other.groups[:]
    other.groups.append(reordered)
    assert request_hash(one) == request_hash(other) and one.request_id == "k1"   # the request is not changed
    assert request_hash(one) != request_hash(req("k1", 3, "a"))
    assert request_hash(one) != request_hash(req("k1", 2, "a", tenant="u"))


def test_a_negative_or_nan_price_cap_is_invalid_argument(tmp_path: Path) -> None:
    from services.errors import InvalidArgument

    with irm_on(tmp_path, ("a", 8, 3.0)) as irm:
        for cap in (-0.01, float("nan")):
            r = req(f"cap{cap}", 2, "")
            del r.groups[0].placement[:]
            r.max_price_per_minute = cap
            with pytest.raises(InvalidArgument) as e:
                irm.Reserve(r, None)
            assert [v.field for v in e.value.violations] == ["max_price_per_minute"], cap
        assert {h.id: h.used_cores for h in irm.store.hosts()} == {"a": 0}     # nothing reserved
        r = req("free-cap", 2, "")
        del r.groups[0].placement[:]
        r.max_price_per_minute = 0.0        # a cap of 0 is a cap (this host is not free): over price, not invalid
        with pytest.raises(Exception) as e:
            irm.Reserve(r, None)
        assert type(e.value).__name__ == "FailedPrecondition", e.value


def test_the_spec_says_which_attributes_are_required_and_whole(tmp_path: Path) -> None:
    # A client of another language learns from DescribeAllocationSpec alone what Reserve refuses.
    from services.errors import InvalidArgument

    with irm_on(tmp_path, ("a", 8, 3.0)) as irm:
        vm = irm.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(tenant="t"), None).resource_types[0]
        flags = {a.name: (a.required, a.integer, a.HasField("default")) for a in vm.attributes}
        assert flags == {"cores": (True, True, False), "memory_gb": (True, False, False),
                         "frequency_ghz": (False, False, True)}
        for name, (required, _, _) in flags.items():
            r = req(f"no-{name}", 2, "")
            del r.groups[0].placement[:]
            if name in r.groups[0].attributes:
                del r.groups[0].attributes[name]
            if required:
                with pytest.raises(InvalidArgument):
                    irm.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=r.groups), None)
            else:
                irm.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=r.groups), None)
        r = req("half", 2, "")
        r.groups[0].attributes["cores"].number = 1.5
        with pytest.raises(InvalidArgument):
            irm.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=r.groups), None)


def test_a_reservation_says_a_vm_larger_than_this_machines_memory_is_confined(irm: ComputeIrm, monkeypatch) -> None:
    # The machine reading is faked at 4 GB (default reserve 512 MB: VMs get at most 3584 MB here).
    from irm_compute import sandbox

    monkeypatch.setattr(sandbox, "machine_memory_mb", lambda: 4096.0)
    small, large = req("small", 1, "a"), req("large", 1, "b")
    large.groups[0].attributes["memory_gb"].number = 6
    assert not [n for n in irm.Reserve(small, None).notes if "MB per VM" in n]
    notes = irm.Reserve(large, None).notes
    assert any("6144 MB per VM, this machine has 4096 MB" in n and "3584 MB with the default reserve" in n
               for n in notes), notes
