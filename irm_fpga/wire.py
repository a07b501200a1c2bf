"""Task parameters and results between Python values and harness.v1 messages."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.v1 import fpga_pb2
from irm_fpga.engine import LOCK, RUN, UNLOCK

KIND_TO_ENGINE = {
    fpga_pb2.Task.KIND_UNSPECIFIED: RUN,
    fpga_pb2.Task.KIND_RUN: RUN,
    fpga_pb2.Task.KIND_LOCK: LOCK,
    fpga_pb2.Task.KIND_UNLOCK: UNLOCK,
}
KIND_TO_WIRE = {RUN: fpga_pb2.Task.KIND_RUN, LOCK: fpga_pb2.Task.KIND_LOCK, UNLOCK: fpga_pb2.Task.KIND_UNLOCK}


def choices(enum: Any) -> str:
    """A protobuf enum's values for an error message, e.g. "KIND_RUN (1), KIND_LOCK (2)"."""
    return ", ".join(f"{name} ({number})" for name, number in enum.items())


class WireError(ValueError):
    """`field`: the path of the bad value in its request (e.g. "tasks[0].params.signal"; "": not known), and
    `reason` what is wrong with it (the message without the location)."""

    def __init__(self, message: str, field: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason or message


def _bad(where: str, reason: str) -> WireError:
    return WireError(f"{where}: {reason}", reason=reason)


def to_value(v: Any, out: fpga_pb2.Value | None = None) -> fpga_pb2.Value:
    out = fpga_pb2.Value() if out is None else out
    if isinstance(v, bool | np.bool_):
        out.flag = bool(v)
    elif isinstance(v, int | np.integer):
        out.integer = int(v)
    elif isinstance(v, float | np.floating):
        out.number = float(v)
    elif isinstance(v, str):
        out.text = v
    elif isinstance(v, np.ndarray | list | tuple):
        a = np.ascontiguousarray(np.asarray(v))
        if a.dtype == object:
            raise WireError("arrays must be numeric")
        out.array.dtype = a.dtype.str
        out.array.shape[:] = a.shape
        out.array.data = a.tobytes()
    elif isinstance(v, complex | np.complexfloating):
        return to_value(np.asarray([v]), out)
    else:
        raise WireError(f"cannot send a {type(v).__name__}")
    return out


def from_value(v: fpga_pb2.Value, where: str = "value") -> Any:
    kind = v.WhichOneof("kind")
    if kind == "number":
        return v.number
    if kind == "integer":
        return v.integer
    if kind == "flag":
        return v.flag
    if kind == "text":
        return v.text
    if kind == "array":
        try:
            dtype = np.dtype(v.array.dtype)
        except (TypeError, ValueError):       # ValueError: e.g. a sub-array dtype too large to exist
            raise _bad(where, f"unknown dtype {v.array.dtype!r}") from None
        if dtype.kind not in "biufc" or dtype.shape:
            raise _bad(where, f"dtype {v.array.dtype!r} is not a numeric scalar type")
        shape = tuple(v.array.shape)
        if any(d < 0 for d in shape):
            raise _bad(where, f"shape {list(shape)} has a negative dimension")
        count = math.prod(shape)              # exact: numpy's product would wrap around on huge dimensions
        if count * dtype.itemsize != len(v.array.data):
            raise _bad(where, f"{len(v.array.data)} bytes do not fit shape {list(shape)} of {dtype.str}")
        try:
            return np.frombuffer(v.array.data, dtype=dtype).reshape(shape)
        except ValueError as e:
            raise _bad(where, str(e)) from None
    raise _bad(where, "empty value")


def to_map(values: Mapping[str, Any] | None, out: Any) -> None:
    """Fill a protobuf map<string, Value> from a dict (None: leave empty)."""
    if not values:
        return
    for k, v in values.items():
        to_value(v, out[k])


def from_map(m: Any, where: str) -> dict[str, Any]:
    """A protobuf map<string, Value> as a dict (`where` names it in errors; a bad value's WireError has the
    field path `where`.key)."""
    if not m:
        return {}
    out = {}
    for k in m:  # cheaper than .items() on upb maps; the error location is built only on error
        v = m[k]
        kind = v.WhichOneof("kind")
        if kind == "number":
            out[k] = v.number
        elif kind == "array" or kind is None:
            try:
                out[k] = from_value(v, f"{where}[{k}]")
            except WireError as e:
                e.field = f"{where}.{k}"
                raise
        else:
            out[k] = getattr(v, kind)
    return out
