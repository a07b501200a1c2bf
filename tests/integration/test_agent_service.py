"""The execution agent over gRPC, against a fake compute IRM (in-process servers, real child processes)."""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.v1 import agent_pb2, agent_pb2_grpc, compute_pb2, compute_pb2_grpc
from irm_compute.agent import AgentConfig, component
from services import server
from services.errors import field_violations
from services.tls import plain_channel
from tests.conftest import eventually
from tests.unit.test_agent_memory import HOLD

PY = sys.executable
ALICE, BOB = "alice", "bob"
SLEEP = [PY, "-c", "print('ready', flush=True); import time; time.sleep(60)"]


class FakeComputeControl(compute_pb2_grpc.ComputeControlServicer):
    """A stand-in for the compute IRM: a fixed table of VMs, and a count of lookups."""

    def __init__(self) -> None:
        self.vms: dict[str, compute_pb2.Vm] = {}
        self.lookups: Counter[str] = Counter()
        self.tokens: list[str] = []      # the control token each GetVm carried ("" when none)
        self._lock = threading.Lock()

    def add(
        self, vm_id: str, tenant: str = ALICE, cores: float = 1, memory_gb: float = 1, released: bool = False
    ) -> None:
        state = compute_pb2.Vm.STATE_RELEASED if released else compute_pb2.Vm.STATE_ACTIVE
        self.vms[vm_id] = compute_pb2.Vm(
            id=vm_id,
            tenant=tenant,
            reservation_id="res-1",
            host="local",
            cores=cores,
            memory_gb=memory_gb,
            state=state,
        )

    def GetVm(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        with self._lock:
            self.lookups[request.vm_id] += 1
            self.tokens.append(dict(context.invocation_metadata()).get("x-harness-control-token", ""))
        if request.vm_id not in self.vms:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no VM {request.vm_id}")
        return self.vms[request.vm_id]


def fake_compute_component(fake: FakeComputeControl) -> server.Component:
    return server.Component(
        name="fake-compute",
        register=lambda s: compute_pb2_grpc.add_ComputeControlServicer_to_server(fake, s),
        service_names=["harness.v1.ComputeControl"],
    )


@dataclass
class Cluster:
    compute: FakeComputeControl
    compute_port: int
    agent: agent_pb2_grpc.ExecutionAgentStub
    running: server.Running


def start_agent(
    compute_address: str, work_dir: Path, **overrides: object
) -> tuple[server.Running, grpc.Channel]:
    settings: dict[str, object] = {"sample_interval_s": 0.1, "compute_timeout_s": 2.0, **overrides}
    cfg = AgentConfig(
        address="127.0.0.1:0",
        compute_address=compute_address,
        work_dir=str(work_dir),
        **settings,  # type: ignore[arg-type]
    )
    running = server.start("127.0.0.1:0", [component(cfg)])
    return running, plain_channel(f"127.0.0.1:{running.port}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    fake = FakeComputeControl()
    fake.add("vm-a")
    fake.add("vm-b", tenant=BOB)
    fake.add("vm-gone", released=True)
    fake.add("vm-small", memory_gb=0.25)         # below the RLIMIT floor: spawned directly, watchdog only
    compute = server.start("127.0.0.1:0", [fake_compute_component(fake)])
    agent, channel = start_agent(f"127.0.0.1:{compute.port}", tmp_path / "agent")
    try:
        yield Cluster(fake, compute.port, agent_pb2_grpc.ExecutionAgentStub(channel), agent)
    finally:
        channel.close()
        agent.stop(0)
        compute.stop(0)


def execute(
    stub: agent_pb2_grpc.ExecutionAgentStub, argv: list[str], vm_id: str = "vm-a", tenant: str = ALICE, **kw
):  # type: ignore[no-untyped-def]
    return stub.Execute(agent_pb2.ExecuteRequest(tenant=tenant, vm_id=vm_id, argv=argv, **kw), timeout=30)


def until_stdout(call) -> agent_pb2.ExecutionStarted:  # type: ignore[no-untyped-def]
    """Read a stream up to the first stdout chunk; return its `started`."""
    started = next(call).started
    assert started.execution_id
    for event in call:
        if event.WhichOneof("event") == "stdout":
            return started
    raise AssertionError("stream ended before any output")


def wait_dead(pid: int) -> None:
    """Block until `pid` terminates (a pidfd is readable from then on, reaped or not)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], 10)[0], f"process {pid} survived"
    finally:
        os.close(fd)


# --- Execute ----------------------------------------------------------------------


def test_execute_streams_started_output_samples_and_exited(cluster: Cluster) -> None:
    code = (
        "import sys, time\n"
        "print('hello', flush=True); print('warn', file=sys.stderr, flush=True)\n"
        "t0 = time.monotonic(); end = t0 + 0.6\n"
        "while time.monotonic() < end: pass\n"
        "print(time.process_time() / (time.monotonic() - t0) * 100, flush=True)\n"
    )
    events = list(execute(cluster.agent, [PY, "-c", code], env={"X": "1"}))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and kinds[-1] == "exited"
    started, exited = events[0].started, events[-1].exited
    assert started.pid > 0 and len(started.cpus) == 1 and started.memory_limit_mb == 1024
    hello, share = b"".join(e.stdout for e in events).decode().splitlines()
    assert hello == "hello"
    assert b"".join(e.stderr for e in events) == b"warn\n"
    samples = [e.sample for e in events if e.HasField("sample")]
    # Busy, as far as a loaded machine let it be: the samples see at least half the CPU it says it got.
    assert len(samples) >= 3 and max(s.cpu_percent for s in samples) > 0.5 * float(share) > 0
    assert (exited.exit_code, exited.reason) == (0, "")
    assert exited.wall_time_s >= 0.6 and exited.peak_memory_mb > 1

    got = cluster.agent.GetExecution(
        agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=started.execution_id), timeout=10
    )
    assert got.state == agent_pb2.Execution.STATE_EXITED
    assert (got.vm_id, got.tenant, list(got.argv)) == ("vm-a", ALICE, [PY, "-c", code])
    assert got.started == started and got.exited == exited
    assert list(got.samples) == samples

    metrics = cluster.agent.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id="vm-a", tenant=ALICE), timeout=10)
    by_name = {s.name: s for s in metrics.series}
    assert set(by_name) == {"cpu_percent", "memory_percent"}
    assert all(s.resource_id == "vm-a" for s in metrics.series)
    assert [p.value for p in by_name["cpu_percent"].samples] == [s.cpu_percent for s in samples]
    assert [p.value for p in by_name["memory_percent"].samples] == [s.memory_percent for s in samples]
    since = samples[-1].time
    tail = cluster.agent.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id="vm-a", tenant=ALICE, since=since),
                                      timeout=10)
    assert [len(s.samples) for s in tail.series] == [1, 1]
    # Another tenant reads nothing of it; a call naming no tenant is refused.
    with pytest.raises(grpc.RpcError) as info:
        cluster.agent.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id="vm-a", tenant=BOB), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:
        cluster.agent.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id="vm-a"), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_commands_run_confined_to_their_vm(cluster: Cluster) -> None:
    code = (
        "import json, os, resource\n"
        "print(json.dumps([sorted(os.sched_getaffinity(0)), resource.getrlimit(resource.RLIMIT_DATA)[0],"
        " os.environ['HARNESS_VM_ID'], os.environ['OMP_NUM_THREADS']]))\n"
    )
    events = list(execute(cluster.agent, [PY, "-c", code]))
    started = events[0].started
    cpus, data_limit, vm_id, threads = json.loads(b"".join(e.stdout for e in events))
    assert cpus == list(started.cpus) and len(cpus) == 1
    assert data_limit == 1024 << 20  # a 1 GB VM
    assert (vm_id, threads) == ("vm-a", "1")
    # The agent pins the spawning thread for the spawn only: every thread of this process
    # (the in-process server's included) has the whole machine again.
    machine = os.sched_getaffinity(0)

    def affinity(tid: int) -> set[int]:
        try:
            return os.sched_getaffinity(tid)
        except ProcessLookupError:      # a thread that ended between the listing and this look
            return machine
    assert all(affinity(t.id) == machine for t in psutil.Process().threads())


def test_each_execution_gets_a_scratch_dir_unless_it_names_one(cluster: Cluster, tmp_path: Path) -> None:
    pwd = [PY, "-c", "import os; print(os.getcwd())"]
    events = list(execute(cluster.agent, pwd))
    cwd = Path(b"".join(e.stdout for e in events).decode().strip())
    assert cwd == tmp_path / "agent" / events[0].started.execution_id
    mine = tmp_path / "mine"
    mine.mkdir()
    events = list(execute(cluster.agent, pwd, working_dir=str(mine)))
    assert b"".join(e.stdout for e in events).decode().strip() == str(mine)
    error = rpc_error(execute(cluster.agent, pwd, working_dir=str(tmp_path / "absent")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in field_violations(error)] == ["working_dir"]


def test_history_keeps_the_newest_finished_executions(cluster: Cluster, tmp_path: Path) -> None:
    running, channel = start_agent(f"127.0.0.1:{cluster.compute_port}", tmp_path / "small", max_history=1)
    try:
        stub = agent_pb2_grpc.ExecutionAgentStub(channel)
        first, second = (list(execute(stub, [PY, "-c", "pass"]))[0].started.execution_id for _ in range(2))
        with pytest.raises(grpc.RpcError) as info:
            stub.GetExecution(agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=first), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert not (tmp_path / "small" / first).exists()  # its scratch dir went with it
        got = stub.GetExecution(agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=second), timeout=10)
        assert got.state == agent_pb2.Execution.STATE_EXITED
    finally:
        channel.close()
        running.stop(0)


def test_one_tenants_many_executions_push_out_its_own_history_not_another_tenants(cluster: Cluster,
                                                                                    tmp_path: Path) -> None:
    # Review 25: with the history agent-wide, oldest first, bob's flood of short commands pushed alice's execution
    # out -- her GetExecution, her scratch files and her VM's utilisation history (built from the executions kept).
    running, channel = start_agent(f"127.0.0.1:{cluster.compute_port}", tmp_path / "fair", max_history=3)
    try:
        stub = agent_pb2_grpc.ExecutionAgentStub(channel)
        hers = list(execute(stub, [PY, "-c", "open('result.txt', 'w').write('42'); import time; time.sleep(0.5)"]))[
            0].started.execution_id
        his = [list(execute(stub, [PY, "-c", "pass"], vm_id="vm-b", tenant=BOB))[0].started.execution_id
               for _ in range(4)]
        got = stub.GetExecution(agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=hers), timeout=10)
        assert got.state == agent_pb2.Execution.STATE_EXITED
        assert (tmp_path / "fair" / hers / "result.txt").read_text() == "42"
        series = stub.GetVmMetrics(agent_pb2.GetVmMetricsRequest(tenant=ALICE, vm_id="vm-a"), timeout=10).series
        assert series and all(x.samples for x in series)
        for gone, kept in ((his[:2], False), (his[2:], True)):      # bob's two oldest made room: 1 + 2 kept
            for execution_id in gone:
                try:
                    stub.GetExecution(agent_pb2.GetExecutionRequest(tenant=BOB, execution_id=execution_id),
                                      timeout=10)
                    assert kept, f"{execution_id} kept"
                except grpc.RpcError as e:
                    assert not kept and e.code() == grpc.StatusCode.NOT_FOUND
    finally:
        channel.close()
        running.stop(0)


def test_the_vm_shape_is_asked_once_and_cached(cluster: Cluster) -> None:
    for _ in range(2):
        assert list(execute(cluster.agent, [PY, "-c", "pass"]))[-1].exited.exit_code == 0
    assert cluster.compute.lookups["vm-a"] == 1


def test_timeout_is_reported(cluster: Cluster) -> None:
    exited = list(execute(cluster.agent, SLEEP, timeout_s=0.3))[-1].exited
    assert (exited.exit_code, exited.reason) == (-9, "timeout")


def test_stop_execution_kills_and_is_idempotent(cluster: Cluster) -> None:
    call = execute(cluster.agent, SLEEP)
    started = until_stdout(call)
    request = agent_pb2.StopExecutionRequest(tenant=ALICE, execution_id=started.execution_id)
    stopped = cluster.agent.StopExecution(request, timeout=10)
    assert stopped.state == agent_pb2.Execution.STATE_EXITED
    assert (stopped.exited.exit_code, stopped.exited.reason) == (-9, "stopped")
    rest = list(call)  # the stream ends with the same `exited`
    assert rest[-1].exited == stopped.exited
    again = cluster.agent.StopExecution(request, timeout=10)
    assert again.exited == stopped.exited


def test_cancelled_stream_leaves_the_command_running(cluster: Cluster) -> None:
    call = execute(cluster.agent, SLEEP)
    started = until_stdout(call)
    call.cancel()
    get = agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=started.execution_id)
    assert cluster.agent.GetExecution(get, timeout=10).state == agent_pb2.Execution.STATE_RUNNING
    stop = agent_pb2.StopExecutionRequest(tenant=ALICE, execution_id=started.execution_id)
    assert cluster.agent.StopExecution(stop, timeout=10).exited.reason == "stopped"
    wait_dead(started.pid)


def test_release_vm_kills_its_processes_and_forgets_it(cluster: Cluster) -> None:
    call = execute(cluster.agent, SLEEP)
    started = until_stdout(call)
    # Still reserved at the compute IRM: a ReleaseVm from anyone else kills nothing.
    with pytest.raises(grpc.RpcError) as refused:
        cluster.agent.ReleaseVm(agent_pb2.ReleaseVmRequest(vm_id="vm-a"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "still reserved" in refused.value.details()
    cluster.compute.add("vm-a", released=True)          # the compute IRM released it, then tells the agent
    reply = cluster.agent.ReleaseVm(agent_pb2.ReleaseVmRequest(vm_id="vm-a"), timeout=10)
    assert reply.killed == 1
    exited = list(call)[-1].exited
    assert (exited.exit_code, exited.reason) == (-9, "vm released")
    wait_dead(started.pid)
    with pytest.raises(grpc.RpcError) as info:
        list(execute(cluster.agent, [PY, "-c", "pass"]))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # Releasing again (the compute IRM retries) kills nothing and is no error.
    assert cluster.agent.ReleaseVm(agent_pb2.ReleaseVmRequest(vm_id="vm-a"), timeout=10).killed == 0


def test_agent_stop_kills_running_executions(cluster: Cluster) -> None:
    call = execute(cluster.agent, SLEEP)
    started = until_stdout(call)
    cluster.running.stop(0)
    wait_dead(started.pid)


# --- errors ---------------------------------------------------------------------------


def rpc_error(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    return info.value


def test_another_tenants_vm_and_execution_are_denied(cluster: Cluster) -> None:
    assert rpc_error(execute(cluster.agent, SLEEP, vm_id="vm-b")).code() == grpc.StatusCode.PERMISSION_DENIED
    call = execute(cluster.agent, SLEEP)
    started = until_stdout(call)
    for rpc, request in [
        (
            cluster.agent.GetExecution,
            agent_pb2.GetExecutionRequest(tenant=BOB, execution_id=started.execution_id),
        ),
        (
            cluster.agent.StopExecution,
            agent_pb2.StopExecutionRequest(tenant=BOB, execution_id=started.execution_id),
        ),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            rpc(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    get = agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=started.execution_id)
    assert (
        cluster.agent.GetExecution(get, timeout=10).state == agent_pb2.Execution.STATE_RUNNING
    )  # bob stopped nothing
    call.cancel()


def test_unknown_vm_and_execution_are_not_found(cluster: Cluster) -> None:
    assert rpc_error(execute(cluster.agent, SLEEP, vm_id="vm-nope")).code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        cluster.agent.GetExecution(
            agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id="ex-nope"), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_released_vm_is_refused(cluster: Cluster) -> None:
    error = rpc_error(execute(cluster.agent, SLEEP, vm_id="vm-gone"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "released" in error.details()


def test_empty_argv_names_the_field(cluster: Cluster) -> None:
    error = rpc_error(execute(cluster.agent, []))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in field_violations(error)] == ["argv"]
    assert cluster.compute.lookups["vm-a"] == 0  # bad input is refused before asking anyone


def test_missing_program_is_invalid_argv(cluster: Cluster) -> None:
    error = rpc_error(execute(cluster.agent, ["/no/such/program"]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(error)[0][0] == "argv"


@pytest.mark.parametrize("vm", ["vm-small", "vm-a"])   # spawned directly / through the prlimit wrapper
def test_what_can_start_does_not_depend_on_the_vms_size(cluster: Cluster, tmp_path: Path, vm: str) -> None:
    script = tmp_path / "noshebang"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    events = list(execute(cluster.agent, [str(script)], vm_id=vm))       # run by /bin/sh, as execvp does
    assert b"".join(e.stdout for e in events) == b"hi\n" and events[-1].exited.exit_code == 0
    plain = tmp_path / "plain"
    plain.write_text("echo hi\n")                                        # no execute permission
    for not_a_program in (str(tmp_path), str(plain)):
        error = rpc_error(execute(cluster.agent, [not_a_program], vm_id=vm))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [f for f, _ in field_violations(error)] == ["argv"]
        assert "not an executable file" in error.details()




def test_executions_of_one_vm_share_its_memory(cluster: Cluster, tmp_path: Path) -> None:
    # 400 + 700 MB on one 1 GB VM: the larger is killed, as a real VM's OOM killer would pick it.
    small, large = (execute(cluster.agent, [PY, "-c", HOLD.format(mb=mb)], working_dir=str(tmp_path), timeout_s=60)
                    for mb in (400, 700))
    small_started = until_stdout(small)
    x = list(large)[-1].exited
    assert (x.exit_code, x.reason) == (-9, "memory limit exceeded")
    get = agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=small_started.execution_id)
    assert cluster.agent.GetExecution(get, timeout=10).state == agent_pb2.Execution.STATE_RUNNING
    (tmp_path / "release").touch()
    y = list(small)[-1].exited
    assert (y.exit_code, y.reason) == (0, "")


def test_the_execute_stream_cap_refuses_one_more_and_leaves_room_for_control_calls(
        cluster: Cluster, tmp_path: Path) -> None:
    running, channel = start_agent(f"127.0.0.1:{cluster.compute_port}", tmp_path / "capped", max_execute_streams=2)
    try:
        stub = agent_pb2_grpc.ExecutionAgentStub(channel)
        calls = [execute(stub, SLEEP) for _ in range(2)]
        ids = [until_stdout(c).execution_id for c in calls]
        error = rpc_error(execute(stub, SLEEP))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 executions are streaming" in error.details() and "retry" in error.details()
        stopped = stub.StopExecution(agent_pb2.StopExecutionRequest(tenant=ALICE, execution_id=ids[0]), timeout=5)
        assert stopped.exited.reason == "stopped"
        assert list(calls[0])[-1].exited.reason == "stopped"          # its stream ended: a stream is free
        assert list(execute(stub, [PY, "-c", "pass"]))[-1].exited.exit_code == 0
        calls[1].cancel()                                            # a cancelled stream frees its slot too
        eventually(lambda: list(execute(stub, [PY, "-c", "pass"]))[-1].exited.exit_code == 0,
                   what="a stream freed by the cancel")
    finally:
        channel.close()
        running.stop(0)


def test_the_agents_worker_pool_outgrows_its_stream_cap(cluster: Cluster, tmp_path: Path) -> None:
    # 33 streams: more than the 32 workers a server had; each holds one while its command runs.
    n = 33
    running, channel = start_agent(f"127.0.0.1:{cluster.compute_port}", tmp_path / "many",
                                   max_execute_streams=n, sample_interval_s=2.0)
    try:
        stub = agent_pb2_grpc.ExecutionAgentStub(channel)
        calls = [stub.Execute(agent_pb2.ExecuteRequest(tenant=ALICE, vm_id="vm-a", argv=["/bin/sleep", "60"]),
                              timeout=120) for _ in range(n)]
        ids = [next(c).started.execution_id for c in calls[:-1]]
        # With every stream served and holding its worker, the control calls still find one at once ...
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        got = stub.GetExecution(agent_pb2.GetExecutionRequest(tenant=ALICE, execution_id=ids[0]), timeout=5)
        assert got.state == agent_pb2.Execution.STATE_RUNNING
        ids.append(next(calls[-1]).started.execution_id)                # ... and the last stream started too
        for i in ids:
            stopped = stub.StopExecution(agent_pb2.StopExecutionRequest(tenant=ALICE, execution_id=i), timeout=5)
            assert stopped.exited.reason == "stopped"
    finally:
        channel.close()
        running.stop(0)


def test_unreachable_compute_irm_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    running, channel = start_agent(f"127.0.0.1:{port}", tmp_path / "agent")
    try:
        error = rpc_error(execute(agent_pb2_grpc.ExecutionAgentStub(channel), SLEEP))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert f"127.0.0.1:{port}" in error.details()
    finally:
        channel.close()
        running.stop(0)


def test_with_a_control_token_the_agent_takes_the_compute_irms_calls_only_and_sends_its_own(tmp_path: Path) -> None:
    fake = FakeComputeControl()
    fake.add("vm-a")
    compute = server.start("127.0.0.1:0", [fake_compute_component(fake)])
    agent, channel = start_agent(f"127.0.0.1:{compute.port}", tmp_path / "agent", control_token="s3cret")
    try:
        stub = agent_pb2_grpc.ExecutionAgentStub(channel)
        assert list(execute(stub, [PY, "-c", "pass"]))[-1].exited.exit_code == 0
        assert fake.tokens and set(fake.tokens) == {"s3cret"}          # its GetVm calls carry the token
        for metadata in ((), (("x-harness-control-token", "guess"),)):
            for call in (lambda m: stub.ReleaseVm(agent_pb2.ReleaseVmRequest(vm_id="vm-a"), metadata=m, timeout=10),
                         lambda m: stub.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id="vm-a", tenant=ALICE),
                                                     metadata=m, timeout=10)):
                with pytest.raises(grpc.RpcError) as e:
                    call(metadata)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = stub.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id="vm-a", tenant=ALICE),
                               metadata=(("x-harness-control-token", "s3cret"),), timeout=10)
        assert {s.name for s in ok.series} == {"cpu_percent", "memory_percent"}
    finally:
        channel.close()
        agent.stop(0)
        compute.stop(0)
