"""Client side helpers: one cached channel per address, deadlines always set."""

from __future__ import annotations

import threading
from typing import Any

import grpc

from services import tls

DEFAULT_TIMEOUT_S = 10.0

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Fail fast on a dead peer instead of waiting for the deadline every time.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]

_lock = threading.Lock()
_channels: dict[str, grpc.Channel] = {}


# grpc's connectivity state of a channel that failed to connect and waits out its back-off.
_TRANSIENT_FAILURE = grpc.ChannelConnectivity.TRANSIENT_FAILURE.value[0]


def _backing_off(ch: grpc.Channel) -> bool:
    """Whether `ch` failed to connect and is waiting out its back-off (every call on it failing at once meanwhile).
    Read without connecting, through grpc's own channel object: `subscribe` would cost a polling thread per
    channel; a grpc without it says no."""
    try:
        return ch._channel.check_connectivity_state(False) == _TRANSIENT_FAILURE  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an internal of grpc's: without it, the channel is kept as before
        return False


def channel(address: str) -> grpc.Channel:
    """A shared channel to `address` (reusing channels halves RPC latency). One that failed to connect is
    replaced: it would fail every call until its back-off ends, though the peer may be back (restarted, or a new
    server on that port), and a new channel connects at once. Calls in flight on the old one are left to end (it
    is closed once nothing holds it)."""
    with _lock:
        ch = _channels.get(address)
        if ch is None or _backing_off(ch):
            ch = tls.open_channel(address, CHANNEL_OPTIONS)
            _channels[address] = ch
        return ch


def drop(address: str) -> None:
    with _lock:
        ch = _channels.pop(address, None)
    if ch is not None:
        ch.close()


def close_all() -> None:
    with _lock:
        chans = list(_channels.values())
        _channels.clear()
    for ch in chans:
        ch.close()


class RepeatedPageToken(grpc.RpcError):
    """A server handed back a page token it had already given: reading on would never end. An RpcError (code
    INTERNAL: the server is at fault), so a caller's handling of failed calls covers it."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self._details = (f"the server gave page token {token!r} a second time: stopped reading pages "
                         "(they would repeat forever)")

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INTERNAL

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()

    def __str__(self) -> str:
        return self._details


def all_pages(call: Any, request: Any, field: str, timeout: float = 30.0) -> Any:
    """Every page of a paged List call (`page_token` in, `next_page_token` out) as one reply (its other fields
    from the first page). `request` is left as given (a copy carries the tokens); a token the server gives
    twice is RepeatedPageToken."""
    request = _copy(request)
    seen = {request.page_token}
    out = None
    while True:
        reply = call(request, timeout=timeout)
        if out is None:
            out = type(reply)()
            out.CopyFrom(reply)
        else:
            getattr(out, field).extend(getattr(reply, field))
        if not reply.next_page_token:
            out.next_page_token = ""
            return out
        if reply.next_page_token in seen:
            raise RepeatedPageToken(reply.next_page_token)
        seen.add(reply.next_page_token)
        request.page_token = reply.next_page_token


def _copy(message: Any) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy
