"""Review 15 of the FPGA job manager: jobs with parts on a server taken as gone, and a pool that no longer holds
every job's minimum.

1. A job with parts on a server silent past jobs_silent_server_s kept some of them there (a resize from its
   recorded size cuts the silent parts first, but only as far as the new size goes below the recorded one), and
   could hold fewer live devices than its minimum while devices were free (/tmp/r1/m1.py, m2.py). The job manager
   now has the Orchestrator give the gone parts up and put all of the job's devices on servers that answer, in
   one step. FPGA-servers and the Orchestrator are real here (a partition: a server handle pointed at an address
   nothing answers on), as in review 12's tests.
2. EDF, when the pool shrinks below the jobs' minimums: a job EDF gives nothing was resized to 1, below its group's
   min_size: refused, decided again and logged every control round. Over the fake Orchestrator.
"""

from __future__ import annotations

import logging

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga.models import Group
from services.errors import ResourceExhausted
from tests.integration.fake_orchestrator import DEVICES, deadline
from tests.integration.test_fpga_jobs import deadline_job, start_irm, stop_irm
from tests.integration.test_fpga_jobs_review12 import _partition, group_parts, held

# -- 1. parts on a gone server ------------------------------------------------------------------------------


def job(jobs, job_id: str) -> jp.Job:  # noqa: ANN001
    return jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job_id))


def recorded_parts(register, group_id: str) -> dict[str, int]:  # noqa: ANN001
    with register.manager.db.read() as s:
        return dict(s.get(Group, group_id).parts)


def test_a_job_with_parts_on_a_gone_server_gets_all_its_devices_on_the_servers_that_answer(suite):
    running, _, jobs, orch, register = start_irm(suite, "edf", period=3600.0, silent_server_s=0.0)
    try:
        a = jobs.RegisterJob(deadline_job("a", 300.0, size=10**6, min_devices=2))
        b = jobs.RegisterJob(deadline_job("b", 200.0, size=10**6, max_devices=3))
        # b (the earlier deadline) 3, a the 5 left: a's part on fpga-0 cut to one device for b's group there.
        assert group_parts(orch, a.group_id) == {"fpga-0": 1, "fpga-1": 4}
        assert group_parts(orch, b.group_id) == {"fpga-0": 3}
        fpga0 = register.servers[0].address
        _partition(register, "fpga-1")                  # taken as gone at once (silent_server_s=0)
        register.manager.control_once()                 # the pool shrank to fpga-0's 4 devices: EDF decides
        # EDF on 4: b 2 (its minimum and the one left over), a its minimum of 2 -- both on fpga-0, nothing of a
        # left on fpga-1 (it held one dead device there beside its one live one, under its minimum, while one
        # device of fpga-0 stayed free).
        assert (job(jobs, a.id).devices, job(jobs, b.id).devices) == (2, 2)
        assert group_parts(orch, a.group_id) == {"fpga-0": 2} and group_parts(orch, b.group_id) == {"fpga-0": 2}
        assert recorded_parts(register, a.group_id) == {"fpga-0": 2, "fpga-1": 0}
        assert held(fpga0) == {a.group_id: 2, b.group_id: 2}
        register.manager.control_once()                 # applied: nothing decided again
        assert not register.manager._unapplied
    finally:
        stop_irm(running, register)


def test_a_job_whose_every_part_is_on_a_gone_server_moves_whole_to_one_that_answers(suite):
    running, _, jobs, orch, register = start_irm(suite, "edf", period=3600.0, silent_server_s=0.0)
    try:
        x = jobs.RegisterJob(deadline_job("x", 300.0, size=10**6, max_devices=4))
        y = jobs.RegisterJob(deadline_job("y", 200.0, size=10**6, max_devices=4))
        assert group_parts(orch, x.group_id) == {"fpga-0": 4} and group_parts(orch, y.group_id) == {"fpga-1": 4}
        _partition(register, "fpga-1")
        register.manager.control_once()
        # EDF on fpga-0's 4: y 3 (the earlier deadline), x 1. y's group kept one device on fpga-1 (its cut to one
        # before growing) and two live: now all three live.
        assert (job(jobs, x.id).devices, job(jobs, y.id).devices) == (1, 3)
        assert group_parts(orch, y.group_id) == {"fpga-0": 3} and group_parts(orch, x.group_id) == {"fpga-0": 1}
        assert held(register.servers[0].address) == {x.group_id: 1, y.group_id: 3}
    finally:
        stop_irm(running, register)


# -- 2. a pool below the jobs' minimums ----------------------------------------------------------------------


def refusals(caplog) -> int:  # noqa: ANN001
    return sum(r.getMessage().startswith("job resize refused") for r in caplog.records)


def test_edf_keeps_a_job_whose_minimum_no_longer_fits_at_it_once_not_every_round(irm_factory, caplog):
    caplog.set_level(logging.WARNING, logger="irm_fpga.jobs")
    irm = irm_factory("edf")
    a = irm.register("a", min_devices=3, **deadline(100.0, 10**6))
    b = irm.register("b", min_devices=3, **deadline(200.0, 10**6))
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (5, 3)
    resizes = []
    real = irm.orch.resize
    irm.orch.resize = lambda g, size, **kw: (resizes.append(size), real(g, size, **kw))[1]
    irm.orch.capacity = {"s1": 4}                    # four devices blacklisted: 6 minimums on 4 devices
    for _ in range(3):
        irm.clock.advance(1.0)
        irm.manager.control_once()
    # a (the earlier deadline) down to its minimum; b, which EDF leaves without one, keeps its 3 (its group
    # cannot go below): one resize, not a refused cut of b to 1 device every round.
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (3, 3)
    assert resizes == [3] and refusals(caplog) == 0 and not irm.manager._unapplied


def test_edf_does_not_grow_a_job_onto_the_devices_a_job_over_the_pool_keeps(irm_factory, caplog):
    caplog.set_level(logging.WARNING, logger="irm_fpga.jobs")
    irm = irm_factory("edf")
    late = irm.register("late", **deadline(200.0, 10**6))                  # minimum 1
    soon = irm.register("soon", min_devices=6, max_devices=6, **deadline(100.0, 10**6))
    assert (irm.job(late.id).devices, irm.job(soon.id).devices) == (2, 6)
    real = irm.orch.resize

    def only_what_is_free(g, size, **kw):  # noqa: ANN001, ANN202 - as the real one, which places devices
        with irm.orch.db.read() as s:
            others = sum(sum(o.parts.values()) for o in s.query(Group).filter(Group.deleted.is_(False), Group.id != g.id))
        if size > g.size and others + size > sum(irm.orch.capacity.values()):
            raise ResourceExhausted(f"{size - g.size} more device(s) needed; none free")
        return real(g, size, **kw)

    irm.orch.resize = only_what_is_free
    irm.orch.capacity = {"s1": 5}                    # soon's minimum (6) no longer fits
    for _ in range(3):
        irm.clock.advance(1.0)
        irm.manager.control_once()
    # soon keeps its 6 (it cannot go below); late was offered the 5 as if those were free, and its grow was
    # refused every round. It keeps one device.
    assert (irm.job(late.id).devices, irm.job(soon.id).devices) == (1, 6)
    assert refusals(caplog) == 0 and not irm.manager._unapplied


def test_a_refusal_that_comes_back_every_round_is_logged_once(irm_factory, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="irm_fpga.jobs")
    irm = irm_factory("edf")
    soon = irm.register("soon", **deadline(100.0, 10**6))
    later = irm.register("later", **deadline(200.0, 10**6))
    assert (irm.job(soon.id).devices, irm.job(later.id).devices) == (DEVICES - 1, 1)

    def refuse(self, g, size, **kw):  # noqa: ANN001, ANN202
        raise ResourceExhausted("no device free")

    monkeypatch.setattr(type(irm.orch), "resize", refuse)
    irm.manager.retire("alice", soon.id)            # later's grow to every device: refused
    for _ in range(3):                              # and again each round (it may pass: it is tried)
        irm.clock.advance(1.0)
        irm.manager.control_once()
    assert irm.manager._unapplied and irm.job(later.id).devices == 1
    assert refusals(caplog) == 1



def test_the_throughput_broker_never_cuts_a_job_below_its_minimum_when_the_pool_shrinks(irm_factory, caplog):
    caplog.set_level(logging.WARNING, logger="irm_fpga.jobs")
    irm = irm_factory("throughput")
    goal = {"throughput": jp.ThroughputGoal(actions_per_s=1000.0)}     # more than any device count gives
    a = irm.register("a", min_devices=3, **goal)
    irm.clock.advance(1.0)
    b = irm.register("b", min_devices=3, **goal)
    assert irm.job(a.id).devices >= 3 and irm.job(b.id).devices >= 3
    irm.orch.capacity = {"s1": 4}                    # 6 minimums on 4 devices: the broker grants one job 3, one 1
    for _ in range(3):
        irm.clock.advance(1.0)
        irm.complete(irm.job(a.id), 10)
        irm.complete(irm.job(b.id), 10)
        irm.manager.control_once()
    # The one it could not give its minimum keeps it (its group cannot go below), not a refused cut every round.
    assert sorted([irm.job(a.id).devices, irm.job(b.id).devices]) == [3, 3]
    assert refusals(caplog) == 0
