"""The `replay` back-end: running a configuration returns a measured run from a dataset.

Profilers are evaluated on real measurements through the same code path as live runs
(application_manager.runner). The format is a generic CSV, one row per measured run:

    workload,runtime_s,cost[,status][,input_size],<parameter>,<parameter>,...

`status` is `ok` or an error text (a failed run still has its runtime and cost);
`input_size` (optional) tells inputs of one workload apart; every other column is a
configuration parameter (numbers where they parse, text otherwise, empty = not
applicable). Several rows of the same (workload, configuration, input) are merged: the
mean of the ok rows, or, if none is ok, the mean of the failed rows with the first error.
The price of a configuration (per second) is cost / runtime_s over all its rows: the
dataset's price list, the analogue of the CRS quote, known before running.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from application_manager import space as sp
from application_manager.profilers.base import BENCHMARK, History, Observation, Proposal

RESERVED = ("workload", "runtime_s", "cost", "status", "input_size")


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class Run:
    time_s: float
    cost: float
    ok: bool
    error: str = ""


def parse_value(text: str) -> Any:
    text = text.strip()
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        f = float(text)
        return f if math.isfinite(f) else text
    except ValueError:
        return text


_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
_AMOUNT = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:([KMGT])I?B?|B)", re.IGNORECASE)


def _amount(size: Any) -> float | None:
    """A size with a unit (`2GB`, `512 MiB`, `10G`, `64KB`) in bytes; None for anything else."""
    if not isinstance(size, str):
        return None
    m = _AMOUNT.fullmatch(size.strip())
    if m is None:
        return None
    return float(m.group(1)) * (_UNITS[m.group(2).upper()] if m.group(2) else 1)


class Dataset:
    def __init__(self, params: list[str], rows: list[dict[str, Any]], source: str = "") -> None:
        if not rows:
            raise DatasetError(f"{source or 'dataset'}: no rows")
        self.params = params
        self.source = source
        self.rows = rows
        self.workloads = sorted({r["workload"] for r in rows})
        self._runs: dict[tuple, list[dict]] = {}
        price: dict[tuple, list[float]] = {}
        for r in rows:
            k = self.key(r)
            self._runs.setdefault((r["workload"], r.get("input_size"), k), []).append(r)
            if r["runtime_s"] > 0:
                price.setdefault(k, []).append(r["cost"] / r["runtime_s"])
        self.price = {k: statistics.median(v) for k, v in price.items()}

    def key(self, r: dict[str, Any]) -> tuple:
        return tuple(r.get(p) for p in self.params)

    @classmethod
    def load(cls, path: str | Path) -> Dataset:
        from application_manager import convert

        path = Path(path)
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            if convert.is_ibm(header):
                return cls.from_records(convert.ibm_records(path), str(path))
            raw = list(reader)
        missing = [c for c in ("workload", "runtime_s", "cost") if c not in header]
        if missing:
            raise DatasetError(f"{path}: missing column(s) {', '.join(missing)}; the replay format needs "
                               "workload, runtime_s, cost (and optionally status, input_size)")
        return cls.from_records([{k.strip(): v for k, v in r.items()} for r in raw], str(path), header)

    @classmethod
    def from_records(cls, raw: list[dict[str, str]], source: str = "", header: list[str] | None = None) -> Dataset:
        header = header or list(raw[0].keys() if raw else [])
        params = [h for h in header if h not in RESERVED and h]
        rows = []
        for n, r in enumerate(raw, start=2):
            try:
                t, c = float(r["runtime_s"]), float(r["cost"])
            except (TypeError, ValueError):
                raise DatasetError(f"{source}:{n}: runtime_s and cost must be numbers") from None
            if not (math.isfinite(t) and math.isfinite(c)):
                # A NaN runtime would be replayed as a measurement and priced as NaN (an infinite one as price 0).
                raise DatasetError(f"{source}:{n}: runtime_s and cost must be finite numbers, got runtime_s="
                                   f"{str(r['runtime_s']).strip()!r}, cost={str(r['cost']).strip()!r}")
            status = (r.get("status") or "ok").strip()
            row = {"workload": str(r["workload"]).strip(), "runtime_s": t, "cost": c,
                   "ok": status.lower() == "ok", "error": "" if status.lower() == "ok" else status,
                   "input_size": parse_value(r["input_size"]) if r.get("input_size") not in (None, "") else None}
            for p in params:
                row[p] = parse_value(str(r.get(p) or ""))
            rows.append(row)
        return cls(params, rows, source)

    def input_sizes(self, workload: str) -> list[Any]:
        """The workload's input sizes, smallest (the benchmark input) first, largest (production) last: numbers by
        value, sizes with a unit (`512MB`, `2 GB`, `10G`) by what they amount to, other text (`small`, `large`) by
        the mean runtime of its ok runs on the configurations measured at every size (all its runs if none is ok or
        no configuration was measured at every size).
        Alphabetically, `small`/`medium`/`large` made `small` production and `2GB`/`5GB`/`10GB` made `5GB` it."""
        rows = [r for r in self.rows if r["workload"] == workload and r.get("input_size") is not None]
        sizes = sorted({r["input_size"] for r in rows}, key=sp._sort_key)
        if not sizes:
            return [None]
        if all(isinstance(x, int | float) for x in sizes):
            return sizes
        amounts = [_amount(x) for x in sizes]
        if all(a is not None for a in amounts):
            return [x for _, x in sorted(zip(amounts, sizes, strict=True), key=lambda ax: ax[0])]
        keys = {x: {self.key(r) for r in rows if r["input_size"] == x} for x in sizes}
        common = set.intersection(*keys.values())

        def mean_runtime(x: Any) -> float:
            use = [r for r in rows if r["input_size"] == x and (not common or self.key(r) in common)]
            ok = [r for r in use if r["ok"]]    # a failed run's time (a crash in seconds) says little of the size
            return statistics.fmean(r["runtime_s"] for r in ok or use)

        return sorted(sizes, key=lambda x: (mean_runtime(x), sp._sort_key(x)))

    def run(self, workload: str, key: tuple, input_size: Any = None) -> Run | None:
        rows = self._runs.get((workload, input_size, key))
        if not rows:
            return None
        ok = [r for r in rows if r["ok"]]
        use = ok or rows
        return Run(statistics.fmean(r["runtime_s"] for r in use), statistics.fmean(r["cost"] for r in use),
                   bool(ok), "" if ok else use[0]["error"])

    def space(self, workload: str, input_size: Any = None) -> sp.Space:
        rows = [r for r in self.rows if r["workload"] == workload and r.get("input_size") == input_size]
        if not rows:
            raise DatasetError(f"no runs of workload {workload!r}")
        return sp.from_records(self.params, rows)

    def prices(self, space: sp.Space) -> np.ndarray:
        return np.array([self.price.get(space.key(c), math.nan) for c in space.configs])

    def truth(self, workload: str, space: sp.Space, input_size: Any = None) -> list[Run | None]:
        return [self.run(workload, space.key(c), input_size) for c in space.configs]

    def history(self, space: sp.Space, workloads: list[str]) -> History:
        """Other workloads' production runs aligned to `space` (their largest input), failed ones with their
        times (a timeout's is a lower bound on a slow configuration's) and `failed` set."""
        lt = np.full((len(workloads), len(space)), np.nan)
        fl = np.full((len(workloads), len(space)), np.nan)
        for w, name in enumerate(workloads):
            size = self.input_sizes(name)[-1]
            for i, c in enumerate(space.configs):
                r = self.run(name, space.key(c), size)
                if r is not None and r.time_s > 0:
                    lt[w, i] = math.log(r.time_s)
                    fl[w, i] = 0.0 if r.ok else 1.0
        return History(lt, fl, list(workloads))

    def manifest(self, workload: str) -> dict[str, Any]:
        """An appendix-A manifest that profiles `workload` through the AM service and a replay agent.

        Every configuration column becomes a Tunable parameter, passed to the execution in the
        environment variable of the same name (what irm_compute.replay reads); input sizes, if
        the workload has several, become the input parameter `%input_size`. The VM it reserves
        is the smallest: a replayed run uses nothing, and costs what was measured.
        """
        rows = [r for r in self.rows if r["workload"] == workload]
        if not rows:
            raise DatasetError(f"no runs of workload {workload!r}; workloads: {', '.join(self.workloads)}")
        params: list[dict[str, Any]] = []
        env = {"HARNESS_REPLAY_WORKLOAD": workload}
        for col in self.params:
            vals = sorted({r.get(col) for r in rows}, key=sp._sort_key)
            numeric = all(isinstance(x, int | float) for x in vals)
            var = "%" + re.sub(r"[^A-Za-z0-9_]", "_", col if col[:1].isalpha() else f"c_{col}")
            params.append({"Var": var, "Name": col, "Type": ("FLOAT" if any(isinstance(x, float) for x in vals)
                                                            else "INT") if numeric else "STR",
                           "Values": vals if numeric else ["" if x is None else str(x) for x in vals],
                           "Tunable": True})
            env[col] = var
        sizes = self.input_sizes(workload)
        if sizes != [None]:
            params.append({"Var": "%input_size", "Name": "input_size", "Values": sizes, "Default": sizes[-1],
                           "Type": "FLOAT" if any(isinstance(x, float) for x in sizes) else
                           ("INT" if all(isinstance(x, int) for x in sizes) else "STR"),
                           **({"Benchmark": sizes[0]} if len(sizes) > 1 else {})})
            env["HARNESS_REPLAY_INPUT_SIZE"] = "%input_size"
        return {"Name": f"replay-{workload}", "Author": f"replayed from {self.source or 'a dataset'}",
                "Modules": [{"ModuleName": "Main", "Parameters": params, "Implementations": [{
                    "ImplementationName": "replay",
                    "Resources": {"Groups": [{"GroupID": "master", "Role": "MASTER", "Type": "Machine",
                                              "NumInstances": {"Value": 1},
                                              "Attributes": {"Cores": {"Value": 1}, "Memory": {"Value": 256}}}]},
                    "EnvironmentVars": env, "Command": ["replay", workload]}]}]}


class ReplayBackend:
    """Runs a workload's configurations by looking their measurements up."""

    def __init__(self, dataset: Dataset, workload: str, space: sp.Space | None = None) -> None:
        self.dataset = dataset
        self.workload = workload
        sizes = dataset.input_sizes(workload)
        self.production = sizes[-1]
        self.benchmark = sizes[0] if len(sizes) > 1 else None
        self.space = space or dataset.space(workload, self.production)

    @property
    def has_benchmark(self) -> bool:
        return self.benchmark is not None

    def execute(self, proposal: Proposal) -> Observation:
        size = self.benchmark if proposal.input == BENCHMARK else self.production
        cfg = self.space.configs[proposal.config]
        r = self.dataset.run(self.workload, self.space.key(cfg), size)
        if r is None:
            # Never measured at this input: the cloud could not provide it (as a quota refusal).
            return Observation(proposal.config, False, 0.0, 0.0, proposal.input, error="not measured in the dataset")
        return Observation(proposal.config, r.ok, r.time_s, r.cost, proposal.input, error=r.error)
