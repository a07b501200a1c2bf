"""A manager's answers as the CRS's tenant reads them: a refusal keeps its reason and advice, names the manager,
and names its fields as the tenant's request does (the manager was sent its own part of that request); and which
answers prove the manager did not commit what it was asked.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import grpc

from harness.v1 import irm_pb2
from services.errors import (
    CREDENTIALS_REFUSED,
    MANAGER_DOWN,
    MANAGER_UNAVAILABLE,
    RETRY_LATER_S,
    HarnessError,
    Unavailable,
    error_info,
    from_rpc_error,
)

# Answers after which a manager certainly did not commit (anything else: it may have, or may yet).
DEFINITE_REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                     grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND,
                     grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS,
                     # Credentials are checked before any work: a manager refusing ours made nothing.
                     grpc.StatusCode.UNAUTHENTICATED}
# UNAVAILABLE with these reasons is a CRS below answering that it reserved nothing (a manager of its down, or slow
# to take more): a definite refusal, not a call in doubt (which carries no reason: it was not answered).
ANSWERED_UNAVAILABLE = {MANAGER_DOWN, MANAGER_UNAVAILABLE}


def definite(e: grpc.RpcError) -> bool:
    """Whether a manager's failed Reserve certainly reserved nothing (else it may commit it yet: in doubt)."""
    if e.code() in DEFINITE_REFUSALS:
        return True
    info = error_info(e) if e.code() == grpc.StatusCode.UNAVAILABLE else None
    return info is not None and info[0] in ANSWERED_UNAVAILABLE


_GROUP_PATH = re.compile(r"groups\[(\d+)\](.*)", re.DOTALL)


def err_from_rpc(manager: str, e: grpc.RpcError, field_path: Callable[[str], str] | None = None,
                 consequence: str = "nothing was reserved") -> HarnessError:
    """A manager's refusal for the tenant: its reason (ErrorInfo) and RetryInfo kept, the manager named in the
    metadata; a manager that did not answer is MANAGER_UNAVAILABLE. `consequence`: what it means for the call
    ("" for a read)."""
    error = from_rpc_error(f"manager {manager!r}", e, consequence, field_path)
    # A manager that did not answer: retry later. One that refused our credentials: no retry helps (its operator),
    # and it said so (a considered answer: nothing was reserved, nothing in doubt).
    if not error.reason and isinstance(error, Unavailable):
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            error.with_reason(CREDENTIALS_REFUSED, None)
        else:
            error.with_reason(MANAGER_UNAVAILABLE, RETRY_LATER_S)
    if error.reason:
        error.metadata.setdefault("manager", manager)
    return error


def tenant_paths(parts: list[irm_pb2.ResourceGroup], index: dict[str, int]) -> Callable[[str], str]:
    """How a field of a manager's request (made of `parts`) is named in the tenant's, whose group `name` is
    `groups[index[name]]`: the manager's `groups[j]` is the tenant's group of that name. Other fields are the
    manager's own (its request id, say) and keep their names."""
    def path(theirs: str) -> str:
        m = _GROUP_PATH.fullmatch(theirs)
        if m is None:
            return theirs
        j = int(m.group(1))
        if j >= len(parts) or parts[j].name not in index:
            return theirs
        return f"groups[{index[parts[j].name]}]{m.group(2)}"
    return path
