"""The FPGA job manager's configuration (`irm_fpga.jobs`): its settings, and their checks at start-up.

The checks run before the manager makes anything: a setting out of range is a ValueError naming it, and a
Hydrogen policy's name gives the scheduler the manager runs (`irm_fpga.qos.dispatch`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from irm_fpga.qos import dispatch
from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos.plugins import ENTRY_POINT_GROUP
from irm_fpga.qos.registry import ALLOCATION_POLICIES, SCHEDULING_ALGORITHMS, is_scheduling
from irm_fpga.qos.throughput import DEFAULT_ALPHA

MAX_CONTROL_PERIOD_S = 86400.0  # a longer period is a typo (and overflows the thread's wait)


@dataclass
class JobsConfig:
    policy: str = "edf"                # "edf" | "throughput" | a Hydrogen scheduler (`irm_fpga.jobs`' docstring)
    control_period_s: float = 1.0      # throughput: control period; all: progress sampling (Hydrogen: dispatch)
    alpha: float = DEFAULT_ALPHA       # EMA factor of the job controllers (seed 000 eq. 2)
    window: int = 30                   # Hydrogen: ready-queue jobs each decision looks at (seed 001 §VI)
    late_after_s: float = hy.LATE_AFTER_S   # Hydrogen: a job waiting longer to start is late (seed 001 §VI)
    pool_min: int = 1                  # Hydrogen managed modes: the elasticity manager's bounds on the pool
    pool_max: int = 0                  # 0: every usable device not held by other groups
    beta: float = 2.5                  # Hydrogen managed modes: Algorithm 3's shrink threshold
    lookahead_budget_s: float = 0.25   # managed_lookahead: search time per decision (it holds the manager's lock)
    plugin_timeout_s: float = 1.0      # a plug-in algorithm (module:function) answers each decision within this
    # A server holding job groups that does not answer holds decisions back (its devices would count as gone and
    # jobs shrink for a timeout); silent longer than this, it is taken as gone and decisions go on without it.
    silent_server_s: float = 60.0
    # Hydrogen: jobs one tenant may have waiting in the ready queue (state queued); one more is RESOURCE_EXHAUSTED.
    max_queued_per_tenant: int = 1000

    @classmethod
    def of(cls, config: Any) -> JobsConfig:
        """A JobsConfig, or one read from the `jobs_*` fields of another config (e.g. `jobs_policy`)."""
        if isinstance(config, JobsConfig):
            return config
        d = cls()
        return cls(**{f: getattr(config, f"jobs_{f}", getattr(d, f)) for f in cls.__dataclass_fields__})


def checked_scheduler(config: JobsConfig) -> dispatch.Scheduler | None:
    """The Hydrogen scheduler `config.policy` names (None: "edf" or "throughput", which resize groups), once every
    setting is checked: a ValueError names the first out of range."""
    if len(config.policy) > 255:
        raise ValueError("job manager configuration: a policy name is at most 255 characters")
    if config.policy not in ALLOCATION_POLICIES and not is_scheduling(config.policy):
        raise ValueError(f"job manager configuration: unknown policy {config.policy!r}; "
                         f"known: {', '.join(sorted({*ALLOCATION_POLICIES, *SCHEDULING_ALGORITHMS}))}; "
                         f"or a scheduling algorithm of your own as 'package.module:function' or the name of an "
                         f"entry point of group {ENTRY_POINT_GROUP!r}")
    if not config.silent_server_s >= 0:
        raise ValueError("job manager configuration: silent_server_s must be >= 0 seconds")
    if not (isinstance(config.max_queued_per_tenant, int) and config.max_queued_per_tenant >= 1):
        raise ValueError(f"job manager configuration: max_queued_per_tenant must be a whole number >= 1 "
                         f"(got {config.max_queued_per_tenant!r})")
    if not config.lookahead_budget_s >= 0:
        raise ValueError("job manager configuration: lookahead_budget_s must be >= 0 seconds")
    if not 0 < config.plugin_timeout_s <= MAX_CONTROL_PERIOD_S:
        raise ValueError(f"job manager configuration: plugin_timeout_s must be > 0 and at most "
                         f"{MAX_CONTROL_PERIOD_S:g} seconds (got {config.plugin_timeout_s!r})")
    # A Hydrogen policy dispatches from a ready queue; None: "edf" or "throughput" resize groups.
    scheduler: dispatch.Scheduler | None = None
    if is_scheduling(config.policy):
        if not (1 <= config.pool_min
                and (config.pool_max == 0 or config.pool_min <= config.pool_max)):
            raise ValueError("job manager configuration: need 1 <= pool_min <= pool_max (pool_max 0: all)")
        try:
            s = dispatch.scheduler_for(config.policy, window=config.window,
                                       late_after=config.late_after_s)
            scheduler = replace(s, beta=config.beta, pool_min=config.pool_min,
                                budget_s=config.lookahead_budget_s)
        except ValueError as e:
            raise ValueError(f"job manager configuration: {e}") from None
    if not 0 < config.control_period_s <= MAX_CONTROL_PERIOD_S:
        raise ValueError(f"job manager configuration: control_period_s must be > 0 and at most "
                         f"{MAX_CONTROL_PERIOD_S:g} seconds (got {config.control_period_s!r})")
    if not 0.0 <= config.alpha <= 1.0:
        raise ValueError("job manager configuration: alpha must be in [0, 1]")
    return scheduler
