"""An agent that dies without its shutdown (SIGKILL: a crash, the OOM killer) cannot kill what it ran; the agent
restarted on its work dir does, at start-up, and removes the scratch directories nobody owns any more. A second
agent on a work dir in use is refused.

Compute IRM and agent are separate processes; the execution is a real command, SIGKILL is real.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import Suite, eventually, start_again

PY = sys.executable


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def crash_and_restart(suite: Suite, agent, call, compute_address: str, work, tree: list[psutil.Process]) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL `agent` while `call` runs `tree` (no shutdown: nothing killed), then start an agent again on its
    work dir, at its address (the compute IRM knows its agent there), and wait for `tree` to be gone: killed at
    start-up, before it serves, well before the processes' own end."""
    address = agent.address
    agent.kill()
    call.cancel()
    assert not any(_gone(p) for p in tree)                   # orphaned, no longer watched
    start_again(lambda: suite.start("agent", name="agent2", address=address, compute_address=compute_address,
                                    work_dir=str(work)), "the agent")
    eventually(lambda: all(_gone(p) for p in tree), timeout=15, what="the orphaned processes gone")


def one_vm(compute_address: str, agent_address: str) -> tuple[agent_pb2_grpc.ExecutionAgentStub, str]:
    """A stub of the agent, and a 1-core VM of tenant "t" reserved at the compute IRM."""
    irm = irm_pb2_grpc.ResourceManagerStub(plain_channel(compute_address))
    res = irm.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[irm_pb2.ResourceGroup(
        name="g", resource_type="vm", count=1, attributes={
            "cores": common_pb2.AttributeRequest(number=1),
            "memory_gb": common_pb2.AttributeRequest(number=1)})]), timeout=30)
    return agent_pb2_grpc.ExecutionAgentStub(plain_channel(agent_address)), res.groups[0].resources[0].id


def test_a_restarted_agent_kills_what_its_crashed_predecessor_left_running(tmp_path):
    suite = Suite(str(tmp_path))
    work = tmp_path / "agent-work"
    work.mkdir()
    (work / "notes.txt").write_text("not the agent's")          # only scratch directories go
    # Another agent's execution (another work dir, so another mark prefix): not this agent's to kill.
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, "HARNESS_EXECUTION_MARK": "agent-0123456789abcdef-" + "0" * 32})
    tree: list[psutil.Process] = []
    try:
        compute, agent = suite.compute_and_agent(agent=dict(work_dir=str(work)))
        stub, vm = one_vm(compute.address, agent.address)
        # A child of the command too: the whole tree must go, not just its leader.
        code = (f"import subprocess, time; subprocess.Popen([{PY!r}, '-c', 'import time; time.sleep(120)']); "
                "print('ready', flush=True); time.sleep(120)")
        # A time limit far beyond the steps before the crash (a second agent's start-up among them): the tree
        # must still be there when the agent dies, and still below the orphans' own 120 s.
        call = stub.Execute(agent_pb2.ExecuteRequest(tenant="t", vm_id=vm, argv=[PY, "-c", code], timeout_s=60),
                            timeout=60)
        started = next(call).started
        assert next(e for e in call if e.WhichOneof("event") == "stdout").stdout == b"ready\n"
        scratch = work / started.execution_id
        assert scratch.is_dir()
        leader = psutil.Process(started.pid)
        tree += [leader, *leader.children(recursive=True)]
        assert len(tree) == 2

        # A second agent on the same work dir is refused: it would take the run above for a crashed agent's.
        dup = subprocess.run([PY, "-m", "services.cli", "serve", "agent", "--address", "127.0.0.1:0",
                              "--set", f"compute_address={compute.address}", "--set", f"work_dir={work}"],
                             capture_output=True, text=True, timeout=60)
        assert dup.returncode == 2 and f"another agent (pid {agent.proc.pid}) runs on work_dir" in dup.stderr
        assert not any(_gone(p) for p in tree)

        crash_and_restart(suite, agent, call, compute.address, work, tree)
        assert not scratch.exists()
        assert (work / "notes.txt").read_text() == "not the agent's"
        assert other.poll() is None                              # another agent's run is left alone
    finally:
        other.kill()
        other.wait()
        kill_all(tree)                                           # whatever a failure left behind
        suite.stop_all()
