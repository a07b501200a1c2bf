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
