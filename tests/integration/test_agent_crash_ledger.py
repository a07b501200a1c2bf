"""A restarted agent also kills what its SIGKILLed predecessor ran that carries no execution mark: a child given
an environment of its own (many programs pass `env=`) and a daemon that double-forked into a session of its own
with an empty environment. The predecessor's ledger in the work dir (irm_compute.processes) lists them.

Compute IRM and agent are separate processes; the execution is a real command, SIGKILL is real.
"""

from __future__ import annotations

import json
import sys

import grpc
import psutil
import pytest

from harness.v1 import agent_pb2
from tests.conftest import Suite, eventually
from tests.integration.test_agent_crash import crash_and_restart, kill_all, one_vm

PY = sys.executable

# Forks, leaves its session, forks again, writes its pid and sleeps: with an empty environment, no mark.
DAEMON = ("import os, sys, time\n"
          "if os.fork(): sys.exit(0)\n"
          "os.setsid()\n"
          "if os.fork(): sys.exit(0)\n"
          "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
          "time.sleep(120)\n")
PROGRAM = ("import os, subprocess, sys, time\n"
           f"sleeper = [{PY!r}, '-c', 'import time; time.sleep(120)']\n"
           "own = subprocess.Popen(sleeper, env={'PATH': os.environ.get('PATH', '')})\n"
           f"subprocess.run([{PY!r}, '-c', sys.argv[1], 'daemon.pid'], env={{}}, check=True)\n"
           "print(own.pid, flush=True)\n"
           "time.sleep(120)\n")


def _listed(ledger) -> set[int]:  # type: ignore[no-untyped-def]
    try:
        return {e[0] for e in json.loads(ledger.read_text())["processes"]}
    except (FileNotFoundError, ValueError):
        return set()


def test_a_restarted_agent_kills_its_predecessors_unmarked_children_and_daemons(tmp_path):
    suite = Suite(str(tmp_path))
    work = tmp_path / "agent-work"
    tree: list[psutil.Process] = []
    try:
        compute, agent = suite.compute_and_agent(agent=dict(work_dir=str(work)))
        stub, vm = one_vm(compute.address, agent.address)
        call = stub.Execute(agent_pb2.ExecuteRequest(tenant="t", vm_id=vm, argv=[PY, "-c", PROGRAM, DAEMON],
                                                     timeout_s=60), timeout=60)
        started = next(call).started
        own_pid = int(next(e for e in call if e.WhichOneof("event") == "stdout").stdout)
        daemon_pid = int((work / started.execution_id / "daemon.pid").read_text())
        tree += [psutil.Process(p) for p in (started.pid, own_pid, daemon_pid)]
        for p in tree[1:]:
            assert "HARNESS_EXECUTION_MARK" not in p.environ()      # nothing to find them by but the ledger
        # The agent's scans (one per sample) have placed them all, and the ledger says so.
        eventually(lambda: {p.pid for p in tree} <= _listed(work / "processes.json"), timeout=15,
                   what="the ledger to list the command, its child and the daemon")

        crash_and_restart(suite, agent, call, compute.address, work, tree)
        # A gone execution is not known to the successor; it says why it may be so.
        with pytest.raises(grpc.RpcError) as info:
            stub.GetExecution(agent_pb2.GetExecutionRequest(tenant="t", execution_id=started.execution_id),
                              timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "earlier agent process" in info.value.details()
    finally:
        kill_all(tree)                                           # whatever a failure left behind
        suite.stop_all()
