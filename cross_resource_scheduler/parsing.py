"""A tenant's request (its groups and constraints) in placement's terms, checked against what the managers
describe of their resource types: every mistake of the tenant's said at once, with its field's path; a type whose
managers are down (or have not described it yet) is UNAVAILABLE, not a mistake.

Pure functions of the request and the managers' specs: the CRS caches their answers (Crs._parse).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

from cross_resource_scheduler import constraints as cons
from cross_resource_scheduler.placement import PlacementRequest
from cross_resource_scheduler.plugins import GroupDemand
from cross_resource_scheduler.registry import ManagerState
from harness.v1 import common_pb2, irm_pb2
from services.errors import MANAGER_DOWN, MANAGER_UNAVAILABLE, RETRY_LATER_S, Unavailable, Violations

MAX_COUNT = 1000
# Instances of one request in all (the groups' counts summed): placement's work grows with them, and it holds
# the placement gate (every other tenant's placement waits) while it works.
MAX_INSTANCES = 4096
# A group's name, at most (it is echoed in replies, stored, and part of the parse cache's keys).
MAX_GROUP_NAME = 128
# A pinned resource's name ("<manager>/<physical id>"; deeper stacks add a manager each).
MAX_PIN = 512


def merged_attribute(old: irm_pb2.AttributeSpec | None, new: irm_pb2.AttributeSpec) -> irm_pb2.AttributeSpec:
    """One attribute as several managers of a type describe it: the union of their domains (lowest min,
    highest max; a side one leaves open stays open) and of their allowed values. A value one manager's
    hosts can take is valid; placement then finds the manager whose hosts fit it."""
    if old is None:
        return new
    out = irm_pb2.AttributeSpec()
    out.CopyFrom(old)
    # Required or whole only if every manager says so (a value one manager takes is valid).
    out.required = old.required and new.required
    out.integer = old.integer and new.integer
    if old.HasField("domain") and new.HasField("domain"):
        a, b = old.domain, new.domain
        out.domain.ClearField("min")
        out.domain.ClearField("max")
        if a.HasField("min") and b.HasField("min"):
            out.domain.min = min(a.min, b.min)
        if a.HasField("max") and b.HasField("max"):
            out.domain.max = max(a.max, b.max)
    else:
        out.ClearField("domain")
    if old.allowed_values and new.allowed_values:
        out.allowed_values.extend(v for v in new.allowed_values if v not in old.allowed_values)
    else:
        del out.allowed_values[:]
    return out


def _default_amount(default: common_pb2.AttributeRequest) -> float | None:
    """What a manager takes of a consumable attribute a group leaves out: its default's number, or its range's
    lower bound; None if it gives neither as a finite amount of at least 0."""
    which = default.WhichOneof("value")
    if which == "number":
        amount = default.number
    elif which == "range" and default.range.HasField("min"):
        amount = default.range.min
    else:
        return None
    return amount if math.isfinite(amount) and amount >= 0 else None


def _domain(dom: common_pb2.Range) -> str:
    lo = f"{dom.min:g}" if dom.HasField("min") else "-inf"
    hi = f"{dom.max:g}" if dom.HasField("max") else "inf"
    return f"[{lo}, {hi}]"



def _not_ready(resource_type: str, providers: list[ManagerState]) -> str:
    down = [m.name for m in providers if not m.up]
    if down:
        return (f"the manager{'s' if len(down) > 1 else ''} of {resource_type!r} ({', '.join(down)}) "
                f"{'are' if len(down) > 1 else 'is'} down; retry later")
    # Up, but its description of the type has not arrived yet (it registered moments ago, or describing failed).
    return (f"the manager of {resource_type!r} ({', '.join(m.name for m in providers)}) has not described it "
            "yet; retry later")


def parse(groups: list[irm_pb2.ResourceGroup], constraints: list[irm_pb2.GroupConstraint],
          specs: dict[str, dict[str, irm_pb2.AttributeSpec]], providing: Callable[[str], list[ManagerState]],
          seed: int) -> PlacementRequest:
    """The request in placement's terms, checked against `specs` (each type's attributes as its managers describe
    them together). `providing`: the managers registered for a type (up or down); `seed`: the configured one."""
    v = Violations()
    demands: list[GroupDemand] = []
    names: set[str] = set()
    # Types a registered manager provides that no manager up has described: not the tenant's mistake.
    waiting: dict[str, list[ManagerState]] = {}
    v.check(len(groups) > 0, "groups", "at least one group is required")
    for i, g in enumerate(groups):
        p = f"groups[{i}]"
        if not v.check(bool(g.name), f"{p}.name", "required: a name unique within the request"):
            continue
        if not v.check(len(g.name) <= MAX_GROUP_NAME, f"{p}.name",
                       f"at most {MAX_GROUP_NAME} characters, got {len(g.name)}"):
            continue
        v.check(g.name not in names, f"{p}.name", f"duplicate group name {g.name!r}")
        names.add(g.name)
        v.check(1 <= g.count <= MAX_COUNT, f"{p}.count", f"must be between 1 and {MAX_COUNT}")
        if g.placement:
            # Pins, as a CRS above sends them (Crs._pinned): each instance's resource, "<manager>/<physical id>" as
            # this CRS offers it (DiscoverResources: `manager` and `id`). Whether it exists is placement's to say.
            v.check(len(g.placement) == g.count, f"{p}.placement",
                    f"one resource per instance: {g.count} expected, got {len(g.placement)}; or leave it empty "
                    "for the CRS to choose")
            for j, pin in enumerate(g.placement):
                v.check("/" in pin.strip("/") and len(pin) <= MAX_PIN, f"{p}.placement[{j}]",
                        f"a resource as '<manager>/<id>' (DiscoverResources lists both), at most {MAX_PIN} "
                        f"characters; got {pin[:MAX_PIN]!r}")
        # No resource has a trait and lacks it: said as the managers say it, not as "never fits".
        clash = set(g.required_traits) & set(g.forbidden_traits)
        v.check(not clash, f"{p}.forbidden_traits", f"traits both required and forbidden: {sorted(clash)}")
        attrs = specs.get(g.resource_type)
        if attrs is None:
            providers = providing(g.resource_type)
            if not providers:
                v.add(f"{p}.resource_type", f"no manager provides {g.resource_type!r}; "
                                            f"available: {sorted(specs) or 'none'}")
                continue
            waiting[g.resource_type] = providers
            # Checked against what its managers last described, if anything: bad input is said now,
            # not after the client waited for the manager to come back.
            attrs = {}
            for spec in (s for m in providers for s in m.specs if s.name == g.resource_type):
                for a in spec.attributes:
                    attrs[a.name] = merged_attribute(attrs.get(a.name), a)
            if not attrs:
                continue
        demand: dict[str, float] = {}
        props: dict[str, tuple[float, float]] = {}
        for key, req in g.attributes.items():
            spec = attrs.get(key)
            ap = f"{p}.attributes[{key}]"
            if spec is None:
                v.add(ap, f"unknown attribute of {g.resource_type!r}; known: {sorted(attrs)}")
                continue
            which = req.WhichOneof("value")
            if spec.kind == irm_pb2.AttributeSpec.KIND_TEXT:
                if which != "text":
                    v.add(ap, "expected text")
                elif spec.allowed_values and req.text not in spec.allowed_values:
                    v.add(ap, f"{req.text!r} is not one of {list(spec.allowed_values)}")
                continue
            if which == "text" or which is None:
                v.add(ap, f"expected a number or a range ({spec.unit})")
                continue
            lo = req.number if which == "number" else (req.range.min if req.range.HasField("min") else -math.inf)
            hi = req.number if which == "number" else (req.range.max if req.range.HasField("max") else math.inf)
            if math.isnan(lo) or math.isnan(hi):
                # Every comparison with NaN is false: it would pass every check below and match no host.
                v.add(ap, f"a number ({spec.unit}), not NaN")
                continue
            if which == "number" and not math.isfinite(lo):
                v.add(ap, f"a finite number ({spec.unit}); for an open bound use a range")
                continue
            if lo > hi:
                v.add(ap, "range min must not exceed max")
                continue
            dom = spec.domain
            if spec.integer and which == "number" and lo != math.floor(lo):
                # As the managers refuse it, said here (it passed the range check and was refused after placing).
                v.add(ap, f"a whole number of {spec.unit or 'units'}, got {lo:g}")
                continue
            if spec.consumable:
                if not math.isfinite(lo):
                    v.add(ap, "a range for a consumable attribute needs a lower bound")
                    continue
                if spec.integer and which == "range":
                    # The smallest whole number in the range (irm.proto: the smallest that fits), as the managers
                    # take it: counted at the range's fractional minimum, a host would look roomier than it is.
                    lo = float(math.ceil(lo - 1e-9))
                    if lo > hi:
                        v.add(ap, f"no whole number in the range [{req.range.min:g}, {hi:g}] ({spec.unit})")
                        continue
                if (dom.HasField("min") and lo < dom.min - 1e-9) or (dom.HasField("max") and lo > dom.max + 1e-9):
                    v.add(ap, f"{lo:g} {spec.unit} is outside {_domain(dom)}")
                    continue
                demand[key] = lo
            else:
                if (dom.HasField("min") and hi < dom.min - 1e-9) or (dom.HasField("max") and lo > dom.max + 1e-9):
                    asked = f"{lo:g}" if which == "number" else f"the range [{lo:g}, {hi:g}]"
                    v.add(ap, f"{asked} {spec.unit} is outside {_domain(dom)}, what the managers' resources have")
                    continue
                props[key] = (lo, hi)
        for key, spec in attrs.items():
            # Required by every manager of the type (merged_attribute): said now, not as "never fits" when a
            # trait or a pin left no resource (placement would never ask a manager, which would say it).
            if spec.required and key not in g.attributes:
                v.add(f"{p}.attributes[{key}]", f"required: every manager of {g.resource_type!r} needs it"
                                                + (f" ({spec.unit})" if spec.unit else ""))
                continue
            # A consumable left out is taken at its default by the manager: it counts here too, or full
            # hosts would pass the capacity filter (and the manager refuse them).
            if spec.consumable and key not in g.attributes and spec.HasField("default"):
                amount = _default_amount(spec.default)
                if amount is not None:
                    demand[key] = amount
        demands.append(GroupDemand(g.name, g.resource_type, g.count, demand, props,
                                   frozenset(g.required_traits), frozenset(g.forbidden_traits), tuple(g.placement)))
    total = sum(g.count for g in groups if g.count > 0)
    v.check(total <= MAX_INSTANCES, "groups",
            f"the groups' counts add up to {total} instances; at most {MAX_INSTANCES} per request: split it")
    parsed = cons.from_proto(list(constraints), names, v)
    v.raise_if_any()
    if waiting:
        down = sorted({m.name for providers in waiting.values() for m in providers if not m.up})
        raise Unavailable("; ".join(_not_ready(rtype, providers) for rtype, providers in waiting.items()),
                          # Down, or up but not described yet (it registered moments ago).
                          reason=MANAGER_DOWN if down else MANAGER_UNAVAILABLE, retry_after_s=RETRY_LATER_S,
                          metadata={"manager": ",".join(down or sorted(
                              {m.name for providers in waiting.values() for m in providers}))})
    return PlacementRequest(demands, parsed, seed_of(seed, demands, parsed))


def seed_of(seed: int, demands: list[GroupDemand], constraints: list[cons.Constraint]) -> int:
    """The placement seed of a parsed request: its content's digest (with the configured seed), so QuotePrice
    and Reserve of one request scan the same hosts from the same offsets. (Its groups' bytes would not do: a
    map's serialization order is not fixed.)"""
    content = repr((seed, [
        (g.name, g.resource_type, g.count, sorted(g.demand.items()), sorted(g.properties.items()),
         sorted(g.required_traits), sorted(g.forbidden_traits)) for g in demands], constraints))
    return int.from_bytes(hashlib.blake2b(content.encode(), digest_size=8).digest(), "big")
