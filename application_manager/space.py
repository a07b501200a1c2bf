"""The search space of an application (thesis §4.3.2) with every dimension on [0, 1] (§4.3.3).

Each dimension (a manifest variable such as `%master_cores`, the implementation, or a
dataset column) gets a step function that gives every discrete value an equal share of
[0, 1]: value k of n covers [k/n, (k+1)/n) and is represented by its centre (k+0.5)/n.
Categorical dimensions (implementation, instance family) are mapped the same way, so
search algorithms move through [0, 1]^d without knowing the parameters' types; `snap`
maps any point back to the nearest feasible configuration.

The configurations themselves are enumerated: the cartesian product of each
implementation's choices, filtered by its GlobalConstraints (or, for a dataset, the
configurations it measured). A variable that an implementation does not have is None.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from application_manager import expr
from application_manager.manifest import Choice, Manifest, crs_attribute
from services.errors import InvalidArgument

IMPLEMENTATION = "implementation"
MAX_CONFIGURATIONS = 200_000


@dataclass(frozen=True)
class Dimension:
    name: str
    values: tuple[Any, ...]  # sorted; None (not applicable) first when present
    categorical: bool
    kind: str = ""  # "cpu" | "memory" | "": what utilisation says about this dimension

    def position(self, value: Any) -> float:
        k = self.values.index(value)
        return (k + 0.5) / len(self.values)

    def index_at(self, u: float) -> int:
        n = len(self.values)
        return min(n - 1, max(0, int(math.floor(u * n))))


def _sort_key(x: Any) -> tuple:
    if x is None:
        return (0, 0, "")
    if isinstance(x, int | float) and not isinstance(x, bool):
        return (1, float(x), "")
    return (2, 0, str(x))


@dataclass
class Space:
    dims: list[Dimension]
    configs: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.configs:
            raise ValueError("empty search space")
        self.units = np.array([[d.position(c.get(d.name)) for d in self.dims] for c in self.configs], dtype=float)
        if not self.dims:
            self.units = np.zeros((len(self.configs), 0))
        self._index = {self.key(c): i for i, c in enumerate(self.configs)}
        feats = []
        for d in self.dims:
            col = [c.get(d.name) for c in self.configs]
            if d.categorical:
                for val in d.values:
                    feats.append([1.0 if x == val else 0.0 for x in col])
            else:
                feats.append([d.position(x) for x in col])
        self.features = np.array(feats, dtype=float).T if feats else np.zeros((len(self.configs), 0))

    def __len__(self) -> int:
        return len(self.configs)

    def key(self, config: dict[str, Any]) -> tuple:
        return tuple(config.get(d.name) for d in self.dims)

    def index(self, config: dict[str, Any]) -> int | None:
        return self._index.get(self.key(config))

    def dim(self, name: str) -> Dimension:
        return next(d for d in self.dims if d.name == name)

    def snap(self, point: Sequence[float], exclude: Iterable[int] = ()) -> int | None:
        """The feasible configuration nearest to `point` in [0, 1]^d, skipping `exclude`."""
        p = np.clip(np.asarray(point, dtype=float), 0.0, 1.0)
        d2 = ((self.units - p) ** 2).sum(axis=1)
        ex = list(set(exclude))
        if ex:
            d2[ex] = np.inf
        i = int(np.argmin(d2))
        return None if not np.isfinite(d2[i]) else i

    def step(self, i: int, dim: str, direction: int, exclude: Iterable[int] = ()) -> int | None:
        """The configuration with the next (direction=+1) or previous value of `dim` and the others unchanged; when
        the constraints leave that one out of the space, the nearest with that value. None if it is in `exclude`:
        substituting another configuration with the value moved the others arbitrarily, so a utilisation-driven
        walk went against its hints and ran most of the space (thesis §4.4.2, Algorithm 5, enqueues exactly the
        neighbour)."""
        d = self.dim(dim)
        j = self.dims.index(d)
        cur = self.configs[i].get(dim)
        if cur is None:
            return None
        k = d.values.index(cur)
        ex = set(exclude)
        while True:
            k += direction
            if not 0 <= k < len(d.values) or d.values[k] is None:
                return None
            nxt = self.index({**self.configs[i], dim: d.values[k]})
            if nxt is None:
                target = self.units[i].copy()
                target[j] = d.position(d.values[k])
                cands = [c for c in range(len(self.configs)) if self.configs[c].get(dim) == d.values[k]]
                if not cands:
                    continue
                dist = ((self.units[cands] - target) ** 2).sum(axis=1)
                nxt = cands[int(np.argmin(dist))]
            return None if nxt in ex else nxt

    def describe(self, i: int) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.configs[i].items() if v is not None)


# Per CRS resource type, per attribute (CRS units): the lowest and highest value any manager offers (None: no
# bound) and the unit, as the CRS's DescribeAllocationSpec gives them (the union over a type's managers).
Limits = dict[str, dict[str, tuple[float | None, float | None, str]]]
# A Machine's attributes' units in a manifest (thesis appendix A).
MANIFEST_UNITS = {"cores": "cores", "memory": "MB", "frequency": "GHz"}


def _outside(impl: Any, limits: Limits) -> tuple[str, dict[str, set], list[str]]:
    """What of `impl` no manager offers: why it cannot run at all ("" if it can), per variable the values that
    ask for more (or less) than any manager has (their configurations are left out), and what each such choice
    asks (for the note)."""
    banned: dict[str, set] = {}
    reasons: list[str] = []
    for g in impl.groups:
        offered = limits.get(g.type, {})
        for aname, c in g.attributes.items():
            outside, bound = [], ""
            for x in c.values:
                key, num = crs_attribute(g.type, aname, x)
                if key not in offered or not isinstance(num, int | float) or isinstance(num, bool):
                    continue
                lo, hi, unit = offered[key]
                if (lo is not None and num < lo - 1e-9) or (hi is not None and num > hi + 1e-9):
                    outside.append(x)
                    # Said in the manifest's units (a Machine's Memory in MB), the CRS's otherwise.
                    scale = num / x if isinstance(x, int | float) and x and num else 1.0
                    unit = MANIFEST_UNITS.get(aname.lower(), unit) if g.type == "vm" else unit
                    bound = (f"{'' if lo is None else f'{lo / scale:g}'}..{'' if hi is None else f'{hi / scale:g}'} "
                             f"{unit}").rstrip()
            if not outside:
                continue
            said = f"group {g.id!r}: {aname} {', '.join(f'{x:g}' for x in outside[:3])}" + (
                ", ..." if len(outside) > 3 else "") + f" is outside what the managers offer ({bound})"
            if len(outside) == len(c.values) or not c.var:
                return said, {}, []
            banned.setdefault(c.var, set()).update(outside)
            reasons.append(said)
    return "", banned, reasons


def from_manifest(manifest: Manifest, parameters: dict[str, Any] | None = None,
                  offered_types: set[str] | None = None, limits: Limits | None = None) -> Space:
    """Enumerate the configurations of every implementation whose resource types are offered, leaving out those
    asking for attribute values outside what the managers offer (`limits`, when given)."""
    params = {k: v for k, v in (parameters or {}).items() if isinstance(v, int | float)}
    configs: list[dict[str, Any]] = []
    notes: list[str] = []
    var_values: dict[str, set] = {}
    var_kind: dict[str, str] = {}
    impls = manifest.variants
    tunables = {p.var: Choice(p.var, p.values, guess_kind(p.name)) for p in manifest.parameters if p.tunable}
    everywhere = {n for impl in impls for n in [*impl.choices(), *impl.fixed()]}
    offered = [impl for impl in impls
               if offered_types is None or {g.type for g in impl.groups} <= offered_types]
    # The cap is on the whole space, not per implementation: the space holds every implementation's
    # configurations at once (plus one row of `units` and `features` each), so N implementations of
    # MAX_CONFIGURATIONS each would cost N times the memory one is allowed. Counted before anything
    # is enumerated (the product of each variable's value count), so a refused manifest costs nothing.
    counts = [(impl.name, math.prod(len(c.values) for c in {**impl.choices(), **tunables}.values()))
              for impl in offered]  # a list, not a dict: two implementations may share a name
    if sum(n for _, n in counts) > MAX_CONFIGURATIONS:
        largest = sorted(counts, key=lambda kv: -kv[1])[:3]
        detail = ", ".join(f"{name!r}: {n}" for name, n in largest) + (", ..." if len(counts) > 3 else "")
        raise InvalidArgument.of("manifest", f"the implementations have {sum(n for _, n in counts)} configurations "
                                             f"in total ({detail}); at most {MAX_CONFIGURATIONS} can be "
                                             f"enumerated: offer fewer values or fewer implementations")
    for impl in impls:
        types = {g.type for g in impl.groups}
        if offered_types is not None and not types <= offered_types:
            missing = sorted(types - offered_types)
            notes.append(f"implementation {impl.name!r} needs resource type(s) {', '.join(missing)}, "
                         f"which the infrastructure does not offer: left out of the search space")
            continue
        why, banned, reasons = _outside(impl, limits) if limits else ("", {}, [])
        if why:
            notes.append(f"implementation {impl.name!r} cannot run: {why}; left out of the search space")
            continue
        choices = {**impl.choices(), **tunables}
        fixed = impl.fixed()
        names = sorted(choices)
        # A constraint on a variable this variant does not have (another module's other implementation
        # chooses it) says nothing about this variant.
        absent = everywhere - set(choices) - set(fixed)
        constraints = [node for _, node in impl.global_constraints if not expr.variables(node) & absent]
        kept = out_of_range = 0
        for combo in itertools.product(*(choices[n].values for n in names)):
            cfg = dict(zip(names, combo, strict=True))
            if banned and any(cfg.get(var) in values for var, values in banned.items()):
                out_of_range += 1
                continue
            # Only numbers: a text value (an FPGA design name) has no place in arithmetic; the
            # manifest rejects constraints that mention one, so leaving it out cannot hide a match.
            env = {**params, **{k: v for k, v in {**fixed, **cfg}.items() if isinstance(v, int | float)}}
            try:
                if not all(expr.holds(node, env) for node in constraints):
                    continue
            except KeyError:
                continue
            kept += 1
            configs.append({IMPLEMENTATION: impl.name, **cfg})
            for n, val in cfg.items():
                var_values.setdefault(n, set()).add(val)
                var_kind[n] = choices[n].kind
        if out_of_range:
            notes.append(f"implementation {impl.name!r}: {out_of_range} configuration(s) left out, asking for what "
                         f"no manager offers ({'; '.join(reasons)})")
        if kept == 0 and not out_of_range:
            notes.append(f"implementation {impl.name!r}: no configuration satisfies its GlobalConstraints")
    if not configs:
        raise InvalidArgument.of("manifest", "the search space is empty: " + ("; ".join(notes) or
                                 "no implementation has a configuration"))
    dims: list[Dimension] = []
    impl_names = tuple(sorted({c[IMPLEMENTATION] for c in configs}))
    if len(impl_names) > 1:
        dims.append(Dimension(IMPLEMENTATION, impl_names, True, ""))
    for n in sorted(var_values):
        vals = set(var_values[n])
        if any(n not in c for c in configs):
            vals.add(None)
        categorical = not all(isinstance(x, int | float) for x in vals if x is not None)
        dims.append(Dimension(n, tuple(sorted(vals, key=_sort_key)), categorical, var_kind.get(n, "")))
    if len(impl_names) <= 1:
        for c in configs:
            c.setdefault(IMPLEMENTATION, impl_names[0])
    return Space(dims, configs, notes)


def guess_kind(name: str) -> str:
    low = name.lower()
    if any(w in low for w in ("mem", "ram")):
        return "memory"
    if any(w in low for w in ("core", "cpu", "node", "instance", "worker")):
        return "cpu"
    return ""


def from_records(names: list[str], rows: list[dict[str, Any]]) -> Space:
    """A space from measured configurations (dataset columns), duplicates merged."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        cfg = {n: r.get(n) for n in names}
        seen.setdefault(tuple(cfg[n] for n in names), cfg)
    configs = list(seen.values())
    dims = []
    for n in names:
        vals = {c[n] for c in configs}
        categorical = not all(isinstance(x, int | float) for x in vals if x is not None)
        dims.append(Dimension(n, tuple(sorted(vals, key=_sort_key)), categorical, guess_kind(n)))
    return Space(dims, configs)
