"""The `replay` back-end: a VM "runs" an application by replaying a measured run.

Profilers can then be evaluated on real measurements at scale, through the
same path as live runs (CRS reservation, agent Execute, release). An
execution names the measured run through its environment:

* `HARNESS_REPLAY_WORKLOAD` (required): the dataset's workload;
* `HARNESS_REPLAY_INPUT_SIZE` (optional): which input of that workload;
* one variable per configuration column of the dataset, by its name (e.g.
  `cloud=aws`, `vcpus=4`): the configuration whose measurement is replayed.

The dataset is the generic replay CSV of README ("Replay datasets"). The
execution does not run anything and does not wait: it answers at once with
the measured wall time, the measured cost (`ExecutionExited.replayed_cost`,
with `replayed` set) and the measured status (a failed run exits 1 with its
error as the reason). A measured run longer than the execution's timeout
ends as a live one would have: killed at the limit (reason "timeout"), its
time the limit and its cost the measured cost for that much of the run. One
costing more than the execution's `replay_cost_limit` ends where its cost
reaches the limit (reason "cost limit"), whichever limit comes first: a
profiling budget bounds a replayed run by what it costs, which the caller
cannot know from its reservation's price.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from irm_compute.sandbox import TIMEOUT, Event, Exited, Output, Sample, Started
from services.errors import FailedPrecondition, InvalidArgument

WORKLOAD_ENV = "HARNESS_REPLAY_WORKLOAD"
INPUT_ENV = "HARNESS_REPLAY_INPUT_SIZE"
# A live run past its timeout is SIGKILLed (irm_compute.sandbox), and exits with -signal.
_KILLED = -int(signal.SIGKILL)
COST_LIMIT = "cost limit"     # ExecutionExited.reason of a replayed run ended at its replay_cost_limit


@dataclass(frozen=True)
class ReplayedExited(Exited):
    """The end of a replayed run: its `replayed_cost` is what the measured run cost, 0 included (a free run), where
    a live run's 0 means "cost its reservation" (ExecutionExited.replayed)."""


class ReplayBackend:
    def __init__(self, dataset: Any, source: str) -> None:
        self.dataset = dataset
        self.source = source

    @classmethod
    def load(cls, path: str) -> ReplayBackend:
        if not path:
            raise ValueError("the replay back-end needs `dataset`: a CSV in the replay format")
        # The replay CSV format is the Application Manager's; its reader is reused, not copied.
        from application_manager.replay import Dataset

        return cls(Dataset.load(path), path)

    def execution(self, execution_id: str, argv: list[str], env: dict[str, str],
                  on_exit: Callable[[Any], None] | None = None, timeout_s: float = 0.0,
                  cost_limit: float = 0.0) -> ReplayExecution:
        from application_manager.replay import parse_value

        workload = env.get(WORKLOAD_ENV, "")
        if not workload:
            raise InvalidArgument.of(f"env[{WORKLOAD_ENV}]", "required by the replay back-end: the workload")
        if workload not in self.dataset.workloads:
            raise InvalidArgument.of(f"env[{WORKLOAD_ENV}]", f"{workload!r} is not in {self.source}")
        size = parse_value(env[INPUT_ENV]) if env.get(INPUT_ENV) else None
        key = tuple(parse_value(env[p]) if p in env else None for p in self.dataset.params)
        run = self.dataset.run(workload, key, size)
        if run is None:
            config = ", ".join(f"{p}={v}" for p, v in zip(self.dataset.params, key, strict=True))
            raise FailedPrecondition(f"{self.source} has no measured run of {workload!r} with {config}")
        return ReplayExecution(execution_id, argv, run, self.source, on_exit, timeout_s, cost_limit)


class ReplayExecution:
    """Duck-types irm_compute.sandbox.LocalExecution for a run that already happened."""

    def __init__(self, execution_id: str, argv: list[str], run: Any, source: str,
                 on_exit: Callable[[Any], None] | None, timeout_s: float = 0.0, cost_limit: float = 0.0) -> None:
        self.execution_id = execution_id
        self.argv = argv
        self._run = run
        self.timeout_s = timeout_s   # 0: no limit, as LocalExecution's
        self.cost_limit = cost_limit     # 0: no limit
        self._source = source
        self._on_exit = on_exit
        self._started: Started | None = None
        self._exited: Exited | None = None
        self._done = threading.Event()
        self.started_at = 0.0  # epoch seconds, as LocalExecution's
        # Over as soon as it starts: nothing runs (the agent reads it to merge a VM's series, as it does
        # LocalExecution's).
        self.ended_at: float | None = None

    def start(self) -> Started:
        self.started_at = self.ended_at = time.time()
        self._started = Started(self.execution_id, 0, (), 0.0,
                                (f"replayed from {self._source}: nothing runs; measured time and cost",))
        self._exited = self._end()
        self._done.set()
        if self._on_exit is not None:
            # As LocalExecution's reaper does: off the caller's thread (it may hold the agent's lock).
            threading.Thread(target=self._on_exit, args=(self,), name=f"{self.execution_id}-exit",
                             daemon=True).start()
        return self._started

    @property
    def cut(self) -> tuple[float, str] | None:
        """Where a limit ends the measured run, (its time there, the reason), the earlier limit's; None: it runs to
        its end. A live run would have been killed there, whatever it went on to do (finish, or fail later)."""
        run = self._run
        cuts = []
        if self.timeout_s > 0 and run.time_s > self.timeout_s:
            cuts.append((self.timeout_s, TIMEOUT))
        if self.cost_limit > 0 and run.cost > self.cost_limit:
            cuts.append((run.time_s * self.cost_limit / run.cost, COST_LIMIT))
        return min(cuts) if cuts else None

    def _end(self) -> ReplayedExited:
        run = self._run
        if (cut := self.cut) is not None:
            at, reason = cut
            # Billed as the measured run was, for the part of it a live run would have had.
            cost = self.cost_limit if reason == COST_LIMIT else run.cost * at / run.time_s
            return ReplayedExited(_KILLED, at, reason, 0.0, 0.0, cost)
        return ReplayedExited(0 if run.ok else 1, run.time_s, "" if run.ok else (run.error or "failed"), 0.0, 0.0,
                              run.cost)

    def events(self) -> Iterator[Event]:
        assert self._started is not None and self._exited is not None
        yield self._started
        if (cut := self.cut) is not None:
            at, reason = cut
            limit = f"the timeout of {self.timeout_s:g} s" if reason == TIMEOUT else \
                f"its cost limit of {self.cost_limit:g} ({at:.4g} s in)"
            yield Output("stderr", f"replayed run of {self._run.time_s:g} s cut at {limit}\n".encode())
        elif not self._run.ok:
            yield Output("stderr", f"replayed failure: {self._run.error}\n".encode())
        yield self._exited

    def detach(self) -> None:
        return None

    def kill(self, reason: str = "") -> bool:
        return False

    def wait(self, timeout: float | None = None) -> Exited | None:
        self._done.wait(timeout)
        return self._exited

    @property
    def running(self) -> bool:
        return False

    @property
    def started(self) -> Started | None:
        return self._started

    @property
    def exited(self) -> Exited | None:
        return self._exited

    @property
    def samples(self) -> list[Sample]:
        return []
