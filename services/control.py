"""A shared secret between services that call each other's internal RPCs: the FPGA Orchestrator and its
FPGA-servers (group parts, clients, server state), the compute IRM and its agents (GetVm; ReleaseVm,
GetVmMetrics).

A server configured with a control token takes those calls only from a caller that sends the same token in the
call's metadata: a tenant who can reach the address cannot, e.g., take over another tenant's group part. An
empty token checks nothing (a development setup); `harness up` makes one for every suite, compose takes
`HARNESS_CONTROL_TOKEN`.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from typing import Any

import grpc

from services.errors import Unauthenticated

METADATA_KEY = "x-harness-control-token"
log = logging.getLogger(__name__)


def sent(token: str, context: Any) -> bool:
    """Whether the call carries `token` (True when it is empty: nothing to check)."""
    if not token:
        return True
    given = dict(context.invocation_metadata() or ()).get(METADATA_KEY, "")
    return hmac.compare_digest(given.encode(), token.encode())


# The tenant key of a WatchCapacity stream that names no tenant and does not send the control token (no tenant id
# holds a NUL): counted among the tenants' streams, under the per-tenant cap, never in the control plane's slots.
ANONYMOUS_WATCHER = "\x00anonymous"
_warned_anonymous = threading.Event()


def watch_tenant(tenant: str, token: str, context: Any) -> str:
    """Whose WatchCapacity stream this is, for the stream caps (services.watch): `tenant`; with none, the control
    plane ("") if the call sends `token` (or none is configured), else `ANONYMOUS_WATCHER`.

    The control plane's slots are kept for callers that prove they are it: anyone leaving the tenant out took
    them and locked the CRS out of a manager's capacity. A stream without either is still served, as a tenant's:
    a CRS configured without the manager's token (an older CRS, a suite whose CRS has none) follows it as before,
    within the tenants' caps. The first such stream is logged once, to say how to give it a slot of its own.
    """
    if tenant:
        return tenant
    if sent(token, context):
        return ""
    if not _warned_anonymous.is_set():
        _warned_anonymous.set()
        log.warning("a WatchCapacity stream without a tenant did not send this service's control token: served as "
                    "a tenant's stream (within the tenants' caps), not in the control plane's reserved slots; give "
                    "the CRS that follows this manager the same control_token")
    return ANONYMOUS_WATCHER


REFUSAL_LOGGED_EVERY_S = 60.0
_refusals_logged: dict[str, float] = {}     # per kind of caller (token sent or not): when last logged
_refusals_lock = threading.Lock()


def check(token: str, context: Any, what: str) -> None:
    """UNAUTHENTICATED unless the call carries `token` (nothing to check when it is empty). A refusal is logged
    here too, at most once a minute per kind (a token that differs, none sent): the caller's log may be the only
    other place a token mismatch between two services shows (an Orchestrator whose FPGA-servers refuse it)."""
    if not sent(token, context):
        given = bool(dict(context.invocation_metadata() or ()).get(METADATA_KEY, ""))
        kind = "a control token that differs from this service's" if given else "no control token"
        now = time.monotonic()
        with _refusals_lock:
            due = now - _refusals_logged.get(kind, -REFUSAL_LOGGED_EVERY_S) >= REFUSAL_LOGGED_EVERY_S
            if due:
                _refusals_logged[kind] = now
        if due:
            peer = context.peer() if hasattr(context, "peer") else ""
            log.warning(f"refused a control call carrying {kind}: if it came from this suite's control plane (the "
                        f"Orchestrator, the compute IRM, the CRS), give both services the same control_token "
                        f"(HARNESS_CONTROL_TOKEN in compose); said at most once a minute",
                        extra={"peer": peer, "service": what})
        raise Unauthenticated(f"{what} takes control calls from its control plane only (a control token)")


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    def _with(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), (METADATA_KEY, self._token)]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with(client_call_details), request)


def channel(base: grpc.Channel, token: str) -> grpc.Channel:
    """`base`, sending `token` with every call (as it is when the token is empty)."""
    return grpc.intercept_channel(base, _Token(token)) if token else base
