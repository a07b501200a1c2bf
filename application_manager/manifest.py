"""Application manifests in the appendix-A JSON format (thesis §4.2.1, appendix A), validated.

A manifest names the application, its modules, each module's input parameters and
implementations (one chosen per run, e.g. a CPU and an FPGA implementation), and per
implementation: resource groups (GroupID, Role, Type, NumInstances as a Value or a Var
with Values/Range, Attributes with Value/Values/Range), Distances between groups,
GlobalConstraints (parsed by application_manager.expr), EnvironmentVars and arguments with
`%var` substitution. Instead of a Tarball URL, an implementation gives its `Command` (a
command line or an argv list; `%python` and `%app_dir` are provided by the manager).
A parameter marked `"Tunable": true` is a knob of the application that the manager
chooses from its Values (a search dimension), where other parameters are inputs the SLO
fixes.

An application is one or more modules, "services that are required to run the
application" (appendix A). One implementation is chosen per module, so a configuration
is a `Variant`: the product of the modules' implementations, its groups all reserved
together. The module named `Main` (else the first) is the application: its run time and
exit status are the run's. The other modules are services, started before it in manifest
order; each says it is ready by printing a line `HARNESS_READY [endpoint]` on stdout, and
later modules find it in `HARNESS_MODULE_<NAME>_ENDPOINT`. Group ids and parameter
variables are unique across modules (one reservation holds every group); a variable
chosen in two groups or two modules is one choice and must have the same domain in both,
and a group's variable is never also an input parameter.

Every problem is reported at once, each naming its field (e.g.
`manifest.Modules[0].Implementations[1].Resources.Groups[0].Attributes.Memory.Values`) and
saying what is expected.
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
import reprlib
import shlex
from dataclasses import dataclass, field
from typing import Any

from application_manager import expr
from services import json_text
from services.errors import Violations

# Resource types a manifest group may name, and the CRS resource type each maps to.
GROUP_TYPES = {"machine": "vm", "vm": "vm", "fpga": "vfpga", "vfpga": "vfpga"}
# Attribute names (case-insensitive) of a Machine group and the CRS attribute each maps to,
# with the factor from manifest units (Memory in MB as in appendix A) to CRS units.
MACHINE_ATTRIBUTES = {"cores": ("cores", 1.0), "memory": ("memory_gb", 1 / 1024),
                      "frequency": ("frequency_ghz", 1.0)}
# Utilisation a dimension responds to (the whitebox model of thesis §4.4.2).
RESOURCE_KIND = {"cores": "cpu", "memory": "memory", "frequency": "cpu", "instances": "cpu"}
BUILTIN_VARS = ("%python", "%app_dir")
MAX_VALUES = 4096
MAX_VARIANTS = 256
# The most instances a group may ask for: the CRS's limit per group (`cross_resource_scheduler.parsing.MAX_COUNT`),
# checked at submit so that no profiling run is made only to be refused (and no count overflows the wire's int32).
MAX_INSTANCES = 1000
READY_LINE = "HARNESS_READY"
_VAR = re.compile(r"%[A-Za-z_][A-Za-z0-9_]*")
# Bad values are quoted back in messages; a deeply nested or huge one must not make the
# message itself fail (repr recurses) or flood it.
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother = 3, 80, 80


@dataclass(frozen=True)
class Choice:
    """A manifest value that is either fixed or chosen by the manager from a domain."""

    var: str  # "" when fixed
    values: tuple[Any, ...]  # one value when fixed
    kind: str = ""  # "cpu" | "memory" | "" : what utilisation says about it


@dataclass(frozen=True)
class Group:
    id: str
    role: str
    type: str  # CRS resource type: "vm" or "vfpga" (the FPGA IRM's virtual FPGA)
    instances: Choice
    attributes: dict[str, Choice]  # manifest attribute name -> choice


@dataclass(frozen=True)
class Distance:
    source: str
    target: str
    constraints: tuple[str, ...]  # CRS constraint expressions


@dataclass(frozen=True)
class Implementation:
    name: str
    groups: tuple[Group, ...]
    distances: tuple[Distance, ...]
    global_constraints: tuple[tuple[str, expr.Node], ...]
    env: dict[str, str]
    command: tuple[str, ...]
    deployment_args: str
    execution_args: str
    module: str = "Main"

    @property
    def parts(self) -> tuple[Implementation, ...]:
        return (self,)

    def choices(self) -> dict[str, Choice]:
        """Every variable the manager chooses for this implementation, by name."""
        out: dict[str, Choice] = {}
        for g in self.groups:
            for c in [g.instances, *g.attributes.values()]:
                if c.var and len(c.values) > 0:
                    out.setdefault(c.var, c)
        return out

    def fixed(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g in self.groups:
            for c in [g.instances, *g.attributes.values()]:
                if c.var and len(c.values) == 1:
                    out[c.var] = c.values[0]
        return out

    def master(self) -> Group:
        for g in self.groups:
            if g.role.upper() == "MASTER":
                return g
        return self.groups[0]


@dataclass(frozen=True)
class Variant:
    """One way to run the whole application: an implementation for every module, main first.

    It answers the questions a single implementation answers (groups to reserve, choices,
    constraints) over all of its parts, so the search space and the back-ends see one shape.
    """

    name: str
    parts: tuple[Implementation, ...]

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(g for p in self.parts for g in p.groups)

    @property
    def distances(self) -> tuple[Distance, ...]:
        return tuple(d for p in self.parts for d in p.distances)

    @property
    def global_constraints(self) -> tuple[tuple[str, expr.Node], ...]:
        return tuple(c for p in self.parts for c in p.global_constraints)

    def choices(self) -> dict[str, Choice]:
        out: dict[str, Choice] = {}
        for p in self.parts:
            for k, c in p.choices().items():
                out.setdefault(k, c)
        return out

    def fixed(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.parts:
            out.update(p.fixed())
        return out

    def master(self) -> Group:
        return self.parts[0].master()


@dataclass(frozen=True)
class Parameter:
    var: str
    name: str
    type: str
    values: tuple[Any, ...]
    default: Any
    # Optional: the small "benchmarking" value of an input-size parameter (thesis §4.4.3).
    benchmark: Any = None
    # A knob of the application (threads, a provider, an instance family) that the manager
    # chooses like a resource attribute, instead of the SLO fixing it: a search dimension.
    tunable: bool = False


@dataclass(frozen=True)
class Module:
    name: str
    parameters: tuple[Parameter, ...]
    implementations: tuple[Implementation, ...]


@dataclass(frozen=True)
class Manifest:
    name: str
    author: str
    modules: tuple[Module, ...]  # the main module first
    raw: dict = field(compare=False, default_factory=dict)

    @property
    def main(self) -> Module:
        return self.modules[0]

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        return tuple(p for m in self.modules for p in m.parameters)

    @property
    def variants(self) -> tuple[Variant | Implementation, ...]:
        """Every way to run the application; a one-module application's are its implementations."""
        if len(self.modules) == 1:
            return self.main.implementations
        out = []
        for combo in itertools.product(*(m.implementations for m in self.modules)):
            name = " + ".join(f"{m.name}/{impl.name}" for m, impl in zip(self.modules, combo, strict=True))
            out.append(Variant(name, combo))
        return tuple(out)

    def parameter(self, var_or_name: str) -> Parameter | None:
        for p in self.parameters:
            if var_or_name in (p.var, p.name):
                return p
        return None


def _get(obj: dict, key: str) -> Any:
    """Keys are matched case-insensitively (the appendix mixes styles)."""
    if key in obj:
        return obj[key]
    low = key.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def crs_attribute(group_type: str, name: str, value: Any) -> tuple[str, Any]:
    """A group attribute as the CRS takes it: a Machine's in CRS units (Memory MB -> memory_gb), others as they are
    (lower-cased)."""
    if group_type == "vm":
        key, factor = MACHINE_ATTRIBUTES.get(name.lower(), ("cores", 1.0))
        return key, float(value) * factor
    return name.lower(), value


def misspelt_keys(obj: Any, known: tuple[str, ...], path: str, v: Violations) -> None:
    """Keys of `obj` that are not `known` but close to one ("GlobalConstraint", "Objectives", "Optimise"): refused,
    naming the key meant. Read case-insensitively like every key, a near miss would be ignored silently -- a
    constraint or a bound dropped, and money spent on configurations it excluded. Keys unlike any known one are
    left alone (annotations, the appendix's keys Harness has no use for)."""
    if not isinstance(obj, dict):
        return
    lower = {k.lower(): k for k in known}
    for key in obj:
        if not isinstance(key, str) or key.lower() in lower:
            continue
        close = difflib.get_close_matches(key.lower(), list(lower), n=1, cutoff=0.8)
        if close:
            v.add(f"{path}.{key}", f"unknown key: did you mean {lower[close[0]]!r}? (as written it would be "
                                   "ignored)")


# Keys of one level of a manifest (read case-insensitively) that are no key of another: written at the wrong level,
# one would be ignored as silently as a misspelt one -- a GlobalConstraints at the top dropped, money spent on what it
# excluded. `misplaced_keys` refuses them, naming where each belongs ("{m}": a module's path, "{i}": an
# implementation's).
MODULE_KEYS = ("ModuleName", "Parameters", "Implementations")
IMPLEMENTATION_KEYS = ("ImplementationName", "Resources", "GlobalConstraints", "EnvironmentVars", "Command", "Tarball",
                       "DeploymentArgs", "ExecutionArgs")
_BELONGS = {**{k.lower(): ("{m}", k) for k in MODULE_KEYS},
            **{k.lower(): ("{m}.Implementations[j]", k) for k in IMPLEMENTATION_KEYS},
            "groups": ("{m}.Implementations[j].Resources", "Groups")}


def misplaced_keys(obj: Any, module: str, level: str, v: Violations, path: str) -> None:
    """Keys of `obj` (a manifest's `level`: "manifest", "module" or "implementation", at `path`) that belong to
    another level: refused, naming where (`module` is the module's path: "manifest.Modules[i]" at the top)."""
    if not isinstance(obj, dict):
        return
    here = {"manifest": ("name", "author", "modules"), "module": tuple(k.lower() for k in MODULE_KEYS),
            "implementation": (*(k.lower() for k in IMPLEMENTATION_KEYS), "distances")}[level]
    for key in obj:
        if not isinstance(key, str) or key.lower() in here or key.lower() not in _BELONGS:
            continue
        where, proper = _BELONGS[key.lower()]
        where = where.format(m=module)
        if level == "implementation" and where.startswith(f"{module}.Implementations[j]"):
            where = path + where[len(f"{module}.Implementations[j]"):]
        v.add(f"{path}.{key}", f"belongs in {where}.{proper}; here it would be ignored")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _is_finite(x: Any) -> bool:
    """A number the search can compute with: JSON admits Infinity, NaN and ints beyond any float."""
    if not _is_number(x):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _is_scalar(x: Any) -> bool:
    """A value a configuration can hold: it is hashed, sorted and compared, so no lists or objects."""
    return isinstance(x, str | bool) or _is_finite(x)


def _show(x: Any) -> str:
    return _SHOW.repr(x)


def _is_textual(values: Any) -> bool:
    """Whether a variable can hold text, which a constraint cannot compute with (other bad values are
    reported where they are given)."""
    return any(isinstance(x, str) for x in values)


def _var(value: Any, path: str, v: Violations) -> str:
    if value is None:
        return ""
    if not (isinstance(value, str) and re.fullmatch(r"%[A-Za-z_][A-Za-z0-9_]*", value)):
        v.add(path, f"expected a variable name such as \"%master_cores\" ('%' then letters, digits, _), "
                    f"got {_show(value)}")
        return ""
    if value in BUILTIN_VARS:
        v.add(path, f"{value} is provided by the manager; choose another name")
        return ""
    return value


def _choice(spec: Any, path: str, v: Violations, *, numeric: bool, integer: bool = False, kind: str = "") -> Choice | None:
    """{"Value": x} | {"Var": "%x", "Values": [...]} | {"Var": "%x", "Range": [lo, hi]}."""
    if _is_number(spec) or isinstance(spec, str):
        spec = {"Value": spec}
    if not isinstance(spec, dict):
        v.add(path, "expected an object with \"Value\", or \"Var\" and \"Values\" or \"Range\"")
        return None
    misspelt_keys(spec, ("Var", "Value", "Values", "Range"), path, v)
    var = _var(_get(spec, "Var"), f"{path}.Var", v)
    given = [k for k in ("Value", "Values", "Range") if _get(spec, k) is not None]
    if len(given) != 1:
        v.add(path, "give exactly one of \"Value\", \"Values\" or \"Range\"" + (f" (got {', '.join(given)})" if given else ""))
        return None
    key = given[0]
    raw = _get(spec, key)
    if key == "Value":
        values: list[Any] = [raw]
    elif key == "Values":
        if not isinstance(raw, list) or not raw:
            v.add(f"{path}.Values", "expected a non-empty list of values")
            return None
        values = list(raw)
    else:
        if not (isinstance(raw, list) and len(raw) == 2 and all(_is_finite(x) for x in raw)):
            v.add(f"{path}.Range", "expected [lowest, highest], two finite numbers")
            return None
        lo, hi = raw
        if lo != int(lo) or hi != int(hi):
            v.add(f"{path}.Range", "a Range enumerates whole numbers; give Values for other steps")
            return None
        if lo > hi:
            v.add(f"{path}.Range", f"lowest {lo} is above highest {hi}")
            return None
        if hi - lo + 1 > MAX_VALUES:
            v.add(f"{path}.Range", f"at most {MAX_VALUES} values")
            return None
        values = list(range(int(lo), int(hi) + 1))
    if numeric:
        for i, x in enumerate(values):
            where = f"{path}.{key}" + (f"[{i}]" if key == "Values" else "")
            if not _is_finite(x):
                v.add(where, f"expected a {'finite ' if _is_number(x) else ''}number, got {_show(x)}")
                return None
            if x <= 0 or (integer and x != int(x)):
                v.add(where, f"expected a {'whole ' if integer else ''}number > 0, got {x!r}")
                return None
        values = [int(x) if integer or x == int(x) else float(x) for x in values]
        values = sorted(set(values))
    elif bad := [i for i, x in enumerate(values) if not _is_scalar(x)]:
        i = bad[0]
        v.add(f"{path}.{key}" + (f"[{i}]" if key == "Values" else ""),
              f"expected a string or a finite number, got {_show(values[i])}")
        return None
    elif len(set(map(str, values))) != len(values):
        v.add(f"{path}.{key}", "values must be distinct")
        return None
    if len(values) > 1 and not var:
        v.add(f"{path}.Var", "required when several values are given: the variable the manager chooses")
        return None
    return Choice(var, tuple(values), kind)


_DIST = re.compile(r"^\s*(hops|latency_ms|latency|bandwidth_gbps|bandwidth)\s*(<=|<|>=|>|==)\s*(\d+(?:\.\d*)?|\.\d+)"
                   r"\s*(\w*)\s*$")


def _distance_constraint(text: Any, src: str, dst: str, path: str, v: Violations) -> str | None:
    """"hops < 1" between two groups -> the CRS form "hops(src, dst) <= 0"."""
    if not isinstance(text, str):
        v.add(path, "expected a string such as \"hops < 1\"")
        return None
    low = text.strip().lower()
    if low in ("same_host", "different_host"):
        return f"{low}({src}, {dst})"
    m = _DIST.match(low)
    if not m:
        v.add(path, f"expected same_host, different_host, or hops/latency_ms/bandwidth_gbps compared to a number, got {text!r}")
        return None
    what, op, num, unit = m.groups()
    n = float(num)
    if not math.isfinite(n):
        v.add(path, f"the bound must be a finite number, got {_show(num)}")
        return None
    if what == "hops":
        if op not in ("<", "<="):
            v.add(path, "hops take an upper bound: hops < N or hops <= N")
            return None
        bound = int(n) - 1 if op == "<" else int(n)
        if bound < 0:
            v.add(path, "hops < 0 can never hold")
            return None
        return f"hops({src}, {dst}) <= {bound}"
    if what.startswith("latency"):
        if op not in ("<", "<="):
            v.add(path, "latency takes an upper bound")
            return None
        return f"latency_ms({src}, {dst}) <= {n:g}"
    if op not in (">", ">="):
        v.add(path, "bandwidth takes a lower bound")
        return None
    return f"bandwidth_gbps({src}, {dst}) >= {n:g}{unit and ''}"


def _command(spec: Any, path: str, v: Violations) -> tuple[str, ...]:
    if isinstance(spec, str):
        try:
            argv = shlex.split(spec)
        except ValueError as e:
            v.add(path, f"not a valid command line: {e}")
            return ()
    elif isinstance(spec, list) and all(isinstance(x, str) for x in spec):
        argv = list(spec)
    else:
        v.add(path, "required: the command line that runs this implementation (a string or a list of strings), "
                    "e.g. [\"%python\", \"%app_dir/app.py\", \"%arg1\"]")
        return ()
    if not argv:
        v.add(path, "must not be empty")
    elif not argv[0].strip():
        # No program: every run would fail at the agent, each taken for its configuration's failure.
        v.add(f"{path}[0]" if isinstance(spec, list) else path, "the program to run: must not be empty or blank")
    return tuple(argv)


def _implementation(spec: Any, path: str, v: Violations, known_vars: set[str], module: str = "Main",
                    other_groups: frozenset[str] = frozenset(),
                    textual_vars: frozenset[str] = frozenset(),
                    parameter_vars: frozenset[str] = frozenset()) -> Implementation | None:
    if not isinstance(spec, dict):
        v.add(path, "expected an object")
        return None
    misspelt_keys(spec, (*IMPLEMENTATION_KEYS, "Distances"), path, v)
    misplaced_keys(spec, path.rsplit(".Implementations[", 1)[0], "implementation", v, path)
    name = _get(spec, "ImplementationName")
    if not (isinstance(name, str) and name.strip()):
        v.add(f"{path}.ImplementationName", "required: a non-empty name")
        name = "?"
    res = _get(spec, "Resources")
    if not isinstance(res, dict):
        v.add(f"{path}.Resources", "required: an object with \"Groups\"")
        return None
    misspelt_keys(res, ("Groups", "Distances", "Constraints"), f"{path}.Resources", v)
    raw_groups = _get(res, "Groups")
    if not (isinstance(raw_groups, list) and raw_groups):
        v.add(f"{path}.Resources.Groups", "required: a non-empty list of resource groups")
        return None
    groups: list[Group] = []
    ids: set[str] = set()
    # Each variable the groups choose, with where it is first chosen and from what: one variable is one choice
    # of the configuration, so a second domain (Cores [1, 2, 4] here, Memory [1024, 2048] there) would never be
    # enumerated, and the group would be reserved with values of the first one.
    domains: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for i, g in enumerate(raw_groups):
        gp = f"{path}.Resources.Groups[{i}]"
        if not isinstance(g, dict):
            v.add(gp, "expected an object")
            continue
        misspelt_keys(g, ("GroupID", "Role", "Type", "NumInstances", "Attributes"), gp, v)
        gid = _get(g, "GroupID")
        if not (isinstance(gid, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,62}", gid or "")):
            v.add(f"{gp}.GroupID", "required: a name (letter, then letters, digits, - or _)")
            continue
        if gid in ids:
            v.add(f"{gp}.GroupID", f"duplicate group id {gid!r}")
        ids.add(gid)
        role = _get(g, "Role") or "None"
        if not isinstance(role, str):
            v.add(f"{gp}.Role", "expected a string such as \"MASTER\"")
            role = "None"
        gtype = _get(g, "Type")
        rtype = GROUP_TYPES.get(str(gtype).lower()) if isinstance(gtype, str) else None
        if rtype is None:
            v.add(f"{gp}.Type", f"expected one of {sorted({'Machine', 'FPGA'})}, got {gtype!r}")
            continue
        n = _get(g, "NumInstances")
        inst = _choice(n if n is not None else {"Value": 1}, f"{gp}.NumInstances", v, numeric=True, integer=True,
                       kind="cpu")
        if inst is not None and (most := max(inst.values)) > MAX_INSTANCES:
            v.add(f"{gp}.NumInstances", f"at most {MAX_INSTANCES} instances per group (the CRS's limit), got {most}")
            inst = None
        attrs: dict[str, Choice] = {}
        raw_attrs = _get(g, "Attributes") or {}
        if not isinstance(raw_attrs, dict):
            v.add(f"{gp}.Attributes", "expected an object of attribute name -> {Value | Var + Values/Range}")
            raw_attrs = {}
        for aname, aspec in raw_attrs.items():
            ap = f"{gp}.Attributes.{aname}"
            if rtype == "vm":
                if aname.lower() not in MACHINE_ATTRIBUTES:
                    v.add(ap, f"unknown attribute of a Machine; known: {', '.join(k.title() for k in MACHINE_ATTRIBUTES)}")
                    continue
                c = _choice(aspec, ap, v, numeric=True, integer=aname.lower() == "cores",
                            kind=RESOURCE_KIND.get(aname.lower(), ""))
            else:  # FPGA (and later types): attributes go to the IRM as they are
                c = _choice(aspec, ap, v, numeric=False)
            if c is not None:
                attrs[aname] = c
        if rtype == "vm":
            for need in ("Cores", "Memory"):
                if not any(k.lower() == need.lower() for k in attrs) and not any(
                        k.lower() == need.lower() for k in raw_attrs):
                    v.add(f"{gp}.Attributes.{need}", f"required for a Machine: {need} "
                                                     f"({'whole cores' if need == 'Cores' else 'MB'})")
        for cp, c in [(f"{gp}.NumInstances", inst), *((f"{gp}.Attributes.{a}", c) for a, c in attrs.items())]:
            if c is None or not c.var:
                continue
            if c.var in parameter_vars:
                v.add(f"{cp}.Var", f"{c.var} is also an input parameter of the manifest (Parameters): the value "
                                   "the manager chooses for the group would replace the input in the command line; "
                                   "give the resource variable a name of its own")
                continue
            first = domains.setdefault(c.var, (cp, c.values))
            if first[1] != c.values:
                v.add(f"{cp}.Var", f"{c.var} is already chosen at {first[0]} from {_show(list(first[1]))}, but here "
                                   f"from {_show(list(c.values))}; a variable is one choice of the configuration: "
                                   "give both the same values, or give this one a name of its own")
        if inst is not None:
            groups.append(Group(gid, role, rtype, inst, attrs))
    distances: list[Distance] = []
    raw_dist = _get(res, "Distances") or _get(spec, "Distances") or []
    if not isinstance(raw_dist, list):
        v.add(f"{path}.Resources.Distances", "expected a list of {Source, Target, Constraints} objects")
        raw_dist = []
    for i, d in enumerate(raw_dist):
        dp = f"{path}.Resources.Distances[{i}]"
        if not isinstance(d, dict):
            v.add(dp, "expected an object with Source, Target, Constraints")
            continue
        misspelt_keys(d, ("Source", "Target", "Constraints"), dp, v)
        src, dst = _get(d, "Source"), _get(d, "Target")
        ok = True
        for key, val in (("Source", src), ("Target", dst)):
            if not (isinstance(val, str) and val in ids):
                v.add(f"{dp}.{key}", f"expected a GroupID of this implementation ({', '.join(sorted(ids))}), "
                                     f"got {_show(val)}")
                ok = False
        cons = _get(d, "Constraints") or []
        if not isinstance(cons, list):
            v.add(f"{dp}.Constraints", "expected a list such as [\"hops < 1\"]")
            continue
        parsed = [_distance_constraint(c, src, dst, f"{dp}.Constraints[{j}]", v) for j, c in enumerate(cons)] if ok else []
        distances.append(Distance(src, dst, tuple(c for c in parsed if c)))
    if _get(res, "Constraints"):
        v.add(f"{path}.Resources.Constraints", "give placement constraints as Distances between groups")

    chosen = {c.var for g in groups for c in [g.instances, *g.attributes.values()] if c.var}
    scope = chosen | known_vars
    textual = textual_vars | {c.var for g in groups for c in g.attributes.values() if c.var and _is_textual(c.values)}
    gcs: list[tuple[str, expr.Node]] = []
    raw_gc = _get(spec, "GlobalConstraints") or []
    if not isinstance(raw_gc, list):
        v.add(f"{path}.GlobalConstraints", "expected a list of expressions such as \"%master_ram > 1024 * %master_cores\"")
        raw_gc = []
    for i, text in enumerate(raw_gc):
        cp = f"{path}.GlobalConstraints[{i}]"
        try:
            node = expr.parse(text)
        except expr.ExprError as e:
            v.add(cp, f"not a valid constraint: {e}")
            continue
        if not expr.is_boolean(node):
            v.add(cp, "expected a comparison such as \"%master_ram > 1024 * %master_cores\"")
            continue
        unknown = sorted(expr.variables(node) - scope)
        if unknown:
            v.add(cp, f"unknown variable(s) {', '.join(unknown)}; known: {', '.join(sorted(scope)) or 'none'}")
            continue
        # Text has no numeric value: such a constraint would fail every configuration (or,
        # for a fixed value, every evaluation), which reads as "no configuration fits".
        text_vars = sorted(expr.variables(node) & textual)
        if text_vars:
            v.add(cp, f"{', '.join(text_vars)} {'has' if len(text_vars) == 1 else 'have'} text values, but a "
                      "constraint computes with numbers; constrain numeric variables only")
            continue
        gcs.append((text, node))
    env = _get(spec, "EnvironmentVars") or {}
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(x, str | int | float) for k, x in env.items())):
        v.add(f"{path}.EnvironmentVars", "expected an object of NAME -> string")
        env = {}
    cmd_spec = _get(spec, "Command")
    if cmd_spec is None and _get(spec, "Tarball"):
        v.add(f"{path}.Command", "required: Harness runs a local command line instead of downloading a Tarball")
        command: tuple[str, ...] = ()
    else:
        command = _command(cmd_spec, f"{path}.Command", v)
    args = {}
    for key in ("DeploymentArgs", "ExecutionArgs"):
        val = _get(spec, key) or ""
        if not isinstance(val, str):
            v.add(f"{path}.{key}", "expected a string (use %var to refer to parameters)")
            val = ""
        args[key] = val
    try:
        # Split into words before values are substituted (application_manager.local): one that cannot be split
        # (an unclosed quote) would fail every run.
        shlex.split(args["ExecutionArgs"])
    except ValueError as e:
        v.add(f"{path}.ExecutionArgs", f"cannot be split into arguments ({e}): close the quote, or escape the "
                                       "character")
    all_vars = scope | set(BUILTIN_VARS) | {f"%{gid}_address" for gid in {g.id for g in groups} | other_groups}
    texts = [*command, args["DeploymentArgs"], args["ExecutionArgs"], *map(str, env.values())]
    for t in texts:
        for m in _VAR.findall(t):
            if m not in all_vars:
                v.add(f"{path}", f"{m} is used but never defined; known: {', '.join(sorted(all_vars))}")
    return Implementation(name, tuple(groups), tuple(distances), tuple(gcs),
                          {k: str(x) for k, x in env.items()}, command, args["DeploymentArgs"], args["ExecutionArgs"],
                          module)


def _parameter(spec: Any, path: str, v: Violations) -> Parameter | None:
    if not isinstance(spec, dict):
        v.add(path, "expected an object with Var, Name and Values")
        return None
    misspelt_keys(spec, ("Var", "Name", "Type", "Values", "Default", "Benchmark", "Tunable"), path, v)
    var = _var(_get(spec, "Var"), f"{path}.Var", v)
    if not var:
        if _get(spec, "Var") is None:
            v.add(f"{path}.Var", "required: the variable, e.g. \"%arg1\"")
        return None
    name = _get(spec, "Name") or var[1:]
    ptype = str(_get(spec, "Type") or "STR").upper()
    if ptype not in ("STR", "INT", "FLOAT"):
        v.add(f"{path}.Type", f"expected STR, INT or FLOAT, got {ptype!r}")
        return None
    values = _get(spec, "Values")
    if not (isinstance(values, list) and values):
        v.add(f"{path}.Values", "required: a non-empty list of acceptable values")
        return None
    if ptype != "STR" and not all(_is_finite(x) for x in values):
        v.add(f"{path}.Values", f"a {ptype} parameter takes finite numbers")
        return None
    if bad := [i for i, x in enumerate(values) if not _is_scalar(x)]:
        v.add(f"{path}.Values[{bad[0]}]", f"expected a string or a finite number, got {_show(values[bad[0]])}")
        return None
    default = _get(spec, "Default")
    if default is None:
        default = values[0]
    elif default not in values:
        v.add(f"{path}.Default", f"must be one of Values, got {_show(default)}")
    bench = _get(spec, "Benchmark")
    if bench is not None and bench not in values:
        v.add(f"{path}.Benchmark", f"the benchmarking input must be one of Values, got {_show(bench)}")
        bench = None
    tunable = _get(spec, "Tunable") or False
    if not isinstance(tunable, bool):
        v.add(f"{path}.Tunable", f"expected true or false, got {_show(tunable)}")
        tunable = False
    if tunable and bench is not None:
        v.add(f"{path}.Benchmark", "an input has a Benchmark value; a Tunable parameter is a knob the manager "
                                   "chooses, not an input")
    if tunable and len(set(map(str, values))) != len(values):
        v.add(f"{path}.Values", "values of a Tunable parameter must be distinct")
    return Parameter(var, str(name), ptype, tuple(values), default, bench, tunable)


def parse_manifest(data: Any, field_prefix: str = "manifest") -> Manifest:
    """Parse JSON text or a decoded object; raises services.errors.InvalidArgument listing every problem."""
    v = Violations()
    if isinstance(data, str | bytes):
        data = json_text.loads(data, field_prefix)
    else:
        json_text.require_storable(data, field_prefix)
    if not isinstance(data, dict):
        v.add(field_prefix, "expected a JSON object with Name and Modules")
        v.raise_if_any()
    misspelt_keys(data, ("Name", "Author", "Modules"), field_prefix, v)
    misplaced_keys(data, f"{field_prefix}.Modules[i]", "manifest", v, field_prefix)
    name = _get(data, "Name")
    if not (isinstance(name, str) and name.strip()):
        v.add(f"{field_prefix}.Name", "required: the application's name")
        name = ""
    modules_raw = _get(data, "Modules")
    modules: list[Module] = []
    if not (isinstance(modules_raw, list) and modules_raw):
        v.add(f"{field_prefix}.Modules", "required: a non-empty list of modules")
        modules_raw = []
    # What every module declares, so one module may constrain or address another's groups.
    declared = [_declared(m) for m in modules_raw]
    textual = frozenset(x for d in declared for x in d[3])
    for mi, m in enumerate(modules_raw):
        mp = f"{field_prefix}.Modules[{mi}]"
        if not isinstance(m, dict):
            v.add(mp, "expected an object")
            continue
        misspelt_keys(m, MODULE_KEYS, mp, v)
        misplaced_keys(m, mp, "module", v, mp)
        params_raw = _get(m, "Parameters") or []
        if not isinstance(params_raw, list):
            v.add(f"{mp}.Parameters", "expected a list of parameters ({Var, Name, Type, Values})")
            params_raw = []
        params = [p for i, ps in enumerate(params_raw)
                  if (p := _parameter(ps, f"{mp}.Parameters[{i}]", v)) is not None]
        parameter_vars = frozenset(p.var for d in declared for p in d[0])
        known = set(parameter_vars) | {x for d in declared for x in d[1]}
        others = frozenset(g for j, d in enumerate(declared) if j != mi for g in d[2])
        mname = _get(m, "ModuleName") or ("Main" if len(modules_raw) == 1 else f"Module{mi}")
        if not (isinstance(mname, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,62}", mname)):
            v.add(f"{mp}.ModuleName", "expected a name (letter, then letters, digits, - or _)")
            mname = f"Module{mi}"
        impls_raw = _get(m, "Implementations")
        if not (isinstance(impls_raw, list) and impls_raw):
            v.add(f"{mp}.Implementations", "required: a non-empty list of implementations")
            impls_raw = []
        impls = [im for i, s in enumerate(impls_raw)
                 if (im := _implementation(s, f"{mp}.Implementations[{i}]", v, known, mname, others, textual,
                                           parameter_vars))
                 is not None]
        names = [im.name for im in impls]
        if len(set(names)) != len(names):
            v.add(f"{mp}.Implementations", "implementation names must be distinct")
        modules.append(Module(mname, tuple(params), tuple(impls)))
    _check_modules(modules, field_prefix, v)
    v.raise_if_any()
    # The module named Main is the application; the others are services it needs (see above).
    modules.sort(key=lambda mod: mod.name.lower() != "main")
    manifest = Manifest(name, str(_get(data, "Author") or ""), tuple(modules), raw=data)
    if len(modules) > 1:
        n = math.prod(len(mod.implementations) for mod in modules)
        if n > MAX_VARIANTS:
            v.add(f"{field_prefix}.Modules", f"{n} combinations of implementations; at most {MAX_VARIANTS}")
    v.raise_if_any()
    return manifest


def _list(x: Any) -> list:
    return x if isinstance(x, list) else []


def _declared(module: Any) -> tuple[list[Parameter], set[str], set[str], set[str]]:
    """A module's parameters, chosen variables, group ids and variables that may hold text,
    read leniently (errors come later)."""
    if not isinstance(module, dict):
        return [], set(), set(), set()
    params = [p for ps in _list(_get(module, "Parameters")) if (p := _parameter(ps, "", Violations()))]
    textual = {p.var for p in params if _is_textual(p.values)}
    chosen: set[str] = set()
    groups: set[str] = set()
    for impl in _list(_get(module, "Implementations")):
        res = _get(impl, "Resources") if isinstance(impl, dict) else None
        for g in _list(_get(res, "Groups")) if isinstance(res, dict) else []:
            if not isinstance(g, dict):
                continue
            if isinstance(_get(g, "GroupID"), str):
                groups.add(_get(g, "GroupID"))
            specs = [_get(g, "NumInstances"), *((_get(g, "Attributes") or {}).values()
                                                if isinstance(_get(g, "Attributes"), dict) else [])]
            for c in specs:
                if isinstance(c, dict) and isinstance(var := _get(c, "Var"), str):
                    chosen.add(var)
                    given = _get(c, "Values") if _get(c, "Value") is None else [_get(c, "Value")]
                    if isinstance(given, list) and _is_textual(given):
                        textual.add(var)
    return params, chosen, groups, textual


def _check_modules(modules: list[Module], prefix: str, v: Violations) -> None:
    """Across modules: distinct names, group ids and parameters; one domain per shared variable."""
    seen_names: set[str] = set()
    group_owner: dict[str, str] = {}
    param_owner: dict[str, str] = {}
    domains: dict[str, tuple[str, tuple]] = {}
    for mi, mod in enumerate(modules):
        mp = f"{prefix}.Modules[{mi}]"
        if mod.name.lower() in seen_names:
            v.add(f"{mp}.ModuleName", f"duplicate module name {mod.name!r}")
        seen_names.add(mod.name.lower())
        for p in mod.parameters:
            if p.var in param_owner:
                v.add(f"{mp}.Parameters", f"{p.var} is already a parameter of module {param_owner[p.var]!r}; "
                                          "declare each input once")
            param_owner.setdefault(p.var, mod.name)
        for ii, impl in enumerate(mod.implementations):
            for g in impl.groups:
                owner = group_owner.setdefault(g.id, mod.name)
                if owner != mod.name:
                    v.add(f"{mp}.Implementations[{ii}].Resources.Groups", f"GroupID {g.id!r} is also a group of "
                          f"module {owner!r}; one reservation holds every module's groups, so ids must differ")
            for var, c in impl.choices().items():
                first = domains.setdefault(var, (mod.name, c.values))
                if first[0] != mod.name and first[1] != c.values:
                    v.add(f"{mp}.Implementations[{ii}]", f"{var} is chosen in module {first[0]!r} from "
                          f"{list(first[1])} but here from {list(c.values)}; a shared variable is one choice")


def substitute(text: str, env: dict[str, Any]) -> str:
    """Replace whole `%name` tokens (so %arg1 never clobbers %arg10); unknown ones stay."""
    return _VAR.sub(lambda m: str(env[m.group()]) if m.group() in env else m.group(), text)
