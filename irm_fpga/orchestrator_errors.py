"""Errors the Orchestrator's calls share (irm_fpga.orchestrator): an FPGA-server's failure in the caller's terms, and
an id longer than any the Orchestrator gives out. In a module of their own: the group, client and reservation code
(irm_fpga.orchestrator_clients, ...) raise them too, and cannot import them from the Orchestrator that composes it.
"""

from __future__ import annotations

import grpc

from services.errors import HarnessError, InvalidArgument, from_rpc_error

MAX_ID_CHARS = 64      # group and client ids are stored in 64 characters: a longer one is refused unechoed


def check_id(field_path: str, value: str) -> None:
    """INVALID_ARGUMENT for an empty id, or one longer than any this service makes (it is not echoed back)."""
    if not value:
        raise InvalidArgument.of(field_path, "required: the id as this service returned it")
    if len(value) > MAX_ID_CHARS:
        raise InvalidArgument.of(field_path, f"at most {MAX_ID_CHARS} characters (got {len(value)}): an id as this "
                                             f"service returned it")


def rpc_error(server: str, e: grpc.RpcError) -> HarnessError:
    return from_rpc_error(f"FPGA-server {server!r}", e)
