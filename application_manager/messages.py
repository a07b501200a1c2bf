"""The AM's rows as harness.v1 messages: applications, runs, sessions, executions and configurations."""

from __future__ import annotations

from typing import Any

from application_manager import models as m
from application_manager.loaded import Loaded
from application_manager.profilers import BENCHMARK
from harness.v1 import application_manager_pb2 as pb

_SESSION_STATE = {"running": pb.ProfilingSession.STATE_RUNNING, "done": pb.ProfilingSession.STATE_DONE,
                  "stopped": pb.ProfilingSession.STATE_STOPPED, "failed": pb.ProfilingSession.STATE_FAILED}
_EXEC_STATE = {"running": pb.ApplicationExecution.STATE_RUNNING,
               "succeeded": pb.ApplicationExecution.STATE_SUCCEEDED,
               "failed": pb.ApplicationExecution.STATE_FAILED}


def config_pb(config: dict[str, Any]) -> pb.Configuration:
    return pb.Configuration(
        implementation=str(config.get("implementation", "")),
        values={k: str(v) for k, v in config.items() if k != "implementation" and v is not None},
        summary=", ".join(f"{k}={v}" for k, v in config.items() if v is not None),
    )


def application_pb(loaded: Loaded) -> pb.Application:
    a = loaded.app
    return pb.Application(id=a.id, tenant=a.tenant, name=a.name, manifest_json=a.manifest, slo_json=a.slo,
                          app_dir=a.app_dir, configurations=len(loaded.space),
                          dimensions=[d.name for d in loaded.space.dims], notes=loaded.space.notes,
                          created_at=a.created_at)


def run_pb(r: m.Run) -> pb.ProfileRun:
    return pb.ProfileRun(
        ordinal=r.ordinal, configuration=config_pb(r.config),
        input=pb.ProfileRun.INPUT_BENCHMARK if r.input == BENCHMARK else pb.ProfileRun.INPUT_PRODUCTION,
        ok=r.ok, error=r.error, execution_time_s=r.time_s, cost=r.cost, cpu_percent=r.cpu_percent or 0.0,
        memory_percent=r.memory_percent or 0.0, session_id=r.session_id, reason=r.reason)


def session_pb(s: m.Session) -> pb.ProfilingSession:
    return pb.ProfilingSession(id=s.id, application_id=s.application_id, profiler=s.profiler,
                               state=_SESSION_STATE[s.state], runs=s.runs, max_runs=s.max_runs, spent=s.spent,
                               message=s.message, started_at=s.started_at, ended_at=s.ended_at)


def execution_pb(e: m.Execution) -> pb.ApplicationExecution:
    return pb.ApplicationExecution(
        id=e.id, application_id=e.application_id, tenant=e.tenant, state=_EXEC_STATE[e.state],
        configuration=config_pb(e.config), predicted_time_s=e.predicted_time_s,
        predicted_cost=e.predicted_cost, measured_time_s=e.measured_time_s, measured_cost=e.measured_cost,
        slo_met=e.slo_met, error=e.error, output_tail=e.output_tail, reservation_id=e.reservation_id,
        started_at=e.started_at, ended_at=e.ended_at, slo=e.slo)
