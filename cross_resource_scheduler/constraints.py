"""Constraints between groups: structured or text, parsed and never evaluated.

The HARNESS original ran `eval()` on constraint strings; here a small
tokenizer and a fixed grammar accept only these forms:

    same_host(a, b)            different_host(a, b)
    hops(a, b) <= 2            latency_ms(a, b) <= 0.5     (also: latency(a, b) <= 500us)
    bandwidth_gbps(a, b) >= 10 (also: bandwidth(a, b) >= 100mbps)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from harness.v1 import irm_pb2
from services.errors import Violations

K = irm_pb2.GroupConstraint

KINDS = {
    K.KIND_SAME_HOST: "same_host",
    K.KIND_DIFFERENT_HOST: "different_host",
    K.KIND_MAX_HOPS: "max_hops",
    K.KIND_MAX_LATENCY_MS: "max_latency_ms",
    K.KIND_MIN_BANDWIDTH_GBPS: "min_bandwidth_gbps",
}

# function name -> (kind, comparison it must use, unit scale table)
_FUNCTIONS: dict[str, tuple[str, str | None, dict[str, float]]] = {
    "same_host": ("same_host", None, {}),
    "different_host": ("different_host", None, {}),
    "hops": ("max_hops", "<=", {"": 1.0, "hops": 1.0}),
    "latency_ms": ("max_latency_ms", "<=", {"": 1.0, "ms": 1.0, "us": 1e-3, "s": 1e3}),
    "latency": ("max_latency_ms", "<=", {"ms": 1.0, "us": 1e-3, "s": 1e3}),
    "bandwidth_gbps": ("min_bandwidth_gbps", ">=", {"": 1.0, "gbps": 1.0, "mbps": 1e-3}),
    "bandwidth": ("min_bandwidth_gbps", ">=", {"gbps": 1.0, "mbps": 1e-3}),
}

_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>[a-zA-Z]+)?|(?P<name>[A-Za-z_][\w.-]*)|(?P<op><=|>=|[(),]))")


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of KINDS' values
    a: str
    b: str
    value: float = 0.0

    def involves(self, group: str) -> bool:
        return group in (self.a, self.b)

    def other(self, group: str) -> str:
        return self.b if group == self.a else self.a


class ConstraintSyntaxError(ValueError):
    def __init__(self, message: str, position: int | None) -> None:
        """`position`: where in the text (0-based), or None for a fault of the whole text (its length)."""
        super().__init__(message if position is None else f"{message} at character {position + 1}")
        self.position = position


_BLANK_TO_END = re.compile(r"\s*\Z")
# A constraint is one relation between two groups; anything longer is not one (and each token used to copy
# the rest of the text: a megabyte took seconds of a server thread).
MAX_EXPRESSION = 1000


def _tokens(text: str) -> list[tuple[str, str, int]]:
    if len(text) > MAX_EXPRESSION:
        raise ConstraintSyntaxError(f"too long: {len(text)} characters, at most {MAX_EXPRESSION}", None)
    out, pos = [], 0
    while pos < len(text):
        if _BLANK_TO_END.match(text, pos):
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            at = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise ConstraintSyntaxError(f"unexpected {text[at:at + 10]!r}", at)
        start = m.start() + (len(m.group(0)) - len(m.group(0).lstrip()))
        if m.group("num") is not None:
            out.append(("num", m.group("num") + "|" + (m.group("unit") or "").lower(), start))
        elif m.group("name") is not None:
            out.append(("name", m.group("name"), start))
        else:
            out.append(("op", m.group("op"), start))
        pos = m.end()
    return out


def parse(text: str) -> Constraint:
    """Parse one text constraint, e.g. `hops(master, workers) <= 2`."""
    toks = _tokens(text)
    i = 0

    def expect(kind: str, value: str | None = None) -> str:
        nonlocal i
        if i >= len(toks):
            raise ConstraintSyntaxError(f"expected {value or kind}, found the end", len(text))
        k, v, p = toks[i]
        if k != kind or (value is not None and v != value):
            raise ConstraintSyntaxError(f"expected {value or kind}, found {v.split('|')[0]!r}", p)
        i += 1
        return v

    fn = expect("name")
    if fn not in _FUNCTIONS:
        raise ConstraintSyntaxError(f"unknown function {fn!r}; use one of {', '.join(sorted(_FUNCTIONS))}",
                                    toks[0][2])
    kind, op, units = _FUNCTIONS[fn]
    expect("op", "(")
    a = expect("name")
    expect("op", ",")
    b = expect("name")
    expect("op", ")")
    value = 0.0
    if op is not None:
        expect("op", op)
        number, unit = expect("num").split("|")
        if unit not in units:
            allowed = ", ".join(repr(u) for u in units if u) or "none"
            raise ConstraintSyntaxError(f"unit {unit or 'missing'!r} not valid for {fn}; use {allowed}",
                                        toks[i - 1][2])
        value = float(number) * units[unit]
    if i != len(toks):
        raise ConstraintSyntaxError(f"unexpected {toks[i][1].split('|')[0]!r} after the constraint", toks[i][2])
    return Constraint(kind, a, b, value)


def from_proto(msgs: list[irm_pb2.GroupConstraint], groups: set[str], v: Violations,
               prefix: str = "constraints") -> list[Constraint]:
    out: list[Constraint] = []
    for i, m in enumerate(msgs):
        path = f"{prefix}[{i}]"
        if m.expression:
            if m.kind or m.group_a or m.group_b or m.value:
                v.add(path, "give either expression or kind/group_a/group_b/value, not both")
                continue
            try:
                c = parse(m.expression)
            except ConstraintSyntaxError as e:
                v.add(f"{path}.expression", str(e))
                continue
        else:
            if m.kind not in KINDS:
                v.add(f"{path}.kind", "required: one of " + ", ".join(K.Kind.Name(k) for k in KINDS))
                continue
            c = Constraint(KINDS[m.kind], m.group_a, m.group_b, m.value)
        ok = True
        for side, name in (("group_a", c.a), ("group_b", c.b)):
            if name not in groups:
                v.add(f"{path}.{side}", f"no group named {name!r}; groups are {sorted(groups)}")
                ok = False
        if c.kind in ("max_hops", "max_latency_ms") and not (math.isfinite(c.value) and c.value >= 0):
            v.add(f"{path}.value", "must be a finite number >= 0")
            ok = False
        if c.kind == "min_bandwidth_gbps" and not (math.isfinite(c.value) and c.value > 0):
            v.add(f"{path}.value", "must be a finite number of Gbit/s > 0")
            ok = False
        if c.kind == "same_host" and c.a == c.b:
            pass  # all instances of one group together: valid
        if ok:
            out.append(c)
    return out
