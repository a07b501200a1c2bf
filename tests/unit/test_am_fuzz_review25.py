"""Review 25 (a tenant fuzzing the AM's API from the protos): three inputs that were taken and failed later.

* NumInstances above the CRS's 1000 per group was accepted; every run was then refused by the CRS, and 2^31 or
  more made profiling fail with a Python `ValueError: Value out of range` (an int32 on the wire).
* A key written at the wrong level of a manifest (GlobalConstraints at the top or in a module, Groups beside
  Resources) was ignored silently, as a misspelt one was before `misspelt_keys`.
* A bug's exception text reached the tenant as the session's message; now the kind of error and where the log has it.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import examples
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend
from application_manager.manifest import MAX_INSTANCES, parse_manifest
from cross_resource_scheduler.parsing import MAX_COUNT
from harness.v1 import application_manager_pb2 as pb
from services.errors import InvalidArgument
from tests.unit.test_am_bad_input import GROUP0, IMPL, TEMPLATE


def _violations(manifest: dict) -> dict[str, str]:
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(json.dumps(manifest))
    return {v.field: v.description for v in e.value.violations}


def test_the_am_bounds_num_instances_as_the_crs_does():
    assert MAX_INSTANCES == MAX_COUNT
    for n in (2 ** 63 - 1, 2 ** 31, MAX_INSTANCES + 1):
        doc = copy.deepcopy(TEMPLATE)
        doc["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["NumInstances"] = {"Value": n}
        assert _violations(doc) == {
            f"{GROUP0}.NumInstances": f"at most {MAX_INSTANCES} instances per group (the CRS's limit), got {n}"}
    doc = copy.deepcopy(TEMPLATE)
    doc["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["NumInstances"] = {
        "Var": "%n", "Values": [1, MAX_INSTANCES]}
    assert parse_manifest(json.dumps(doc)).modules[0].implementations[0].groups[0].instances.values == \
        (1, MAX_INSTANCES)


@pytest.mark.parametrize("where,key,field,belongs", [
    ("top", "GlobalConstraints", "manifest.GlobalConstraints",
     "manifest.Modules[i].Implementations[j].GlobalConstraints"),
    ("top", "Parameters", "manifest.Parameters", "manifest.Modules[i].Parameters"),
    ("top", "groups", "manifest.groups", "manifest.Modules[i].Implementations[j].Resources.Groups"),
    ("module", "GlobalConstraints", "manifest.Modules[0].GlobalConstraints",
     "manifest.Modules[0].Implementations[j].GlobalConstraints"),
    ("module", "Command", "manifest.Modules[0].Command", "manifest.Modules[0].Implementations[j].Command"),
    ("implementation", "Groups", f"{IMPL}.Groups", f"{IMPL}.Resources.Groups"),
    ("implementation", "Parameters", f"{IMPL}.Parameters", "manifest.Modules[0].Parameters"),
])
def test_a_key_at_the_wrong_level_is_refused_naming_where_it_belongs(where, key, field, belongs):
    doc = copy.deepcopy(TEMPLATE)
    target = {"top": doc, "module": doc["Modules"][0], "implementation": doc["Modules"][0]["Implementations"][0]}
    target[where][key] = ["%arg1 > 10"]
    assert _violations(doc) == {field: f"belongs in {belongs}; here it would be ignored"}


def test_keys_foreign_to_every_level_and_the_examples_are_still_accepted():
    doc = copy.deepcopy(TEMPLATE)
    doc["Comment"] = "annotations Harness has no use for are left alone"
    doc["Modules"][0]["Description"] = "as are these"
    parse_manifest(json.dumps(doc))
    for name in examples.NAMES:
        parse_manifest(examples.manifest(name))


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


def test_a_bug_during_profiling_fails_the_session_without_its_exception_text(tmp_path, monkeypatch):
    def run(self, proposal, **kw):  # noqa: ANN001, ANN202
        raise ValueError("Value out of range: 9223372036854775807")

    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    monkeypatch.setattr(LocalBackend, "run", run)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=200, steps=20),
            app_dir="/x"), _Ctx())
        last = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id,
                                                                profiler="uniform", max_runs=1), _Ctx()))[-1]
        s = last.session
        assert s.state == pb.ProfilingSession.STATE_FAILED
        assert s.message == (f"an internal error of the application manager (ValueError); its log has the details "
                             f"under session {s.id}")
        with am.db.read() as db:
            assert db.get(m.Session, s.id).message == s.message
    finally:
        am.stop()
