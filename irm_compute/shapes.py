"""Parse and validate VM groups from the wire into shapes the store places."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.v1 import common_pb2, irm_pb2
from services.errors import Violations

VM_TYPE = "vm"
MAX_COUNT = 1000
# VMs in one request, all groups together (Reserve and QuotePrice alike): the work a request may cost.
MAX_INSTANCES = 10_000
# Beyond any host this manager could hold, and within what the store's columns take.
MAX_CORES = 4096
MAX_MEMORY_GB = 65536.0
# Memory is stored in whole MiB; a VM gets at least one (the domain's minimum, 1/1024 GB, that DescribeAllocationSpec
# advertises).
MIN_MEMORY_MB = 1
MAX_NAME = 128
KNOWN_ATTRIBUTES = ("cores", "memory_gb", "frequency_ghz")


@dataclass(frozen=True)
class VmGroup:
    name: str
    count: int
    cores: int
    memory_mb: int
    # Host frequency must lie in [freq_min, freq_max].
    freq_min: float = 0.0
    freq_max: float = math.inf
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()
    placement: tuple[str, ...] = field(default=())

    def host_matches(self, frequency_ghz: float, traits: set[str] | frozenset[str]) -> bool:
        return (
            self.freq_min - 1e-9 <= frequency_ghz <= self.freq_max + 1e-9
            and self.required_traits <= set(traits)
            and not (self.forbidden_traits & set(traits))
        )


@dataclass(frozen=True)
class Domain:
    """The ranges DescribeAllocationSpec advertises, from the enabled hosts: an unpinned group asking beyond them
    is bad input on that attribute (common.proto: INVALID_ARGUMENT, as the CRS answers it), not NEVER_FITS,
    which is for what is within the ranges but no host has together."""

    max_cores: int
    max_memory_gb: float
    freq_min: float
    freq_max: float

    @classmethod
    def of(cls, hosts: list) -> Domain:  # type: ignore[type-arg]
        freqs = [h.frequency_ghz for h in hosts]
        return cls(max(h.cores for h in hosts), max(h.memory_mb for h in hosts) / 1024, min(freqs), max(freqs))


def _number(attr: common_pb2.AttributeRequest, path: str, v: Violations, whole: bool = False) -> float | None:
    """The amount a group asks for: its number, or its range's lower bound (the smallest whole number in the
    range when the attribute is `whole`: irm.proto's "the smallest that fits")."""
    which = attr.WhichOneof("value")
    if which == "number":
        return attr.number
    if which == "range":
        if not attr.range.HasField("min"):
            v.add(f"{path}.range.min", "a range for a consumable attribute needs a lower bound")
            return None
        # The lower bound is what a VM gets; a range whose upper bound is below it asks for nothing at all.
        if attr.range.HasField("max") and not attr.range.min <= attr.range.max:
            v.add(f"{path}.range", f"min must not exceed max (nor NaN), got min {attr.range.min:g} "
                                   f"and max {attr.range.max:g}")
            return None
        if whole and math.isfinite(attr.range.min):
            least = float(math.ceil(attr.range.min - 1e-9))
            if attr.range.HasField("max") and least > attr.range.max:
                v.add(f"{path}.range", f"no whole number in [{attr.range.min:g}, {attr.range.max:g}]")
                return None
            return least
        return attr.range.min
    v.add(path, "expected a number or a range")
    return None


def _memory_mb(g: irm_pb2.ResourceGroup, p: str, v: Violations, domain: Domain | None = None) -> int | None:
    """The group's memory per VM in whole MiB (what the store counts), or None after a violation."""
    path = f"{p}.attributes[memory_gb]"
    if "memory_gb" not in g.attributes:
        v.add(path, "required: the memory per VM in GB")
        return None
    memory_gb = _number(g.attributes["memory_gb"], path, v)
    if memory_gb is None:
        return None
    # Below 1 MiB too (the advertised minimum), as the CRS refuses it: it was rounded up to 1 MiB here.
    if domain is not None and (memory_gb > domain.max_memory_gb or 0 < memory_gb < 1 / 1024 - 1e-9):
        why = "no host has more" if memory_gb > domain.max_memory_gb else "a VM has at least 1 MiB"
        v.add(path, f"{memory_gb:g} GB is outside [{1 / 1024:g}, {domain.max_memory_gb:g}]: {why} "
                    "(DescribeAllocationSpec lists the ranges)")
        return None
    if not (0 < memory_gb <= MAX_MEMORY_GB):
        v.add(path, f"must be > 0 and at most {MAX_MEMORY_GB:g}, got {memory_gb:g}")
        return None
    # Checked after rounding: a positive size below half a MiB rounds to a VM of no memory at all.
    memory_mb = whole_mib(memory_gb)
    if memory_mb < MIN_MEMORY_MB:
        v.add(path, f"must be at least {MIN_MEMORY_MB} MiB ({MIN_MEMORY_MB / 1024:g} GB) after rounding to whole MiB, "
                    f"got {memory_gb:g} GB")
        return None
    return memory_mb


def whole_mib(memory_gb: float) -> int:
    """A VM's memory in the whole MiB the store counts: rounded down from 1 MiB up.

    Down, not to the nearest: a scheduler in front (the CRS) sums what tenants ask for in GB, as floats, against
    the hosts' capacity; each VM rounded up could add up to more than it counted (6 VMs of 1/6 GB: 6 x 171 MiB
    = 1026 > a 1 GB host's 1024) and the scheduler, placing them the same way again, would be refused forever
    although the cloud had room. Rounded down, whatever fits its sum fits here. The tolerance keeps a size that
    is a whole MiB in decimal (0.3 GB x 1024 = 307.2, 1.5 GB = 1536) from losing one to binary rounding. Below
    1 MiB (refused for an unpinned group, as by the CRS: the domain's minimum; a pinned one is judged on its host)
    the nearest whole MiB: at least one MiB from half.
    """
    mib = memory_gb * 1024
    return round(mib) if mib < 1 else math.floor(mib + 1e-6)


def parse_groups(groups: list[irm_pb2.ResourceGroup], v: Violations, field_prefix: str = "groups",
                 domain: Domain | None = None) -> list[VmGroup]:
    """The groups, checked; with `domain`, an unpinned group's attributes must lie within it too (a pinned one
    is judged on its hosts: PIN_REFUSED)."""
    out: list[VmGroup] = []
    names: set[str] = set()
    v.check(len(groups) > 0, field_prefix, "at least one group is required")
    for i, g in enumerate(groups):
        p = f"{field_prefix}[{i}]"
        if not v.check(bool(g.name), f"{p}.name", "required: a name unique within the request"):
            continue
        v.check(len(g.name) <= MAX_NAME, f"{p}.name", f"at most {MAX_NAME} characters")
        v.check(g.name not in names, f"{p}.name", f"duplicate group name {g.name!r}")
        names.add(g.name)
        v.check(g.resource_type == VM_TYPE, f"{p}.resource_type",
                f"this manager provides {VM_TYPE!r}, not {g.resource_type!r}")
        v.check(1 <= g.count <= MAX_COUNT, f"{p}.count", f"must be between 1 and {MAX_COUNT}")
        for key in g.attributes:
            v.check(key in KNOWN_ATTRIBUTES, f"{p}.attributes[{key}]",
                    f"unknown attribute; a vm has {', '.join(KNOWN_ATTRIBUTES)}")
        within = domain if not g.placement else None
        cores = None
        if "cores" in g.attributes:
            cores = _number(g.attributes["cores"], f"{p}.attributes[cores]", v, whole=True)
            # NaN, inf and absurd counts are bad input, not a shape to price or to store (int(inf) raised).
            if cores is not None and not (1 <= cores <= MAX_CORES and cores == int(cores)):
                v.add(f"{p}.attributes[cores]", f"must be a whole number >= 1, got {cores:g} (at most {MAX_CORES})")
                cores = None
            elif cores is not None and within is not None and cores > within.max_cores:
                v.add(f"{p}.attributes[cores]", f"{cores:g} cores is outside [1, {within.max_cores}]: no host has "
                                                "more (DescribeAllocationSpec lists the ranges)")
                cores = None
        else:
            v.add(f"{p}.attributes[cores]", "required: the number of cores per VM")
        memory_mb = _memory_mb(g, p, v, within)
        fmin, fmax = 0.0, math.inf
        if "frequency_ghz" in g.attributes:
            f = g.attributes["frequency_ghz"]
            which = f.WhichOneof("value")
            if which == "number":
                fmin = fmax = f.number
                v.check(math.isfinite(f.number) and f.number > 0, f"{p}.attributes[frequency_ghz]",
                        f"a frequency in GHz > 0, got {f.number:g}")
            elif which == "range":
                fmin = f.range.min if f.range.HasField("min") else 0.0
                fmax = f.range.max if f.range.HasField("max") else math.inf
                v.check(fmin <= fmax, f"{p}.attributes[frequency_ghz].range", "min must not exceed max (nor NaN)")
            else:
                v.add(f"{p}.attributes[frequency_ghz]", "expected a number or a range of GHz")
            if within is not None and fmin <= fmax and (fmax < within.freq_min - 1e-9 or fmin > within.freq_max + 1e-9):
                asked = f"{fmin:g} GHz" if fmin == fmax else f"[{fmin:g}, {fmax:g}] GHz"
                v.add(f"{p}.attributes[frequency_ghz]",
                      f"{asked} is outside [{within.freq_min:g}, {within.freq_max:g}]: the hosts' frequencies "
                      "(DescribeAllocationSpec lists the ranges)")
        if g.placement:
            v.check(len(g.placement) == g.count, f"{p}.placement",
                    f"give one host per instance ({g.count}), or none to let the manager place them")
            for j, host in enumerate(g.placement):
                v.check(bool(host), f"{p}.placement[{j}]", "required: a host id (DiscoverResources lists them)")
        clash = set(g.required_traits) & set(g.forbidden_traits)
        v.check(not clash, f"{p}.forbidden_traits", f"traits both required and forbidden: {sorted(clash)}")
        if cores is None or memory_mb is None:
            continue
        out.append(VmGroup(
            name=g.name,
            count=g.count,
            cores=int(cores),
            memory_mb=memory_mb,
            freq_min=fmin,
            freq_max=fmax,
            required_traits=frozenset(g.required_traits),
            forbidden_traits=frozenset(g.forbidden_traits),
            placement=tuple(g.placement),
        ))
    total = sum(g.count for g in groups)
    v.check(total <= MAX_INSTANCES, field_prefix,
            f"{total} VMs in one request; at most {MAX_INSTANCES} (all groups together): split the request")
    return out
