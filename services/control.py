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
from typing import Any

import grpc

from services.errors import InvalidArgument, Unauthenticated

METADATA_KEY = "x-harness-control-token"


def sent(token: str, context: Any) -> bool:
    """Whether the call carries `token` (True when it is empty: nothing to check)."""
    if not token:
        return True
    given = dict(context.invocation_metadata() or ()).get(METADATA_KEY, "")
    return hmac.compare_digest(given.encode(), token.encode())


CONTROL_PLANE_WATCH = ("required: give your tenant (a stream without one is the control plane's: the CRS following "
                       "this manager, which sends its control token)")


def watch_caller(tenant: str, token: str, context: Any) -> None:
    """A WatchCapacity caller names its tenant, or is the control plane and sends `token`: a stream without a
    tenant takes one of the control plane's slots (services.watch), and anyone leaving the tenant out could take
    them all and lock the CRS out of a manager's capacity. INVALID_ARGUMENT on `tenant` otherwise."""
    if not tenant and not sent(token, context):
        raise InvalidArgument.of("tenant", CONTROL_PLANE_WATCH)


def check(token: str, context: Any, what: str) -> None:
    """UNAUTHENTICATED unless the call carries `token` (nothing to check when it is empty)."""
    if not sent(token, context):
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
