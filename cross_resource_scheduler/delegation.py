"""Reserve calls to one manager, batched across the wire.

Concurrent reservations for the same manager go out as one ReserveBatch call:
one RPC and one database commit at the manager for many, and their capacity
changes come back as one watch message. This is the group commit of
services/group_commit.py carried over the wire, and led by callers in the
same way: a caller with nothing in flight to the manager sends its request at
once, alone, as a plain Reserve (no added latency when idle); callers that
arrive meanwhile queue, and when the call in flight returns, the oldest of
them sends everything queued as one batch. Each request keeps its own
outcome; a refusal comes back as an RpcError with the code and message that
Reserve would have raised, so the caller's all-or-nothing and compensation
logic is the same either way.

ReserveBatch is optional in the IRM API: a manager that answers UNIMPLEMENTED
(the FPGA Orchestrator, older managers) is remembered, and from then on each
request is a plain Reserve from its own thread, concurrently, as before.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2

from harness.v1 import irm_pb2, irm_pb2_grpc
from services.batching import CallerLed, Waiter

MAX_BATCH = 64
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class Refused(grpc.RpcError):
    """One request's refusal inside a batch, shaped as the RpcError its own call would raise."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 violations: list[tuple[str, str]] | None = None, rich: list[any_pb2.Any] | None = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._violations = list(violations or [])
        self._rich = list(rich or [])

    def rich_status(self) -> status_pb2.Status:
        """The google.rpc status the request's own call would have carried (its reason, retry delay)."""
        return status_pb2.Status(code=self._code.value[0], message=self._details, details=self._rich)

    def field_violations(self) -> list[tuple[str, str]]:
        """(field, description) of an INVALID_ARGUMENT, as the manager's BadRequest would have named them."""
        return self._violations

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Item(Waiter):
    __slots__ = ("request", "alone", "reply", "error", "timeout")

    def __init__(self, request: irm_pb2.ReserveRequest, timeout: float) -> None:
        super().__init__()
        self.request = request
        self.timeout = timeout
        self.alone = False  # the manager has no ReserveBatch: send this one by itself
        self.reply: irm_pb2.Reservation | None = None
        self.error: BaseException | None = None


class Delegator:
    """Reserve at one manager; requests that overlap in time share a ReserveBatch call."""

    def __init__(
        self, stub: Callable[[], irm_pb2_grpc.ResourceManagerStub], max_batch: int = MAX_BATCH
    ) -> None:
        self._stub = stub
        self._batches: CallerLed[_Item] = CallerLed(self._lead, max_batch)
        self.batches = True  # False once the manager answered UNIMPLEMENTED

    def waiting(self) -> int:
        """Requests queued behind the call in flight (for tests)."""
        return self._batches.waiting()

    def reserve(self, request: irm_pb2.ReserveRequest, timeout: float) -> irm_pb2.Reservation:
        if not self.batches:
            return self._stub().Reserve(request, timeout=timeout)
        item = _Item(request, timeout)
        self._batches.run([item])
        if item.alone:
            return self._stub().Reserve(request, timeout=timeout)
        if item.error is not None:
            raise item.error
        assert item.reply is not None
        return item.reply

    def _lead(self, batch: list[_Item]) -> None:
        # The leader's deadline bounds the call (the others' are as long: one CRS setting).
        try:
            self._send(batch, max(i.timeout for i in batch))
        except BaseException as e:  # noqa: BLE001 - every caller in the batch gets it
            for item in batch:
                item.error = e

    def _send(self, batch: list[_Item], timeout: float) -> None:
        stub = self._stub()
        if not self.batches:  # learnt while these waited
            for item in batch:
                item.alone = True
            return
        if len(batch) == 1:
            try:
                batch[0].reply = stub.Reserve(batch[0].request, timeout=timeout)
            except grpc.RpcError as e:
                batch[0].error = e
            return
        try:
            reply = stub.ReserveBatch(
                irm_pb2.ReserveBatchRequest(requests=[i.request for i in batch]), timeout=timeout
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                # Nothing was reserved; each request goes again, alone, from its own thread.
                self.batches = False
                for item in batch:
                    item.alone = True
                return
            for item in batch:
                item.error = e  # in doubt or refused, as the call's status says
            return
        if len(reply.outcomes) != len(batch):
            for item in batch:
                item.error = Refused(
                    grpc.StatusCode.INTERNAL,
                    f"ReserveBatch answered {len(reply.outcomes)} outcomes for {len(batch)} requests",
                )
            return
        for item, outcome in zip(batch, reply.outcomes, strict=True):
            if outcome.HasField("reservation"):
                item.reply = outcome.reservation
            else:
                code = _CODES.get(outcome.error.code, grpc.StatusCode.UNKNOWN)
                if code == grpc.StatusCode.OK:  # neither a reservation nor a refusal: in doubt
                    code = grpc.StatusCode.UNKNOWN
                item.error = Refused(code, outcome.error.message,
                                     [(v.field, v.description) for v in outcome.error.field_violations],
                                     list(outcome.error.details))
