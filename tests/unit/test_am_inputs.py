"""Run timeouts must be finite and bounded; ExecutionArgs is split into words before values are substituted; an
application stored under looser checks is named, not served or failing other listings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import sqlalchemy as sa

import examples
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend
from application_manager.manifest import parse_manifest
from application_manager.space import from_manifest
from harness.v1 import application_manager_pb2 as pb
from services.errors import InvalidArgument
from tests.unit.test_am_stop import _submit


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


MAN = {"Name": "A", "Modules": [{"ModuleName": "Main", "Parameters": [
    {"Var": "%name", "Name": "name", "Type": "STR", "Values": ["x"], "Default": "x"}], "Implementations": [{
    "ImplementationName": "cpu", "Resources": {"Groups": [{"GroupID": "master", "Role": "MASTER", "Type": "Machine",
    "NumInstances": {"Value": 1}, "Attributes": {"Memory": {"Value": 256}, "Cores": {"Value": 1}}}]},
    "Command": ["%python", "%app_dir/app.py"], "ExecutionArgs": "--input %app_dir/data.txt --name '%name'"}]}]}


def _am(tmp_path, monkeypatch) -> svc.ApplicationManager:  # noqa: ANN001
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))


@pytest.mark.parametrize("value", [math.inf, 1e300, math.nan, 7 * 24 * 3600.0 + 1, -1.0])
def test_an_unbounded_run_timeout_is_refused_naming_the_field(tmp_path, monkeypatch, value):
    am = _am(tmp_path, monkeypatch)
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=200, steps=20),
            app_dir="/x"), _Ctx())
        with pytest.raises(InvalidArgument) as e:
            next(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id,
                                                            run_timeout_s=value), _Ctx()))
        assert [v.field for v in e.value.violations] == ["run_timeout_s"]
        with pytest.raises(InvalidArgument) as e:
            am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, timeout_s=value),
                                  _Ctx())
        assert [v.field for v in e.value.violations] == ["timeout_s"]
    finally:
        am.stop()


def test_the_service_refuses_an_unbounded_default_run_timeout(tmp_path):
    with pytest.raises(ValueError, match="run_timeout_s"):
        svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), run_timeout_s=math.inf))


@pytest.mark.parametrize("app_dir", ["/home/u/My Apps/a", "/home/u/Bob's apps/a", '/x/"q" $HOME'])
def test_substituted_values_are_single_arguments(app_dir):
    m = parse_manifest(json.dumps(MAN), "manifest_json")
    space = from_manifest(m, {"%name": "two words"}, {"vm"})
    b = LocalBackend("127.0.0.1:1", "t", m, space, {"%name": "it's"}, app_dir, "python3", 10)
    argv, _ = b.argv_env(space.configs[0], "production")
    assert argv == ["python3", f"{app_dir}/app.py", "--input", f"{app_dir}/data.txt", "--name", "it's"]


def test_execution_args_that_cannot_be_split_are_refused_at_submit(tmp_path, monkeypatch):
    bad = json.loads(json.dumps(MAN))
    bad["Modules"][0]["Implementations"][0]["ExecutionArgs"] = "--name 'unclosed"
    am = _am(tmp_path, monkeypatch)
    try:
        with pytest.raises(InvalidArgument) as e:
            am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", manifest_json=json.dumps(bad),
                                                             app_dir="/x"), _Ctx())
        (v,) = e.value.violations
        assert v.field == "manifest_json.Modules[0].Implementations[0].ExecutionArgs" and "quot" in v.description
    finally:
        am.stop()


def test_an_application_a_newer_version_no_longer_accepts_is_named_and_leaves_other_listings_alone(tmp_path,
                                                                                                    monkeypatch):
    am = _am(tmp_path, monkeypatch)
    try:
        good, stale = _submit(am), _submit(am)
        for app in (good, stale):
            am.db.transact(lambda s, a=app: s.add(m.Execution(
                id=f"exec-{a.id[-12:]}", application_id=a.id, tenant="t", request_id=None, state="succeeded",
                config={"implementation": "cpu", "%cores": 2}, slo="", predicted_time_s=1.0, predicted_cost=1.0,
                started_at=1.0)))
        # As if stored before a check that now refuses it (an unclosed quote in ExecutionArgs).
        am.db.transact(lambda s: s.execute(sa.update(m.Application).where(m.Application.id == stale.id)
                                           .values(manifest='{"Name": "x", "Modules": "not a list"}')))
        am._loaded.clear()
        listed = am.ListExecutions(pb.ListExecutionsRequest(tenant="t"), _Ctx()).executions
        assert sorted(e.application_id for e in listed) == sorted([good.id, stale.id])
        assert {e.configuration.values["%cores"] for e in listed} == {"2"}
        try:
            am.GetModel(pb.GetModelRequest(tenant="t", application_id=stale.id), _Ctx())
            raise AssertionError("a stored manifest that no longer parses was served")
        except svc.FailedPrecondition as e:
            assert stale.id in str(e) and "submit it again" in str(e)
    finally:
        am.stop()
