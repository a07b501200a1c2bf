"""Tenant authentication across the suite's processes: a CRS, a compute IRM, its agent and an application manager,
all given one tenants file. Tenants' calls carry their tokens; the services acting for tenants (the CRS at the
compute IRM, the AM at the CRS and the agent) carry the delegation token, and the chain works end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from services import control, tenants
from services.tenants import tenant_channel
from services.tls import plain_channel
from tests.conftest import Suite, eventually

CONTROL = "suite-control-token"
DELEGATION = "suite-delegation-token"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("tenant-auth")
    path = str(tmp / "tenants.yaml")
    tokens = {name: tenants.add(path, name) for name in ("alice", "bob")}
    suite = Suite(str(tmp))
    # The CRS and the AM hold the delegation token; the compute IRM and the agent only its digest.
    checks = dict(control_token=CONTROL, tenants_file=path, delegation_sha256=tenants.digest(DELEGATION))
    try:
        crs = suite.start("crs", heartbeat_interval_s=0.3, control_token=CONTROL, tenants_file=path,
                          delegation_token=DELEGATION)
        # The agent on a port chosen for it before the compute IRM starts (each is told the other's address).
        suite.compute_and_agent(compute=dict(crs_address=crs.address, heartbeat_interval_s=0.3, **checks),
                                agent=checks)
        am = suite.start("am", crs_address=crs.address, tenants_file=path, delegation_token=DELEGATION)
        anyone = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: anyone.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
                   what="the compute IRM's hosts in the CRS")
        yield {"path": path, "tokens": tokens, "crs": crs.address, "am": am.address, "tmp": tmp}
    finally:
        suite.stop_all()


def _crs(cloud, token: str) -> irm_pb2_grpc.ResourceManagerStub:  # type: ignore[no-untyped-def]
    return irm_pb2_grpc.ResourceManagerStub(tenant_channel(cloud["crs"], token))


def _reserve(cloud, tenant: str, token: str, request_id: str) -> irm_pb2.Reservation:  # type: ignore[no-untyped-def]
    group = irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, attributes={
        "cores": common_pb2.AttributeRequest(number=1), "memory_gb": common_pb2.AttributeRequest(number=0.25)})
    return _crs(cloud, token).Reserve(irm_pb2.ReserveRequest(tenant=tenant, request_id=request_id, groups=[group]),
                                      timeout=60)


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code()


def _harness(*argv: str, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != tenants.ENV_TOKEN}
    if token is not None:
        env[tenants.ENV_TOKEN] = token
    return subprocess.run([sys.executable, "-m", "services.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_tenant_reserves_and_runs_with_its_token_and_nobody_else_can(cloud) -> None:
    alice, bob = cloud["tokens"]["alice"], cloud["tokens"]["bob"]
    # The CRS takes alice's call with her token, and the compute IRM the CRS's call for her with the delegation token.
    res = _reserve(cloud, "alice", alice, "auth-1")
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE
    get = irm_pb2.GetReservationRequest(tenant="alice", reservation_id=res.id)
    assert _code(lambda: _crs(cloud, "").GetReservation(get, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: _crs(cloud, bob).GetReservation(get, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: _crs(cloud, "forged").ReleaseReservation(irm_pb2.ReleaseReservationRequest(
        tenant="alice", reservation_id=res.id), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    assert _crs(cloud, alice).GetReservation(get, timeout=10).state == irm_pb2.Reservation.STATE_ACTIVE

    # harness run: the CLI sends HARNESS_TENANT_TOKEN to the CRS and to the agent.
    run = ["run", res.id, "--crs", cloud["crs"], "--tenant", "alice", "--", "/bin/echo", "ran as alice"]
    done = _harness(*run, token=alice)
    assert done.returncode == 0, done.stderr
    assert "ran as alice" in done.stdout
    # Her VM's utilisation: the CRS asks the compute IRM with the delegation token, the IRM the agent with what
    # the CRS sent (it holds nothing that acts for tenants itself).
    metrics = _crs(cloud, alice).GetMetrics(irm_pb2.GetMetricsRequest(tenant="alice", reservation_id=res.id),
                                            timeout=30)
    assert {s.name for s in metrics.series} >= {"cpu_percent", "memory_percent"}, metrics
    refused = _harness(*run, token=None)
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr and tenants.ENV_TOKEN in refused.stderr
    _crs(cloud, alice).ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="alice", reservation_id=res.id),
                                          timeout=30)


def test_the_application_manager_acts_for_its_tenant_with_the_delegation_token(cloud) -> None:
    alice = cloud["tokens"]["alice"]
    am = pb_grpc.ApplicationManagerStub(tenant_channel(cloud["am"], alice))
    manifest = {"Name": "Touch", "Modules": [{"ModuleName": "Main", "Parameters": [], "Implementations": [{
        "ImplementationName": "cpu", "Resources": {"Groups": [{
            "GroupID": "master", "Role": "MASTER", "Type": "Machine", "NumInstances": {"Value": 1},
            "Attributes": {"Memory": {"Value": 256}, "Cores": {"Value": 1}}}]},
        "Command": ["/bin/sh", "-c", "echo executed $HARNESS_TENANT_TOKEN > %app_dir/out"], "ExecutionArgs": ""}]}]}
    app_dir = cloud["tmp"] / "touch"
    app_dir.mkdir()
    submit = pb.SubmitApplicationRequest(tenant="alice", manifest_json=json.dumps(manifest), app_dir=str(app_dir))
    assert _code(lambda: pb_grpc.ApplicationManagerStub(tenant_channel(cloud["am"], "")).SubmitApplication(
        submit, timeout=30)) == grpc.StatusCode.UNAUTHENTICATED
    app = am.SubmitApplication(submit, timeout=30)
    # The AM reserves at the CRS and runs at the agent for alice, neither of which has her token from it.
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="alice", application_id=app.id, online=True),
                               timeout=120)
    assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED, ex
    # The application acts as its tenant where the AM is not in between (e.g. VirtualFpga.attach): it has her token.
    assert (app_dir / "out").read_text().strip() == f"executed {alice}"
    (app_dir / "out").unlink()
    manifest["Name"] = "Touch again"          # a fresh application: the first has its one configuration measured
    fresh = am.SubmitApplication(pb.SubmitApplicationRequest(tenant="alice", manifest_json=json.dumps(manifest),
                                                             app_dir=str(app_dir)), timeout=30)
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="alice", application_id=fresh.id, max_runs=1),
                                    timeout=120))
    assert events[-1].session.runs == 1, events[-1]
    assert (app_dir / "out").read_text().strip() == f"executed {alice}"          # a profiling run has it too
    assert _code(lambda: pb_grpc.ApplicationManagerStub(tenant_channel(cloud["am"], cloud["tokens"]["bob"])
                                                       ).GetApplication(pb.GetApplicationRequest(
                                                           tenant="alice", application_id=app.id), timeout=10)
                 ) == grpc.StatusCode.PERMISSION_DENIED


def test_harness_tenant_remove_takes_effect_on_running_services(cloud) -> None:
    carol = _harness("tenant", "--file", cloud["path"], "add", "carol", token=None)
    assert carol.returncode == 0, carol.stderr
    token = carol.stdout.strip()
    listed = irm_pb2.ListReservationsRequest(tenant="carol")

    def answer() -> grpc.StatusCode:
        try:
            _crs(cloud, token).ListReservations(listed, timeout=10)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    eventually(lambda: answer() == grpc.StatusCode.OK, timeout=10, what="carol let in once the file changed")
    assert _harness("tenant", "--file", cloud["path"], "list", token=None).stdout.split() == ["alice", "bob", "carol"]
    gone = _harness("tenant", "--file", cloud["path"], "remove", "carol", token=None)
    assert gone.returncode == 0, gone.stderr
    eventually(lambda: answer() == grpc.StatusCode.UNAUTHENTICATED, timeout=10,
               what="carol's token refused once the file changed")
    assert _harness("tenant", "--file", cloud["path"], "remove", "carol", token=None).returncode == 1


def test_a_service_that_could_not_check_delegated_calls_or_would_delegate_unchecked_does_not_start(cloud) -> None:
    done = _harness("serve", "agent", "--address", "127.0.0.1:0", "--set", f"tenants_file={cloud['path']}",
                    "--set", f"work_dir={cloud['tmp']}/lonely", token=None)
    assert done.returncode == 2
    assert "tenants_file needs delegation_sha256 too" in done.stderr
    done = _harness("serve", "am", "--address", "127.0.0.1:0", "--set", f"delegation_token={DELEGATION}",
                    "--set", f"state_dir={cloud['tmp']}/lonely", token=None)
    assert done.returncode == 2
    assert "delegation_token without tenants_file would act for any tenant" in done.stderr


def test_tenant_code_on_the_agent_cannot_act_for_other_tenants_with_what_the_agent_holds(cloud) -> None:
    """The agent runs tenants' programs as its own user: they can read its environment and command line. What it
    holds -- the control token, the delegation token's digest -- must act for no tenant."""
    alice, bob = cloud["tokens"]["alice"], cloud["tokens"]["bob"]
    res = _reserve(cloud, "alice", alice, "auth-leak")
    mine = _reserve(cloud, "bob", bob, "auth-leak-bob")
    (vm,) = [r for g in mine.groups for r in g.resources]
    # Bob's program reads the environment and command line of its ancestors: the agent (in a deployment where the
    # agent runs apart from the CRS and the AM, e.g. compose's containers, that is all it can reach).
    read = ("p=$$; while [ \"$p\" -gt 1 ]; do cat /proc/$p/environ /proc/$p/cmdline 2>/dev/null | tr '\\0' '\\n'; "
            "p=$(awk '/^PPid/{print $2}' /proc/$p/status); done")
    done = _harness("run", mine.id, "--crs", cloud["crs"], "--tenant", "bob", "--", "/bin/sh", "-c", read, token=bob)
    assert done.returncode == 0, done.stderr
    found = {line.split("=", 1)[1] for line in done.stdout.splitlines() if "=" in line} - {""}
    assert CONTROL in found and tenants.digest(DELEGATION) in found      # what bob's program could read
    assert DELEGATION not in found
    release = irm_pb2.ReleaseReservationRequest(tenant="alice", reservation_id=res.id)
    crs = plain_channel(cloud["crs"])
    for stolen in found:
        for channel in (tenants.delegating(crs, stolen), control.channel(crs, stolen)):
            assert _code(lambda c=channel: irm_pb2_grpc.ResourceManagerStub(c).ReleaseReservation(
                release, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    assert vm.address and _crs(cloud, alice).GetReservation(irm_pb2.GetReservationRequest(
        tenant="alice", reservation_id=res.id), timeout=10).state == irm_pb2.Reservation.STATE_ACTIVE


def test_fpga_groups_clients_and_jobs_take_the_tenants_token(tmp_path) -> None:
    from harness.v1 import fpga_jobs_pb2 as jp
    from harness.v1 import fpga_jobs_pb2_grpc, fpga_pb2, fpga_pb2_grpc
    from irm_fpga.client import VirtualFpga

    path = str(tmp_path / "tenants.yaml")
    alice, bob = tenants.add(path, "alice"), tenants.add(path, "bob")
    suite = Suite(str(tmp_path))
    try:
        server = suite.start("fpga-server", name="fpga-0", devices=2, reconfig_mean_s=0.0, reconfig_std_s=0.0,
                             control_token=CONTROL)
        orch = suite.start("fpga", servers=server.address, autoscaler="none", control_token=CONTROL,
                           tenants_file=path, delegation_sha256=tenants.digest(DELEGATION))

        def stub(token: str) -> fpga_pb2_grpc.FpgaOrchestratorStub:
            return fpga_pb2_grpc.FpgaOrchestratorStub(tenant_channel(orch.address, token))

        create = fpga_pb2.CreateGroupRequest(tenant="alice", request_id="g-1", design="sleep", size=1)
        assert _code(lambda: stub("").CreateGroup(create, timeout=30)) == grpc.StatusCode.UNAUTHENTICATED
        group = stub(alice).CreateGroup(create, timeout=30)
        assert _code(lambda: stub(bob).DeleteGroup(fpga_pb2.DeleteGroupRequest(
            tenant="alice", group_id=group.id), timeout=30)) == grpc.StatusCode.PERMISSION_DENIED
        # The client library attaches with the token it is given (or HARNESS_TENANT_TOKEN) and runs on the group.
        with pytest.raises(grpc.RpcError) as e:
            VirtualFpga.attach(orch.address, "alice", group.id, token="")
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        fpga = VirtualFpga.attach(orch.address, "alice", group.id, token=alice)
        try:
            assert fpga.submit({"duration": 0.001}).result(30).server == "fpga-0"
        finally:
            fpga.close()

        jobs = fpga_jobs_pb2_grpc.FpgaJobsStub(tenant_channel(orch.address, bob))
        register = jp.RegisterJobRequest(tenant="bob", request_id="j-1", design="sleep",
                                         deadline=jp.DeadlineGoal(deadline_s=3600.0, size_actions=10))
        assert _code(lambda: fpga_jobs_pb2_grpc.FpgaJobsStub(tenant_channel(orch.address, alice)).RegisterJob(
            register, timeout=30)) == grpc.StatusCode.PERMISSION_DENIED
        assert jobs.RegisterJob(register, timeout=30).tenant == "bob"
        listed = _harness("jobs", "list", "--fpga", orch.address, "--tenant", "bob", token=bob)
        assert listed.returncode == 0 and "j-1" in listed.stdout, listed.stderr
    finally:
        suite.stop_all()
