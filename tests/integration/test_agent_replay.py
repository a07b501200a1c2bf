"""The compute IRM's `replay` back-end: a VM answers with a measured run from a dataset.

Runs through the real path: the CRS reserves a VM, the agent (a process with
backend=replay) answers Execute with the dataset's time, cost and status.
"""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import agent_pb2, agent_pb2_grpc, irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually
from tests.integration.test_crs_flow import vm_group

DATASET = """workload,runtime_s,cost,status,cloud,vcpus
sort,120.0,0.50,ok,aws,4
sort,60.0,0.40,ok,aws,8
sort,30.0,0.20,out of memory,gcp,2
"""


def execute(agent, vm, env, timeout_s=0.0):  # type: ignore[no-untyped-def]
    events = list(agent.Execute(agent_pb2.ExecuteRequest(tenant="t", vm_id=vm.id, argv=["app"], env=env,
                                                         timeout_s=timeout_s), timeout=30))
    return events[0].started, [e.exited for e in events if e.WhichOneof("event") == "exited"][0], events


def test_replay_agent_answers_with_measured_runs(suite, tmp_path):
    data = tmp_path / "runs.csv"
    data.write_text(DATASET)
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    compute = suite.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3, backend="replay")
    work = tmp_path / "agent-work"
    agent = suite.start("agent", compute_address=compute.address, backend="replay", dataset=str(data),
                        work_dir=str(work))
    # The compute IRM's hosts point at the default agent address; use this agent explicitly.
    c = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: len(c.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 6)
    res = c.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[vm_group("g", 1, 4, 8)]))
    vm = res.groups[0].resources[0]
    stub = agent_pb2_grpc.ExecutionAgentStub(plain_channel(agent.address))

    started, exited, _ = execute(stub, vm, {"HARNESS_REPLAY_WORKLOAD": "sort", "cloud": "aws", "vcpus": "8"})
    assert "replayed" in started.notes[0]
    assert (exited.exit_code, exited.wall_time_s, exited.replayed_cost) == (0, 60.0, pytest.approx(0.40))
    assert exited.replayed
    # A measured run longer than the execution's limit ends as a live one would: killed at the limit.
    _, cut, _ = execute(stub, vm, {"HARNESS_REPLAY_WORKLOAD": "sort", "cloud": "aws", "vcpus": "8"}, timeout_s=30)
    assert (cut.exit_code, cut.wall_time_s, cut.reason) == (-9, 30.0, "timeout")
    assert cut.replayed and cut.replayed_cost == pytest.approx(0.20)

    _, failed, events = execute(stub, vm, {"HARNESS_REPLAY_WORKLOAD": "sort", "cloud": "gcp", "vcpus": "2"})
    assert failed.exit_code == 1 and failed.reason == "out of memory" and failed.replayed_cost == pytest.approx(0.2)

    for vcpus in range(3):
        with pytest.raises(grpc.RpcError) as e:
            execute(stub, vm, {"HARNESS_REPLAY_WORKLOAD": "sort", "cloud": "azure", "vcpus": str(vcpus)})
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "no measured run" in e.value.details()
    # Nothing runs, so no scratch directory, refused or not (only the agent's own lock on its work dir).
    assert [p.name for p in work.iterdir()] == [".agent.lock"]

    # The VM's series: replayed runs have no samples (nothing ran), and reading them is no error.
    metrics = stub.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id=vm.id, tenant="t"), timeout=10)
    assert {s.name: len(s.samples) for s in metrics.series} == {"cpu_percent": 0, "memory_percent": 0}
    with pytest.raises(grpc.RpcError) as e:
        execute(stub, vm, {"cloud": "aws"})
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Tenant checks still apply: the VM is t's.
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Execute(agent_pb2.ExecuteRequest(tenant="other", vm_id=vm.id, argv=["app"],
                                                   env={"HARNESS_REPLAY_WORKLOAD": "sort"}), timeout=30))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
