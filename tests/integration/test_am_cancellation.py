"""An execution whose client is gone (its deadline passed, or it cancelled) stops: the application's process is
killed through its agent, the reservation is released and the execution ends FAILED saying why, instead of
running to the end, recorded SUCCEEDED, while nobody waits for it.

CRS, compute IRM, agent and Application Manager are separate processes; the application is a real command
that runs far longer than any client waits, so only a stopped run ends within the tests' bounds.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import psutil
import pytest

from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import Suite, eventually

RUN_S = 600            # how long the application would run if nobody stopped it
ENDS_WITHIN_S = 60     # a stopped run has ended well before that
CANCELLED = "the client cancelled or its deadline passed"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    suite = Suite(str(tmp_path_factory.mktemp("am-cancel")))
    try:
        crs, c = suite.compute_cloud()
        am = suite.start("am", crs_address=crs.address)
        yield {"crs": c, "am": pb_grpc.ApplicationManagerStub(plain_channel(am.address))}
    finally:
        suite.stop_all()


def _sleeper(am: pb_grpc.ApplicationManagerStub, tenant: str, app_dir: Path) -> pb.Application:
    """One configuration; the command leaves its pid in app_dir/pid, then sleeps RUN_S seconds."""
    manifest = {"Name": "Sleeper", "Modules": [{"ModuleName": "Main", "Parameters": [], "Implementations": [{
        "ImplementationName": "cpu", "Resources": {"Groups": [{
            "GroupID": "master", "Role": "MASTER", "Type": "Machine", "NumInstances": {"Value": 1},
            "Attributes": {"Memory": {"Value": 256}, "Cores": {"Value": 1}}}]},
        "Command": ["/bin/sh", "-c", f"echo $$ > %app_dir/pid; exec sleep {RUN_S}"], "ExecutionArgs": ""}]}]}
    app = am.SubmitApplication(pb.SubmitApplicationRequest(tenant=tenant, manifest_json=json.dumps(manifest),
                                                           app_dir=str(app_dir)), timeout=30)
    assert app.configurations == 1, list(app.notes)
    return app


def _ended(am: pb_grpc.ApplicationManagerStub, tenant: str, application_id: str) -> pb.ApplicationExecution:
    """The application's one execution, once it is no longer running."""
    def check() -> pb.ApplicationExecution | None:
        listed = am.ListExecutions(pb.ListExecutionsRequest(tenant=tenant, application_id=application_id),
                                   timeout=10).executions
        assert len(listed) <= 1, listed
        return listed[0] if listed and listed[0].state != pb.ApplicationExecution.STATE_RUNNING else None
    return eventually(check, timeout=ENDS_WITHIN_S, interval=0.2, what="the execution to end")


def _no_reservation_left(crs: irm_pb2_grpc.ResourceManagerStub, tenant: str) -> None:
    eventually(lambda: not crs.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant),
                                                timeout=10).reservations, what="no active reservation")


def test_an_execution_whose_client_deadline_passes_is_stopped_and_recorded_failed(cloud, tmp_path):
    am, tenant = cloud["am"], "deadline"
    app = _sleeper(am, tenant, tmp_path)
    with pytest.raises(grpc.RpcError) as e:
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=tenant, application_id=app.id, online=True,
                                                           request_id="dl-1"), timeout=3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    ended = _ended(am, tenant, app.id)
    assert ended.state == pb.ApplicationExecution.STATE_FAILED and CANCELLED in ended.error, ended
    assert ended.ended_at > 0 and ended.measured_time_s < ENDS_WITHIN_S and not ended.slo_met
    _no_reservation_left(cloud["crs"], tenant)
    # Cut short by the client, it is no measurement of the configuration: the model has no run of it.
    assert not am.GetModel(pb.GetModelRequest(tenant=tenant, application_id=app.id), timeout=10).runs
    # A retry with its request id answers with that execution; it does not run the application again.
    again = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=tenant, application_id=app.id, online=True,
                                                               request_id="dl-1"), timeout=10)
    assert again.id == ended.id and again.state == pb.ApplicationExecution.STATE_FAILED


def test_a_cancelled_execution_kills_the_running_program_and_releases_its_reservation(cloud, tmp_path):
    am, crs, tenant = cloud["am"], cloud["crs"], "cancel"
    app = _sleeper(am, tenant, tmp_path)
    call = am.ExecuteApplication.future(pb.ExecuteApplicationRequest(tenant=tenant, application_id=app.id,
                                                                     online=True), timeout=RUN_S)
    pid_file = tmp_path / "pid"
    pid = int(eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=ENDS_WITHIN_S,
                         what="the application to be running"))
    assert psutil.pid_exists(pid)
    (held,) = crs.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant), timeout=10).reservations
    assert call.cancel()

    ended = _ended(am, tenant, app.id)
    assert ended.state == pb.ApplicationExecution.STATE_FAILED and CANCELLED in ended.error, ended
    assert ended.reservation_id == held.id and ended.measured_cost > 0   # the reservation was held: it cost
    eventually(lambda: not psutil.pid_exists(pid), what=f"the application's process {pid} to be gone")
    _no_reservation_left(crs, tenant)
    (released,) = [r for r in crs.ListReservations(irm_pb2.ListReservationsRequest(
        tenant=tenant, include_released=True), timeout=10).reservations if r.id == held.id]
    assert released.state == irm_pb2.Reservation.STATE_RELEASED
