"""Review 15 of the FPGA job manager, Hydrogen dispatch: a running job that overruns the cost model's prediction.

The reviewer's case (/tmp/r1/repro1.py): j2 (2 devices, predicted to run 0.5 s) is still running 2 s later; j3 needs
all 8 devices, j4 fits in the 6 free. A running job's end was taken as max(now, predicted end), so an overdue job
was always about to end "now": managed_deadline kept waiting to give j3 every device, and j4 waited with 6
devices free for as long as j2 overran. Over the fake Orchestrator on virtual time, SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga import jobs as jobs_mod
from irm_fpga.jobs import ACTIVE, QUEUED
from tests.integration.fake_orchestrator import DEVICES, Irm

# No queued job turns late during these tests (a late job is an event of its own, which would hide the point).
NEVER_LATE = {"late_after_s": 600.0}


def register(irm: Irm, tag: str, mn: int, mx: int, size: int, action_s: float):
    return irm.register(tag, deadline=jp.DeadlineGoal(deadline_s=60.0, size_actions=size), min_devices=mn,
                        max_devices=mx, action_seconds=action_s)


def rounds(irm: Irm, seconds: int, until) -> float:  # noqa: ANN001
    """Control rounds a second apart for up to `seconds`; the clock time (from the start) `until()` first held,
    or inf."""
    for _ in range(seconds + 1):
        if until():
            return irm.clock.now() - 1000.0
        irm.clock.advance(1.0)
        irm.manager.control_once()
    return float("inf")


def overdue_pair(irm: Irm, progress: list[int]):  # noqa: ANN201
    """j2 running on 2 devices past its predicted end (0.5 s), with `progress` completed in each of its first
    rounds; then j3 (all 8 devices) and j4 (3 or more) registered."""
    j2 = register(irm, "j2", 2, 2, 10, 0.1)                   # 10 x 0.1 s on 2 devices: 0.5 s
    assert irm.job(j2.id).state == ACTIVE and irm.job(j2.id).devices == 2
    for n in progress:
        irm.clock.advance(1.0)
        irm.complete(irm.job(j2.id), n)
        irm.manager.control_once()
    j3 = register(irm, "j3", DEVICES, DEVICES, 5, 0.1)
    j4 = register(irm, "j4", 3, 0, 50, 0.5)
    return j2, j3, j4


@pytest.mark.parametrize("policy", ["managed_deadline", "managed"])
def test_a_job_that_fits_the_free_devices_is_not_held_for_a_running_job_that_overran(irm_factory, policy):
    irm = irm_factory(policy)                                 # jobs turn late after 1 s, as by default
    j2, j3, j4 = overdue_pair(irm, [0, 0])                    # no progress seen: it runs 2 s past its 0.5 s
    # Expected to run as long again as it has (2 s), not to end now: j4 starts on the free devices at once
    # (managed_deadline held it for as long as j2 ran; managed until it turned late).
    assert irm.job(j4.id).state == ACTIVE and irm.job(j4.id).devices >= 3
    assert irm.job(j3.id).state == QUEUED and irm.job(j2.id).state == ACTIVE


def test_an_overdue_job_with_progress_is_predicted_from_its_rate_and_a_stall_is_looked_at_again(irm_factory):
    irm = irm_factory("managed_deadline", **NEVER_LATE)
    # 9 of its 10 actions done in 2 s, 4 in the last second: about to end. The scheduler may well wait for it
    # (j3 then gets every device); but if it stalls there, j4 must not wait for ever with 6 devices free.
    j2, j3, j4 = overdue_pair(irm, [5, 4])
    assert irm.job(j4.id).state == QUEUED                     # held for j2's devices, expected in 0.25 s
    end = irm.manager._predicted_end(irm.job(j2.id), irm.manager._hjob(irm.job(j2.id), DEVICES), irm.clock.now())
    assert end == pytest.approx(irm.clock.now() + 1 / 4)      # 1 left at 4 actions/s (its last period's rate)
    assert irm.manager._recheck_at is not None                # j4 was held back: decided again once j2 is late
    started = rounds(irm, 40, lambda: irm.job(j4.id).state == ACTIVE)
    assert started <= 2.0 + jobs_mod.OVERDUE_RECHECK_MAX_S    # with the queue, devices and late jobs unchanged
    assert irm.job(j2.id).state == ACTIVE and irm.job(j2.id).observed_actions == 9


def test_no_decision_is_added_while_no_waiting_job_fits_the_free_devices(irm_factory):
    irm = irm_factory("managed_deadline", **NEVER_LATE)
    wide = register(irm, "wide", DEVICES, DEVICES, 10, 0.1)   # every device, overrunning from 0.125 s on
    other = register(irm, "other", 1, 1, 10, 0.1)             # nothing free for it: no reason to decide again
    assert irm.job(wide.id).state == ACTIVE and irm.job(other.id).state == QUEUED
    assert irm.manager._recheck_at is None


def test_free_devices_are_counted_in_the_pool_the_decision_provisioned(irm_factory):
    # The elastic pool is 2 of the 8 devices: a job waiting behind an overrunning one that fills those 2 was not
    # held back for devices the decision had (the other 6 are outside the pool), so nothing is decided again.
    irm = irm_factory("managed_deadline", **NEVER_LATE)
    irm.manager._pool_size = 2
    wide = register(irm, "wide", 2, 2, 10, 0.1)               # the whole pool, overrunning from 0.5 s on
    other = register(irm, "other", 1, 1, 10, 0.1)
    assert irm.job(wide.id).state == ACTIVE and irm.job(other.id).state == QUEUED
    assert irm.manager.pool_devices() <= 2                    # (the elasticity manager may shrink it further)
    assert irm.manager._recheck_at is None                    # counted against all 8 devices, it was 4600.5
