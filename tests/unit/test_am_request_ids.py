"""A request id names one request: a retry gets its application or execution, another request is refused."""

from __future__ import annotations

import numpy as np
import pytest

import examples
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend
from harness.v1 import application_manager_pb2 as pb
from services.errors import InvalidArgument


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


@pytest.fixture
def am(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    yield am
    am.stop()


def _submit(am, request_id: str, rows: int = 200, app_dir: str = "/x") -> pb.Application:  # noqa: ANN001
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", request_id=request_id, manifest_json=examples.manifest("rtm"),
        slo_json=examples.slo("rtm", rows=rows, steps=20), app_dir=app_dir), _Ctx())


def test_a_resubmission_under_one_request_id_must_be_the_same_request(am):
    first = _submit(am, "r1")
    assert _submit(am, "r1").id == first.id                       # a retry: its application
    for other in ({"rows": 400}, {"app_dir": "/y"}):                # another input, another directory
        with pytest.raises(InvalidArgument) as e:
            _submit(am, "r1", **other)
        assert [(v.field, v.description) for v in e.value.violations] == [(
            "request_id", "request_id reused with a different request; use a new request_id")]


def test_an_execution_request_id_names_one_application_and_slo(am):
    a, b = _submit(am, "a"), _submit(am, "b", rows=400)
    slo = am._load("t", a.id).slo.describe()
    am.db.transact(lambda s: s.add(m.Execution(
        id="exec-1", application_id=a.id, tenant="t", request_id="x", state="succeeded", config={}, slo=slo,
        predicted_time_s=1.0, predicted_cost=1.0, started_at=0.0)))
    assert am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=a.id, request_id="x"),
                                 _Ctx()).id == "exec-1"
    with pytest.raises(InvalidArgument, match="request_id reused"):
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=b.id, request_id="x"), _Ctx())
    with pytest.raises(InvalidArgument, match="request_id reused"):
        am.ExecuteApplication(pb.ExecuteApplicationRequest(
            tenant="t", application_id=a.id, request_id="x",
            slo_json='{"Objective": {"Constraints": ["%execution_time <= 1"]}}'), _Ctx())
