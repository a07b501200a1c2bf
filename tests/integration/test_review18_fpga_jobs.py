"""A job whose retirement was cut short between deleting its group and recording it retired (`JobManager._finish`):
it stayed active for good, holding on paper devices nobody used ("job resize refused" every round) while the other
jobs shared what was left. Now it is retired when the manager starts, and by the running manager before it decides.

Over the fake Orchestrator (groups in the real database), on virtual time (`tests.integration.fake_orchestrator`).
"""

from __future__ import annotations

import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga.jobs import RETIRED, JobManager
from irm_fpga.models import Group
from tests.integration.fake_orchestrator import DEVICES, deadline


class _Crash(BaseException):
    """The process dies here (kill -9, power): no except clause runs."""


def _retire_cut_short(irm, job_id: str, error: BaseException, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """RetireJob for `job_id`, `error` raised where the job would be recorded retired (its group already deleted)."""
    real = JobManager._update

    def update(self, jid, controller_at=None, **fields):  # type: ignore[no-untyped-def]
        if fields.get("state") == RETIRED:
            raise error
        return real(self, jid, controller_at, **fields)

    monkeypatch.setattr(JobManager, "_update", update)
    with pytest.raises(type(error)):
        irm.manager.retire("alice", job_id)
    monkeypatch.undo()
    assert irm.job(job_id).state == "active" and _group_deleted(irm, job_id)     # the window


def _group_deleted(irm, job_id: str) -> bool:  # type: ignore[no-untyped-def]
    with irm.orch.db.read() as s:
        g = s.get(Group, irm.job(job_id).group_id)
    return g is None or g.deleted


@pytest.mark.parametrize("policy", ["edf", "throughput", "fcfs_max"])
def test_a_job_left_active_without_its_group_by_a_crash_is_retired_on_restart(irm_factory, monkeypatch, policy,
                                                                              caplog):
    irm = irm_factory(policy)
    phantom = irm.register("phantom", max_devices=DEVICES, **deadline(100.0, 1000))
    assert irm.job(phantom.id).devices == DEVICES
    irm.clock.advance(5.0)
    _retire_cut_short(irm, phantom.id, _Crash(), monkeypatch)

    irm.clock.advance(5.0)
    irm.restart()
    gone = irm.job(phantom.id)
    assert gone.state == RETIRED and gone.devices == 0 and gone.retired_at == pytest.approx(1010.0)
    assert gone.allocations[-1] == [1010.0, 0]
    assert [r.job for r in caplog.records if "its retirement was cut short" in r.getMessage()] == [phantom.id]
    # Every device is there for the next job, not the one the phantom's resize could not take.
    fresh = irm.register("fresh", **deadline(100.0, 1000))
    assert irm.job(fresh.id).state == "active" and irm.job(fresh.id).devices == DEVICES
    assert irm.orch.size_of(irm.job(fresh.id).group_id) == DEVICES


def test_a_half_retired_job_of_another_policy_does_not_stop_a_restart_under_a_new_one(irm_factory, monkeypatch):
    irm = irm_factory("throughput")
    phantom = irm.register("phantom", throughput=jp.ThroughputGoal(actions_per_s=10.0))
    _retire_cut_short(irm, phantom.id, _Crash(), monkeypatch)
    irm.policy = "edf"                  # EDF refuses to start over an active throughput job: this one is none
    irm.restart()
    assert irm.job(phantom.id).state == RETIRED
    assert irm.job(irm.register("next", **deadline(100.0, 10)).id).devices == DEVICES


@pytest.mark.parametrize("policy", ["edf", "throughput", "fcfs_max"])
def test_the_running_manager_retires_a_job_whose_retirement_failed_after_its_group_went(irm_factory, monkeypatch,
                                                                                       policy):
    # A database write failing at the wrong moment leaves the same state with the manager still running.
    irm = irm_factory(policy)
    phantom = irm.register("phantom", max_devices=DEVICES, **deadline(100.0, 1000))
    _retire_cut_short(irm, phantom.id, RuntimeError("database unavailable"), monkeypatch)
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(phantom.id).state == RETIRED and irm.job(phantom.id).devices == 0
    fresh = irm.register("fresh", **deadline(100.0, 1000))
    assert irm.job(fresh.id).devices == DEVICES


@pytest.mark.parametrize("policy", ["edf", "fcfs_max"])
def test_a_registration_right_after_such_a_failure_gets_every_device(irm_factory, monkeypatch, policy):
    # The decision a registration makes counted the phantom: EDF shared the pool with it (all but one device to
    # its earlier deadline), a Hydrogen scheduler took its devices as busy.
    irm = irm_factory(policy)
    phantom = irm.register("phantom", max_devices=DEVICES, **deadline(10.0, 1000))
    _retire_cut_short(irm, phantom.id, RuntimeError("database unavailable"), monkeypatch)
    fresh = irm.register("fresh", **deadline(100.0, 1000))
    assert irm.job(fresh.id).devices == DEVICES and irm.job(phantom.id).state == RETIRED
