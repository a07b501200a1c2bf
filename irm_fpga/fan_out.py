"""One call to every FPGA-server at once, for the Orchestrator and the job manager."""

from __future__ import annotations

from typing import Any

import grpc


def ask_servers(handles: dict[str, Any], method: str, request: object, timeout: float) -> dict[str, object]:
    """`method` called on every server of `handles` (each with a `stub()`) at once (one that hangs costs one
    timeout, not one per server): server -> its reply, or the grpc.RpcError its call failed with; in the order
    of `handles`."""
    futures: dict[str, object] = {}
    out: dict[str, object] = {}
    for name, h in handles.items():
        call = getattr(h.stub(), method)
        try:
            if hasattr(call, "future"):
                futures[name] = call.future(request, timeout=timeout)
            else:                       # a stand-in stub without futures: asked in turn
                out[name] = call(request, timeout=timeout)
        except grpc.RpcError as e:
            out[name] = e
    for name, f in futures.items():
        try:
            out[name] = f.result()      # type: ignore[attr-defined]
        except grpc.RpcError as e:
            out[name] = e
    return {name: out[name] for name in handles if name in out}
