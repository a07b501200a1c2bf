"""The Node.js tenant client (examples/clients/node/tenant.js) against real services: a CRS, a compute IRM and its
agent as processes, with a tenants file. It reserves a VM, runs a command through the agent, reads the reason of a
refusal from the google.rpc details, and releases -- the API used from a language other than Python."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2

from harness.v1 import agent_pb2, agent_pb2_grpc, irm_pb2, irm_pb2_grpc
from services import tenants
from services.tenants import tenant_channel
from services.tls import plain_channel
from tests.conftest import Suite, eventually

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "examples" / "clients" / "node"
CONTROL = "node-suite-control-token"
DELEGATION = "node-suite-delegation-token"


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail(f"the Node client's dependencies are missing ({'node_modules' if node else 'node'}): run "
                    "scripts/node-client-deps")
    return node


@pytest.fixture
def cloud(suite: Suite, tmp_path: Path) -> dict:
    path = str(tmp_path / "tenants.yaml")
    token = tenants.add(path, "nodetenant")
    checks = dict(control_token=CONTROL, tenants_file=path, delegation_sha256=tenants.digest(DELEGATION))
    crs = suite.start("crs", heartbeat_interval_s=0.3, control_token=CONTROL, tenants_file=path,
                      delegation_token=DELEGATION)
    suite.compute_and_agent(compute=dict(crs_address=crs.address, heartbeat_interval_s=0.3, **checks), agent=checks)
    anyone = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: anyone.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
               what="the compute IRM's hosts in the CRS")
    return {"crs": crs.address, "token": token}


def _command(cloud: dict, *extra: str) -> list[str]:
    return [_node(), str(CLIENT / "tenant.js"), "--crs", cloud["crs"], "--tenant", "nodetenant", *extra]


def _env(token: str | None) -> dict[str, str]:
    """The environment tenant.js runs in: the tenant's token (HARNESS_TENANT_TOKEN, as the harness CLI takes it)."""
    env = {k: v for k, v in os.environ.items() if k not in (tenants.ENV_TOKEN, "HARNESS_TLS_CA_FILE")}
    if token is not None:
        env[tenants.ENV_TOKEN] = token
    return env


def _run_node(cloud: dict, *extra: str, token: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(_command(cloud, *extra), cwd=ROOT, env=_env(token), capture_output=True, text=True,
                          timeout=180)


def _python_refusal(crs: irm_pb2_grpc.ResourceManagerStub, group_json: str) -> tuple[str, str]:
    """What the Python client sees for the group tenant.js asked for in its step (c) (printed as JSON, the .proto's
    field names): the status code and the ErrorInfo reason."""
    group = json_format.Parse(group_json, irm_pb2.ResourceGroup())
    with pytest.raises(grpc.RpcError) as e:
        crs.Reserve(irm_pb2.ReserveRequest(tenant="nodetenant", request_id="py-impossible", groups=[group]),
                    timeout=60)
    raw = dict(e.value.trailing_metadata() or ()).get("grpc-status-details-bin")
    reasons = []
    for d in status_pb2.Status.FromString(raw).details if raw else ():
        info = error_details_pb2.ErrorInfo()
        if d.Unpack(info):
            reasons.append(info.reason)
    return e.value.code().name, reasons[0] if reasons else "-"


def test_the_node_client_reserves_runs_reads_a_refusal_and_releases(cloud: dict) -> None:
    done = _run_node(cloud, "--", "sh", "-c", "echo hello from node; echo to stderr >&2", token=cloud["token"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()

    reserved = [m for m in map(re.compile(r"^reserved (\S+) (\S+) (\S+)$").match, lines) if m]
    assert len(reserved) == 1, done.stdout
    rid, state = reserved[0].group(1), reserved[0].group(2)
    assert state == "STATE_ACTIVE"
    vm = [m for m in map(re.compile(r"^vm (\S+) host (\S+) agent (\S+)$").match, lines) if m]
    assert len(vm) == 1, done.stdout
    assert "stdout: hello from node" in lines and "stderr: to stderr" in lines, done.stdout
    assert [x for x in lines if x.startswith("exit ")] == ["exit 0 -"], done.stdout

    # The same impossible request from Python: tenant.js must report what the Python client sees.
    crs = irm_pb2_grpc.ResourceManagerStub(tenant_channel(cloud["crs"], cloud["token"]))
    asked = [x.removeprefix("impossible ") for x in lines if x.startswith("impossible ")]
    assert len(asked) == 1, done.stdout
    code, reason = _python_refusal(crs, asked[0])
    assert (code, reason) == ("FAILED_PRECONDITION", "NEVER_FITS")
    assert f"refused {code} {reason}" in lines, done.stdout

    assert lines[-1] == f"released {rid} STATE_RELEASED", done.stdout
    # The CRS agrees: the reservation is released, and the tenant holds nothing any more.
    got = crs.GetReservation(irm_pb2.GetReservationRequest(tenant="nodetenant", reservation_id=rid), timeout=10)
    assert got.state == irm_pb2.Reservation.STATE_RELEASED
    assert got.groups[0].resources[0].id == vm[0].group(1)
    assert got.groups[0].resources[0].address == vm[0].group(3)
    left = crs.ListReservations(irm_pb2.ListReservationsRequest(tenant="nodetenant"), timeout=10)
    assert list(left.reservations) == []


def test_the_node_client_without_its_token_is_refused_with_the_code_and_says_so(cloud: dict) -> None:
    done = _run_node(cloud, token=None)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Reserve failed: UNAUTHENTICATED" in done.stderr, done.stderr
    assert "reserved" not in done.stdout


def test_interrupting_the_node_client_stops_the_remote_command_and_releases(cloud: dict) -> None:
    proc = subprocess.Popen(_command(cloud, "--", "sleep", "600"), cwd=ROOT, env=_env(cloud["token"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: list[str] = []
        for line in proc.stdout:                   # until the agent says the command started
            seen.append(line.rstrip("\n"))
            if line.startswith("started "):
                break
        assert seen and seen[-1].startswith("started "), seen
        proc.send_signal(signal.SIGINT)            # Ctrl-C: the stream's end alone would leave `sleep` running
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest + err
    rid = next(x.split()[1] for x in seen if x.startswith("reserved "))
    vm_id, agent_address = next((x.split()[1], x.split()[5]) for x in seen if x.startswith("vm "))
    execution = seen[-1].split()[1]
    assert f"released {rid} STATE_RELEASED" in rest.splitlines(), rest + err
    crs = irm_pb2_grpc.ResourceManagerStub(tenant_channel(cloud["crs"], cloud["token"]))
    got = crs.GetReservation(irm_pb2.GetReservationRequest(tenant="nodetenant", reservation_id=rid), timeout=10)
    assert got.state == irm_pb2.Reservation.STATE_RELEASED and got.groups[0].resources[0].id == vm_id
    agent = agent_pb2_grpc.ExecutionAgentStub(tenant_channel(agent_address, cloud["token"]))
    ran = agent.GetExecution(agent_pb2.GetExecutionRequest(tenant="nodetenant", execution_id=execution), timeout=10)
    assert ran.state == agent_pb2.Execution.STATE_EXITED and ran.exited.reason == "stopped", ran
