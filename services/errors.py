"""Domain errors and their one mapping to gRPC statuses.

Service code raises these; the interceptor in services.server turns them into
statuses with google.rpc details. Anything else that escapes a handler becomes
INTERNAL with a log line, never UNKNOWN and never a traceback on the wire.

A status code alone does not tell a client what to do (FAILED_PRECONDITION is
"never fits" and "over your price cap" and "no model yet"): an error may carry
a machine-readable `reason`, sent as a google.rpc.ErrorInfo (domain
"harness.v1"), and `retry_after_s`, sent as a google.rpc.RetryInfo. The
reasons below are the wire contract; protos/harness/v1/common.proto lists them
for clients in other languages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

# google.rpc.ErrorInfo.domain of every reason below.
DOMAIN = "harness.v1"

# The reasons (google.rpc.ErrorInfo.reason). Each is one a client branches on; common.proto documents them.
NEVER_FITS = "NEVER_FITS"                    # FAILED_PRECONDITION: cannot fit as asked, even on empty resources
OVER_PRICE = "OVER_PRICE"                    # FAILED_PRECONDITION: the price is over max_price_per_minute
CAPACITY_IN_USE = "CAPACITY_IN_USE"          # RESOURCE_EXHAUSTED: it fits once others release: retry later
SEARCH_GAVE_UP = "SEARCH_GAVE_UP"            # RESOURCE_EXHAUSTED: the bounded placement search found nothing
STREAM_CAP = "STREAM_CAP"                    # RESOURCE_EXHAUSTED: too many streams open: close one, or poll
MANAGER_DOWN = "MANAGER_DOWN"                # UNAVAILABLE: a resource manager is down (missed its heartbeats)
MANAGER_UNAVAILABLE = "MANAGER_UNAVAILABLE"  # UNAVAILABLE: a manager did not answer, or is overloaded
NO_MODEL = "NO_MODEL"                        # FAILED_PRECONDITION: no usable performance model: profile
SLO_UNATTAINABLE = "SLO_UNATTAINABLE"        # FAILED_PRECONDITION: no configuration measured meets the SLO
PROFILING_IN_PROGRESS = "PROFILING_IN_PROGRESS"  # FAILED_PRECONDITION: a session profiles the application
APPLICATION_STALE = "APPLICATION_STALE"      # FAILED_PRECONDITION: stored application no longer valid: resubmit
VM_RELEASED = "VM_RELEASED"                  # FAILED_PRECONDITION: the VM's reservation was released
STREAM_BEHIND = "STREAM_BEHIND"              # RESOURCE_EXHAUSTED: a watch stream not read fell behind: reconnect
QUEUE_FULL = "QUEUE_FULL"                    # RESOURCE_EXHAUSTED: the tenant's ready queue is full: retire or wait
DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"  # UNAVAILABLE: the service's database failed (disk full, down): retry
RESERVATION_PENDING = "RESERVATION_PENDING"  # ABORTED: a Reserve under this request id is still being placed: ask again
PIN_UNKNOWN = "PIN_UNKNOWN"                  # RESOURCE_EXHAUSTED: a pinned resource is not known (now): place again
PIN_REFUSED = "PIN_REFUSED"                  # FAILED_PRECONDITION: a pinned resource never takes the group: elsewhere
CREDENTIALS_REFUSED = "CREDENTIALS_REFUSED"  # UNAVAILABLE: a manager refused this service's tokens: the operators'
REASONS = (NEVER_FITS, OVER_PRICE, CAPACITY_IN_USE, SEARCH_GAVE_UP, STREAM_CAP, MANAGER_DOWN, MANAGER_UNAVAILABLE,
           NO_MODEL, SLO_UNATTAINABLE, PROFILING_IN_PROGRESS, APPLICATION_STALE, VM_RELEASED, STREAM_BEHIND,
           QUEUE_FULL, DATABASE_UNAVAILABLE, RESERVATION_PENDING, PIN_UNKNOWN, PIN_REFUSED, CREDENTIALS_REFUSED)

# RetryInfo of an error whose cause passes with time (capacity in use, a manager away): how long a client waits
# at least before it tries again.
RETRY_LATER_S = 5.0

# ErrorInfo's own rules: UPPER_SNAKE_CASE, at most 63 characters.
_REASON = re.compile(r"[A-Z][A-Z0-9_]{0,61}[A-Z0-9]")
_METADATA_ENTRIES, _METADATA_KEY_BYTES, _METADATA_VALUE_BYTES = 8, 64, 256
# An ErrorInfo takes at most this much of MAX_DETAILS_BYTES (it goes first: the rest is the field violations').
_ERROR_INFO_BYTES = 768


@dataclass
class FieldViolation:
    field: str
    description: str


@dataclass
class HarnessError(Exception):
    """`reason` (keyword only): what a client branches on, one of REASONS (sent as a google.rpc.ErrorInfo with
    `metadata`, a few short strings naming what it is about); `retry_after_s`: how long to wait before trying
    again, when waiting helps (sent as a google.rpc.RetryInfo)."""

    message: str
    code: grpc.StatusCode = field(default=grpc.StatusCode.INTERNAL, init=False)
    reason: str = field(default="", kw_only=True)
    retry_after_s: float | None = field(default=None, kw_only=True)
    metadata: dict[str, str] = field(default_factory=dict, kw_only=True)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        self.with_reason(self.reason, self.retry_after_s)

    def __str__(self) -> str:
        return self.message

    def with_reason(self, reason: str, retry_after_s: float | None = None, **metadata: str) -> Self:
        """This error with `reason` (and the rest) set, for raising again; the arguments are checked here, where
        a mistake is the code's, not on the wire."""
        if reason and not _REASON.fullmatch(reason):
            raise ValueError(f"an error reason is UPPER_SNAKE_CASE of at most 63 characters, got {reason!r}")
        if retry_after_s is not None and not (math.isfinite(retry_after_s) and retry_after_s >= 0):
            raise ValueError(f"retry_after_s must be a finite number of seconds >= 0, got {retry_after_s!r}")
        self.reason, self.retry_after_s = reason, retry_after_s
        self.metadata.update(metadata)
        return self

    def details(self) -> list[any_pb2.Any]:
        """google.rpc details: an ErrorInfo when a reason is set, a RetryInfo when retry_after_s is."""
        out: list[any_pb2.Any] = []
        if self.reason:
            packed = any_pb2.Any()
            packed.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN,
                                                    metadata={str(k): str(v) for k, v in self.metadata.items()}))
            out.append(packed)
        if self.retry_after_s is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(round(self.retry_after_s * 1e9))
            packed = any_pb2.Any()
            packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            out.append(packed)
        return out


@dataclass
class InvalidArgument(HarnessError):
    """Bad input. `violations` name each offending field and what is expected."""

    violations: list[FieldViolation] = field(default_factory=list)
    code: grpc.StatusCode = field(default=grpc.StatusCode.INVALID_ARGUMENT, init=False)

    @classmethod
    def of(cls, field_path: str, description: str) -> InvalidArgument:
        return cls(f"{field_path}: {description}", [FieldViolation(field_path, description)])

    def details(self) -> list[any_pb2.Any]:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in self.violations
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad)
        return [*super().details(), packed]


class Violations:
    """Collects field violations so one response lists every problem at once."""

    def __init__(self) -> None:
        self.items: list[FieldViolation] = []

    def add(self, field_path: str, description: str) -> None:
        self.items.append(FieldViolation(field_path, description))

    def check(self, ok: bool, field_path: str, description: str) -> bool:
        if not ok:
            self.add(field_path, description)
        return ok

    def raise_if_any(self) -> None:
        if self.items:
            summary = "; ".join(f"{v.field}: {v.description}" for v in self.items)
            raise InvalidArgument(summary, list(self.items))


@dataclass
class NotFound(HarnessError):
    code: grpc.StatusCode = field(default=grpc.StatusCode.NOT_FOUND, init=False)


@dataclass
class ResourceExhausted(HarnessError):
    code: grpc.StatusCode = field(default=grpc.StatusCode.RESOURCE_EXHAUSTED, init=False)


@dataclass
class FailedPrecondition(HarnessError):
    code: grpc.StatusCode = field(default=grpc.StatusCode.FAILED_PRECONDITION, init=False)


@dataclass
class Aborted(HarnessError):
    """A concurrent update won; the caller may retry."""

    code: grpc.StatusCode = field(default=grpc.StatusCode.ABORTED, init=False)


@dataclass
class PermissionDenied(HarnessError):
    code: grpc.StatusCode = field(default=grpc.StatusCode.PERMISSION_DENIED, init=False)


@dataclass
class Unavailable(HarnessError):
    code: grpc.StatusCode = field(default=grpc.StatusCode.UNAVAILABLE, init=False)


@dataclass
class Unauthenticated(HarnessError):
    code: grpc.StatusCode = field(default=grpc.StatusCode.UNAUTHENTICATED, init=False)


# A gRPC client refuses trailers (grpc-message, percent-encoded, plus grpc-status-details-bin, which holds the
# message again and the details) over 16 KiB, and those over 8 KiB at random (its soft limit): the caller then sees
# RESOURCE_EXHAUSTED "Stream removed" instead of the error. A message that echoes a caller's huge input is cut to
# this many UTF-8 bytes, and the details (ErrorInfo, RetryInfo, field violations) to the next: at most about
# 1 KiB x 3 (percent-encoding) + 1 KiB + 2 KiB on the wire, well within the soft limit.
MAX_MESSAGE_BYTES = 1024
MAX_DETAILS_BYTES = 2048
_FIELD_BYTES, _DESCRIPTION_BYTES = 128, 512


def bounded(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text`, or its head and its tail (at most `limit` bytes with the marker between them, saying how much was
    cut). The tail too: a message relayed from another service ends with what it means here ("...; nothing was
    reserved"), and the echo that made it long is usually in the middle."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text
    marker = f" [... {len(raw)} bytes in all: cut to fit a gRPC status ...] "
    room = max(0, limit - len(marker.encode()))
    head, tail = room * 2 // 3, room // 3
    return (raw[:head].decode("utf-8", "ignore") + marker
            + (raw[len(raw) - tail:].decode("utf-8", "ignore") if tail else ""))


def _bounded_details(details: list[any_pb2.Any]) -> list[any_pb2.Any]:
    """The details within MAX_DETAILS_BYTES: each field violation's text bounded, and as many as fit; an
    ErrorInfo's metadata cut to a few short entries."""
    out: list[any_pb2.Any] = []
    size = 0
    for detail in details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            kept_info = error_details_pb2.ErrorInfo(reason=info.reason[:63], domain=info.domain[:64])
            for k, v in sorted(info.metadata.items())[:_METADATA_ENTRIES]:
                key = bounded(k, _METADATA_KEY_BYTES)
                kept_info.metadata[key] = bounded(v, _METADATA_VALUE_BYTES)
                if kept_info.ByteSize() > _ERROR_INFO_BYTES:
                    del kept_info.metadata[key]     # the rest are left out: the reason always goes
                    break
            detail = any_pb2.Any()
            detail.Pack(kept_info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            kept = error_details_pb2.BadRequest()
            for v in bad.field_violations:
                kept.field_violations.add(field=bounded(v.field, _FIELD_BYTES),
                                          description=bounded(v.description, _DESCRIPTION_BYTES))
                if kept.ByteSize() > MAX_DETAILS_BYTES - size - 64:
                    del kept.field_violations[-1]          # the rest are left out (the message still names them)
                    break
            detail = any_pb2.Any()
            detail.Pack(kept)
        if size + detail.ByteSize() > MAX_DETAILS_BYTES:
            break
        out.append(detail)
        size += detail.ByteSize()
    return out


def to_status(error: HarnessError) -> status_pb2.Status:
    """`error` as a google.rpc status, bounded so that gRPC can always send it (see MAX_MESSAGE_BYTES)."""
    return status_pb2.Status(
        code=getattr(code_pb2, error.code.name),
        message=bounded(error.message),
        details=_bounded_details(error.details()),
    )


def field_violations(rpc_error: grpc.RpcError) -> list[tuple[str, str]]:
    """Client side: the (field, description) pairs of an INVALID_ARGUMENT."""
    from grpc_status import rpc_status

    status = rpc_status.from_call(rpc_error)  # type: ignore[arg-type]
    out: list[tuple[str, str]] = []
    if status is None:
        return out
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            out += [(v.field, v.description) for v in bad.field_violations]
    return out


def owned(tenant: str, owner: str, what: str) -> None:
    """PERMISSION_DENIED unless `tenant` owns the object."""
    if tenant != owner:
        raise PermissionDenied(f"{what} belongs to another tenant")


def require_tenant(tenant: str) -> str:
    if not tenant:
        raise InvalidArgument.of("tenant", "required: name the calling tenant")
    if len(tenant) > 128:
        raise InvalidArgument.of("tenant", "at most 128 characters")
    return tenant


def require_since(since: float, field_name: str = "since") -> float:
    """A `since` of metrics requests: seconds since the epoch, 0 (or anything before the first sample) for all;
    NaN or an infinity is no time (NaN compared false with every sample and answered nothing)."""
    if not math.isfinite(since):
        raise InvalidArgument.of(field_name, f"a time in seconds since the epoch (0: every sample), got {since}")
    return since


def _peer_status(e: grpc.RpcError) -> status_pb2.Status | None:
    """A peer's google.rpc status (from grpc-status-details-bin); None when it sent none or it cannot be read."""
    from google.protobuf.message import DecodeError
    from grpc_status import rpc_status

    if not isinstance(e, grpc.Call):
        # An error built on this side (one refusal of a batch) may say the status its own call would have had.
        rich = getattr(e, "rich_status", None)
        return rich() if callable(rich) else None
    try:
        return rpc_status.from_call(e)  # type: ignore[arg-type]
    except (ValueError, DecodeError):  # a rich status contradicting the call's own status is not this call's
        return None


def _peer_violations(e: grpc.RpcError) -> list[FieldViolation]:
    """The field violations in a peer's google.rpc status; none when it sent none or they cannot be read."""
    if not isinstance(e, grpc.Call):
        # An error built on this side: one refusal of a batch says its violations itself, if it has any.
        carried = getattr(e, "field_violations", None)
        return [FieldViolation(f, d) for f, d in carried()] if callable(carried) else []
    status = _peer_status(e)
    out: list[FieldViolation] = []
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            out += [FieldViolation(v.field, v.description) for v in bad.field_violations]
    return out


def error_info(rpc_error: grpc.RpcError) -> tuple[str, dict[str, str]] | None:
    """Client side: the (reason, metadata) of an error's google.rpc.ErrorInfo of domain "harness.v1" (see
    REASONS), or None when it has none (or a malformed one)."""
    status = _peer_status(rpc_error)
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN and _REASON.fullmatch(info.reason):
                return info.reason, dict(info.metadata)
    return None


def retry_delay_s(rpc_error: grpc.RpcError) -> float | None:
    """Client side: the seconds of an error's google.rpc.RetryInfo, or None when it has none."""
    status = _peer_status(rpc_error)
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay = info.retry_delay.ToNanoseconds() / 1e9
            return delay if math.isfinite(delay) and delay >= 0 else None
    return None


def from_rpc_error(peer: str, e: grpc.RpcError, consequence: str = "",
                   field_path: Callable[[str], str] | None = None) -> HarnessError:
    """A peer's failure, passed on to our caller as the matching domain error.

    `peer` names who failed (e.g. "manager 'compute-a'"); `consequence` says
    what it means for the caller (e.g. "nothing was reserved"). An
    INVALID_ARGUMENT keeps the peer's field violations; `field_path`, when the
    peer was sent part of our caller's request, says how a field of the peer's
    request is named in the caller's (e.g. its `groups[0]` is the caller's
    `groups[2]`). The peer's reason (ErrorInfo, domain "harness.v1") and
    RetryInfo are kept: the caller branches on what the peer said (a reason
    only with the code it came with: each reason goes with one code).
    """
    error = _from_rpc_error(peer, e, consequence, field_path)
    info = error_info(e)
    if info is not None and error.code == e.code():
        error.reason, error.metadata = info[0], dict(info[1])
    if (delay := retry_delay_s(e)) is not None:
        error.retry_after_s = delay
    return error


def _from_rpc_error(peer: str, e: grpc.RpcError, consequence: str,
                    field_path: Callable[[str], str] | None) -> HarnessError:
    code, detail = e.code(), e.details() or ""
    tail = f"; {consequence}" if consequence else ""
    text = f"{peer}: {detail}{tail}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        theirs = _peer_violations(e)
        ours = [FieldViolation(field_path(v.field) if field_path else v.field, v.description) for v in theirs]
        if ours != theirs:
            # The peer's message names fields of its request: say it again in the caller's terms.
            text = f"{peer}: " + "; ".join(f"{v.field}: {v.description}" for v in ours) + tail
        return InvalidArgument(text, ours)
    by_code = {
        grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
        grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
        grpc.StatusCode.NOT_FOUND: NotFound,
        grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    }
    if code in by_code:
        return by_code[code](text)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return Unavailable(f"{peer} did not answer ({code.name}){tail}, retry")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        # The caller's credentials reached us; the peer refused ours (a control or delegation token the services'
        # operator set apart): no retry of the tenant's helps, and it is no fault of the tenant's request.
        return Unavailable(f"{text} (UNAUTHENTICATED: the services' operator must give them the same control and "
                           "delegation tokens)")
    return Aborted(f"{text} ({code.name})")
