"""Reserve calls to one manager, batched when they overlap (cross_resource_scheduler.delegation),
against a real in-process gRPC server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from cross_resource_scheduler.delegation import Delegator
from harness.v1 import irm_pb2, irm_pb2_grpc
from services.tls import plain_channel

TIMEOUT = 10.0


class Irm(irm_pb2_grpc.ResourceManagerServicer):
    """Reserve answers after `hold` is set (so that others queue meanwhile); request ids
    starting with "full" are refused as a manager out of room would refuse them."""

    def __init__(self, batches: bool = True, batch_status: grpc.StatusCode | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.hold = threading.Event()
        self.batches = batches
        self.batch_status = batch_status

    def _one(self, req: irm_pb2.ReserveRequest) -> irm_pb2.Reservation:
        return irm_pb2.Reservation(id=f"res-{req.request_id}", tenant=req.tenant, request_id=req.request_id)

    def Reserve(self, request, context):  # noqa: N802
        self.calls.append(("Reserve", [request.request_id]))
        self.hold.wait(TIMEOUT)
        if request.request_id.startswith("full"):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"no room for {request.request_id}")
        return self._one(request)

    def ReserveBatch(self, request, context):  # noqa: N802
        if not self.batches:
            return super().ReserveBatch(request, context)  # UNIMPLEMENTED, as the generated base answers
        self.calls.append(("ReserveBatch", [r.request_id for r in request.requests]))
        if self.batch_status is not None:
            context.abort(self.batch_status, "the whole call failed")
        out = []
        for r in request.requests:
            if r.request_id.startswith("full"):
                out.append(
                    irm_pb2.ReserveOutcome(
                        error=irm_pb2.ReserveError(
                            code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                            message=f"no room for {r.request_id}",
                        )
                    )
                )
            else:
                out.append(irm_pb2.ReserveOutcome(reservation=self._one(r)))
        return irm_pb2.ReserveBatchResponse(outcomes=out)


def serve(irm: Irm) -> Iterator[Delegator]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    irm_pb2_grpc.add_ResourceManagerServicer_to_server(irm, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = plain_channel(f"127.0.0.1:{port}")
    stub = irm_pb2_grpc.ResourceManagerStub(channel)
    try:
        yield Delegator(lambda: stub)
    finally:
        channel.close()
        server.stop(0)


@pytest.fixture
def irm() -> Irm:
    return Irm()


@pytest.fixture
def delegator(irm: Irm) -> Iterator[Delegator]:
    yield from serve(irm)


def overlap(d: Delegator, irm: Irm, first: str, then: list[str]) -> dict[str, object]:
    """`first` goes out alone and stays in flight until the others have queued behind it."""
    results: dict[str, object] = {}

    def call(rid: str) -> None:
        try:
            results[rid] = d.reserve(irm_pb2.ReserveRequest(tenant="t", request_id=rid), TIMEOUT)
        except grpc.RpcError as e:
            results[rid] = e

    threads = [threading.Thread(target=call, args=(first,))]
    threads[0].start()
    deadline = time.monotonic() + TIMEOUT
    while not irm.calls and time.monotonic() < deadline:
        time.sleep(0.005)
    for rid in then:
        threads.append(threading.Thread(target=call, args=(rid,)))
        threads[-1].start()
    while d.waiting() < len(then) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert d.waiting() == len(then)
    irm.hold.set()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    return results


def test_a_lone_request_is_a_plain_reserve(delegator: Delegator, irm: Irm) -> None:
    irm.hold.set()
    assert delegator.reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1"), TIMEOUT).id == "res-r1"
    assert irm.calls == [("Reserve", ["r1"])]


def test_requests_that_overlap_share_one_call_and_keep_their_own_outcomes(
    delegator: Delegator, irm: Irm
) -> None:
    results = overlap(delegator, irm, "r0", ["r1", "full-2", "r3"])
    assert irm.calls == [("Reserve", ["r0"]), ("ReserveBatch", ["r1", "full-2", "r3"])]
    assert [results[r].id for r in ("r0", "r1", "r3")] == ["res-r0", "res-r1", "res-r3"]  # type: ignore[attr-defined]
    refused = results["full-2"]
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and refused.details() == "no room for full-2"


def test_a_failed_batch_call_fails_each_request_with_its_status() -> None:
    irm = Irm(batch_status=grpc.StatusCode.UNAVAILABLE)
    for d in serve(irm):
        results = overlap(d, irm, "r0", ["r1", "r2"])
        assert results["r0"].id == "res-r0"  # type: ignore[attr-defined]
        for rid in ("r1", "r2"):
            e = results[rid]
            assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE  # in doubt


def test_a_manager_without_reserve_batch_gets_one_reserve_per_request() -> None:
    irm = Irm(batches=False)
    for d in serve(irm):
        results = overlap(d, irm, "r0", ["r1", "full-2"])
        assert not d.batches  # remembered: no batch is tried again
        assert sorted(call for call in irm.calls) == [
            ("Reserve", ["full-2"]),
            ("Reserve", ["r0"]),
            ("Reserve", ["r1"]),
        ]
        assert results["r1"].id == "res-r1"  # type: ignore[attr-defined]
        e = results["full-2"]
        assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        irm.calls.clear()
        assert d.reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r9"), TIMEOUT).id == "res-r9"
        assert irm.calls == [("Reserve", ["r9"])]
