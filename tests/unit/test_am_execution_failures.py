"""The Application Manager when parts of the cloud fail: a run that cannot be carried out ends "failed", never
"running"; applications whose resource types are not offered after a restart stay readable.

The Application Manager runs in-process on SQLite; the CRS and agent are out of reach (127.0.0.1:1), so the
back-end's `run` and `prices` are stood in for -- the edge this test is about.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import examples
from application_manager import models
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail
from application_manager.profilers.base import Observation
from harness.v1 import application_manager_pb2 as pb
from services.errors import FailedPrecondition, Unavailable


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001 - the RPC never ends in these tests
        return True


def test_a_run_that_raises_leaves_a_failed_execution_not_a_running_one(tmp_path, monkeypatch):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))

    def measured(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        t = 10.0 / self.space.configs[proposal.config]["%master_cores"]
        return RunDetail(Observation(proposal.config, True, t, t, proposal.input))

    monkeypatch.setattr(LocalBackend, "run", measured)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=200, steps=20),
            app_dir="/x"), _Ctx())
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx()))

        def broken(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
            raise RuntimeError("the back-end broke")

        monkeypatch.setattr(LocalBackend, "run", broken)
        request = pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, request_id="once")
        with pytest.raises(RuntimeError):
            am.ExecuteApplication(request, _Ctx())
        (e,) = am.ListExecutions(pb.ListExecutionsRequest(tenant="t", application_id=app.id), _Ctx()).executions
        assert e.state == pb.ApplicationExecution.STATE_FAILED and "the back-end broke" in e.error and e.ended_at > 0
        assert am.ExecuteApplication(request, _Ctx()).state == pb.ApplicationExecution.STATE_FAILED   # its retry
    finally:
        am.stop()


def _fpga_only() -> str:
    m = json.loads(examples.manifest("option_pricing"))
    m["Modules"][0]["Implementations"] = [i for i in m["Modules"][0]["Implementations"]
                                          if "FPGA" in i["ImplementationName"]]
    return json.dumps(m)


@pytest.mark.parametrize("offered_after", [{"vm"}, None])      # the FPGA IRM away; the CRS itself away
def test_applications_stay_readable_when_their_resource_types_are_not_offered_after_a_restart(
        tmp_path, monkeypatch, offered_after):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm", "vfpga"})
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    cpu = am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", manifest_json=examples.manifest("rtm"),
                                                           slo_json=examples.slo("rtm"), app_dir="/x"), _Ctx())
    fpga = am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", manifest_json=_fpga_only(),
                                                            slo_json=examples.slo("option_pricing"), app_dir="/x"),
                                _Ctx())
    am.stop()

    def offered(self):  # noqa: ANN001, ANN202
        if offered_after is None:
            raise Unavailable("the CRS at 127.0.0.1:1 did not answer: UNAVAILABLE")
        return offered_after

    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", offered)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        apps = {a.id: a for a in am.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx()).applications}
        assert set(apps) == {cpu.id, fpga.id}
        assert apps[fpga.id].configurations == fpga.configurations
        assert any("not every resource type it needs is offered now" in n for n in apps[fpga.id].notes)
        assert am.ListExecutions(pb.ListExecutionsRequest(tenant="t", application_id=fpga.id), _Ctx()).executions \
            == []
    finally:
        am.stop()


def test_when_every_profiled_run_failed_the_answer_says_so_and_why(tmp_path, monkeypatch):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))

    def out_of_memory(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        return RunDetail(Observation(proposal.config, False, 3.0, 0.01, proposal.input, 40.0, 100.0,
                                     "memory limit exceeded"))

    monkeypatch.setattr(LocalBackend, "run", out_of_memory)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm"), app_dir="/x"), _Ctx())
        request = pb.ExecuteApplicationRequest(tenant="t", application_id=app.id)
        with pytest.raises(FailedPrecondition, match="profile the application first"):
            am.ExecuteApplication(request, _Ctx())                  # nothing ran yet
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx()))
        with pytest.raises(FailedPrecondition) as e:
            am.ExecuteApplication(request, _Ctx())
        assert "all 3 run(s) on 3 configuration(s) failed (3 of them: memory limit exceeded)" in str(e.value)
    finally:
        am.stop()


def test_prices_belong_to_the_search_space_they_were_asked_for(tmp_path, monkeypatch):
    # Asked while the FPGA IRM was away (the application readable over every implementation), prices must not
    # be read later against the smaller space built once the CRS answers: price i is configuration i's.
    offered: dict[str, set[str] | None] = {"now": {"vm", "vfpga"}}

    def offered_types(self):  # noqa: ANN001, ANN202
        if offered["now"] is None:
            raise Unavailable("the CRS at 127.0.0.1:1 did not answer: UNAVAILABLE")
        return offered["now"]

    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", offered_types)
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.arange(len(self.space), dtype=float) + 1.0)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("option_pricing"),
            slo_json=examples.slo("option_pricing", million_options=0.25), app_dir="/x"), _Ctx())
        am._loaded.clear()                          # a restart
        offered["now"] = None                       # the CRS away
        away = am._load("t", app.id)
        am._explore(away)                           # an online execution asks for prices now
        offered["now"] = {"vm"}                     # back, without the FPGA IRM
        back = am._load("t", app.id)
        am._explore(back)
        assert len(away.space) > len(back.space) and len(back.prices) == len(back.space)
    finally:
        am.stop()


def test_an_application_stored_under_older_rules_is_listed_with_why_not_failing_the_list(tmp_path, monkeypatch):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        good = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm"), app_dir="/x"), _Ctx())
        # Accepted once; today's validation refuses a constraint on a text variable.
        old = json.loads(examples.manifest("rtm"))
        old["Modules"][0]["Implementations"][0]["GlobalConstraints"] = ["%arg1 == 1"]
        old["Modules"][0]["Parameters"] = [{"Var": "%arg1", "Name": "a", "Type": "STR", "Values": ["x", "y"]}]
        am.db.transact(lambda s: s.add(models.Application(id="app-old", tenant="t", name="RTM", app_dir="/x",
                                                          manifest=json.dumps(old), slo="{}", created_at=0.0)))
        apps = am.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx()).applications
        assert [a.id for a in apps] == ["app-old", good.id]
        assert apps[0].notes[0].startswith("no longer valid: ") and "%arg1" in apps[0].notes[0]
    finally:
        am.stop()
