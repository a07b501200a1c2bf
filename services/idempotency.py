"""Idempotency by request id, as every service keeps it: a retry gets the first request's result; the same id
with another request is refused (answering with the first one's result would hand the client something it did
not ask for)."""

from __future__ import annotations

import hashlib

from google.protobuf.message import Message

from services.errors import InvalidArgument


def request_hash(request: Message) -> str:
    """What a request asks for, whatever its `request_id`: the id's replays must carry the same.

    Deterministic serialization orders the map fields, so equal requests hash equal within one protobuf
    runtime (the point: a client's retry, minutes later, against the same server).
    """
    content = type(request)()
    content.CopyFrom(request)
    content.ClearField("request_id")
    return hashlib.sha256(content.SerializeToString(deterministic=True)).hexdigest()


def reused_request_id() -> InvalidArgument:
    return InvalidArgument.of("request_id", "request_id reused with a different request; use a new request_id")


def reservation_key(request: Message) -> tuple[str, str]:
    """A GetReservationRequest's key as (reservation_id, request_id), one of them set: INVALID_ARGUMENT naming the
    field when neither is given or the one given is empty (an empty id is no reservation's: NOT_FOUND would say
    the request was fine)."""
    key = request.WhichOneof("key")
    if key == "reservation_id" and request.reservation_id:      # type: ignore[attr-defined]
        return request.reservation_id, ""                       # type: ignore[attr-defined]
    if key == "request_id" and request.request_id:              # type: ignore[attr-defined]
        return "", request.request_id                           # type: ignore[attr-defined]
    if key == "reservation_id":
        raise InvalidArgument.of("reservation_id", "required: the id Reserve answered with (or give request_id "
                                                   "instead)")
    if key == "request_id":
        raise InvalidArgument.of("request_id", "required: the request_id the reservation was made with (or give "
                                               "reservation_id instead)")
    raise InvalidArgument.of("reservation_id", "give reservation_id or request_id")


def request_id_problem(request_id: str, most: int) -> str | None:
    """What is wrong with a client-chosen idempotency key, for an INVALID_ARGUMENT on `request_id`; None if nothing.
    A missing one and one too long are told apart: "required" on a 1 MB id sends its author looking elsewhere."""
    if not request_id:
        return f"required: a client-chosen idempotency key of 1-{most} characters"
    if len(request_id) > most:
        return f"at most {most} characters, got {len(request_id)} (a client-chosen idempotency key of 1-{most} characters)"
    return None
