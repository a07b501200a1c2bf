"""Job-manager state (issue 5): FPGA jobs with QoS goals, on the Orchestrator's `Base` and database."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from irm_fpga.models import Base

# Request ids of the groups the job manager makes for its jobs (`job:<job id>[:<attempt>]`): the Orchestrator
# refuses them from tenants, so the manager may drop any such group no job owns.
JOB_GROUP_PREFIX = "job:"


class FpgaJob(Base):
    __tablename__ = "fpga_jobs"
    # Every control round reads the active (and queued) jobs in arrival order, a Hydrogen decision the recent
    # ones, and the Orchestrator a group's job: indexed, so years of retired jobs do not slow them down.
    __table_args__ = (UniqueConstraint("tenant", "request_id"),
                      Index("ix_fpga_jobs_state_registered_at", "state", "registered_at"))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str] = mapped_column(String(256))
    # What the request asked for, hashed (`services.idempotency.request_hash`: every field but request_id): a
    # request_id reused with another request is refused. "": registered before it was recorded, not compared.
    request_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    design: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(String(64), default="", index=True)
    policy: Mapped[str] = mapped_column(String(255))     # a plug-in is named package.module:function
    # "deadline" | "throughput" (irm_fpga.qos.jobs)
    goal: Mapped[str] = mapped_column(String(16))
    deadline_s: Mapped[float] = mapped_column(Float, default=0.0)      # relative, as registered
    deadline_at: Mapped[float] = mapped_column(Float, default=0.0)     # absolute, manager's clock
    size_actions: Mapped[int] = mapped_column(BigInteger, default=0)
    # Hydrogen policies: expected seconds per action on one device (0: not given)
    action_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    throughput_goal: Mapped[float] = mapped_column(Float, default=0.0)
    min_devices: Mapped[int] = mapped_column(Integer, default=1)
    max_devices: Mapped[int] = mapped_column(Integer, default=0)       # 0: no limit
    priority: Mapped[float] = mapped_column(Float, default=1.0)
    # queued (Hydrogen policies: waiting in the ready queue) | active | retired
    state: Mapped[str] = mapped_column(String(16), default="active")
    devices: Mapped[int] = mapped_column(Integer, default=0)
    observed_actions: Mapped[int] = mapped_column(BigInteger, default=0)
    reported_actions: Mapped[int] = mapped_column(BigInteger, default=0)
    achieved_throughput: Mapped[float] = mapped_column(Float, default=0.0)
    # [[time, devices], ...]
    allocations: Mapped[list] = mapped_column(JSON, default=list)
    registered_at: Mapped[float] = mapped_column(Float, index=True)
    retired_at: Mapped[float] = mapped_column(Float, default=0.0)


class FpgaJobController(Base):
    """What the job manager keeps between control periods for one job, so it survives a restart.

    The throughput job controller's state (seed 000 §III-B, eq. 1-4:
    `irm_fpga.qos.throughput.ControllerState`), the last progress sample (for
    the achieved throughput) and the servers' `completed` counters last seen
    (so a restarted manager does not count a group's past actions twice).
    """

    __tablename__ = "fpga_job_controllers"

    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("fpga_jobs.id", ondelete="CASCADE"), primary_key=True)
    last_time: Mapped[float] = mapped_column(Float)
    last_actions: Mapped[int] = mapped_column(BigInteger)
    a_hat: Mapped[float | None] = mapped_column(Float, nullable=True)        # EMA of device-seconds per action
    throughput: Mapped[float | None] = mapped_column(Float, nullable=True)   # t_j(k)
    goal: Mapped[float | None] = mapped_column(Float, nullable=True)         # g_j(k); may be +inf
    request: Mapped[int] = mapped_column(Integer, default=0)                 # r_j(k)
    performance: Mapped[float] = mapped_column(Float, default=1.0)           # p_j(k); may be +inf
    sample_time: Mapped[float] = mapped_column(Float)
    sample_actions: Mapped[int] = mapped_column(BigInteger)
    # server name -> the last `completed` counter of the job's group part there
    seen: Mapped[dict] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float)


class FpgaJobPool(Base):
    """The pool a Hydrogen elasticity manager provisions for jobs (seed 001 Algorithm 3), one row.

    Kept so a restarted manager goes on from the pool it had grown or shrunk to, not from every device.
    """

    __tablename__ = "fpga_job_pool"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)      # always 1
    devices: Mapped[int] = mapped_column(Integer)
    policy: Mapped[str] = mapped_column(String(255))     # the policy that sized it: another one starts afresh
    updated_at: Mapped[float] = mapped_column(Float)
