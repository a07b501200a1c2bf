"""The CRS killed and started again while the Application Manager runs applications: a run that ends while the CRS
is down has its reservation released once the CRS is back (the AM restarting in between), and a profiling session
waits the outage out and makes its runs instead of ending at once with the runs refused.

CRS, compute IRM and agent are separate processes (the CRS started again on its address and database); the AM runs
in-process, so that it can be stopped and started again between the steps.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from application_manager import service as svc
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import Suite, eventually, start_again
from tests.integration.test_am_cancellation import ENDS_WITHIN_S, _no_reservation_left


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001 - these calls are never cancelled
        return True


def _submit(am: svc.ApplicationManager, tenant: str, app_dir: Path, command: str, cores: list[int]) -> pb.Application:
    manifest = {"Name": "Waiter", "Modules": [{"ModuleName": "Main", "Parameters": [], "Implementations": [{
        "ImplementationName": "cpu", "Resources": {"Groups": [{
            "GroupID": "master", "Role": "MASTER", "Type": "Machine", "NumInstances": {"Value": 1},
            "Attributes": {"Memory": {"Value": 256}, "Cores": {"Var": "%cores", "Values": cores}}}]},
        "Command": ["/bin/sh", "-c", command], "ExecutionArgs": ""}]}]}
    app = am.SubmitApplication(pb.SubmitApplicationRequest(tenant=tenant, manifest_json=json.dumps(manifest),
                                                           app_dir=str(app_dir)), _Ctx())
    assert app.configurations == len(cores), list(app.notes)
    return app


def _am(tmp_path: Path, crs_address: str) -> svc.ApplicationManager:
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path / "am"), crs_address=crs_address,
                                                       heartbeat_s=0.2, transient_backoff_s=0.2,
                                                       transient_backoff_max_s=1.0))


def _restart(suite: Suite, crs_address: str) -> None:
    """The CRS again, on its address and database; back once the compute IRM's hosts are in it again."""
    start_again(lambda: suite.start("crs", address=crs_address, heartbeat_interval_s=0.3), "the CRS")
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs_address))
    eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest(), timeout=5).resources,
               timeout=ENDS_WITHIN_S, what="the compute IRM's hosts in the CRS again")


def test_a_run_that_ends_while_the_crs_is_down_is_released_once_it_is_back(suite, tmp_path):
    crs_proc, crs = suite.compute_cloud()
    compute = irm_pb2_grpc.ResourceManagerStub(plain_channel(suite.procs[1].address))
    tenant = "crs-down"
    am = _am(tmp_path, crs_proc.address)
    result: dict = {}
    try:
        app = _submit(am, tenant, tmp_path, "echo $$ > %app_dir/pid; while [ ! -e %app_dir/go ]; do sleep 0.05; done",
                      [1])
        th = threading.Thread(target=lambda: result.setdefault("e", am.ExecuteApplication(
            pb.ExecuteApplicationRequest(tenant=tenant, application_id=app.id, online=True), _Ctx())))
        th.start()
        eventually(lambda: (tmp_path / "pid").exists(), timeout=ENDS_WITHIN_S, what="the application running")
        (held,) = crs.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant), timeout=10).reservations
        crs_proc.kill()
        (tmp_path / "go").touch()           # the application ends while the CRS is down
        th.join(ENDS_WITHIN_S)
        ex = result["e"]
        assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED and ex.reservation_id == held.id, ex
    finally:
        am.stop()
    again = _am(tmp_path, crs_proc.address)     # its start-up sweep finds the CRS still down
    try:
        _restart(suite, crs_proc.address)
        _no_reservation_left(crs, tenant)        # released by the sweeper, not by hand
        released = [r for r in crs.ListReservations(irm_pb2.ListReservationsRequest(
            tenant=tenant, include_released=True), timeout=10).reservations if r.id == held.id]
        assert [r.state for r in released] == [irm_pb2.Reservation.STATE_RELEASED]
        # And at the compute IRM: the VM given back, nothing leaked there.
        eventually(lambda: not compute.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant),
                                                        timeout=10).reservations,
                   timeout=ENDS_WITHIN_S, what="the compute IRM's reservation released")
    finally:
        again.stop()


def test_a_profiling_session_waits_out_a_crs_restart_and_makes_its_runs(suite, tmp_path):
    crs_proc, crs = suite.compute_cloud()
    tenant = "crs-restart"
    am = _am(tmp_path, crs_proc.address)
    try:
        app = _submit(am, tenant, tmp_path, "exit 0", [1, 2])
        crs_proc.kill()
        stream = am.StartProfiling(pb.StartProfilingRequest(tenant=tenant, application_id=app.id,
                                                            profiler="uniform", max_runs=2), _Ctx())
        next(stream)

        def refused() -> list[pb.ProfileRun]:
            runs = am.GetModel(pb.GetModelRequest(tenant=tenant, application_id=app.id), _Ctx()).runs
            return [r for r in runs if "could not reserve: UNAVAILABLE" in r.error]
        eventually(lambda: len(refused()) >= 2, timeout=ENDS_WITHIN_S, what="runs refused while the CRS is down")
        _restart(suite, crs_proc.address)
        final = list(stream)[-1].session
        assert final.state == pb.ProfilingSession.STATE_DONE and final.message == "iterations", final
        runs = am.GetModel(pb.GetModelRequest(tenant=tenant, application_id=app.id), _Ctx()).runs
        assert sum(r.ok for r in runs) == 2, [r.error for r in runs]
        _no_reservation_left(crs, tenant)
    finally:
        am.stop()
