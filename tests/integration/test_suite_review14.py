"""`harness up` restarts a service that dies (same address, settings and control token) instead of stopping the
suite, gives up on one that keeps crashing, and stops promptly meanwhile; commands that need a suite's addresses
say when none runs from the state directory instead of trying the default ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.v1 import irm_pb2, irm_pb2_grpc
from services import suite as suite_mod
from services.tls import plain_channel
from tests.conftest import eventually
from tests.integration.test_crs_flow import vm_group

HARNESS = [sys.executable, "-m", "services.cli"]
TENANT = "review14"


def _recorded(state: Path) -> dict[str, int]:
    try:
        return {k: v["pid"] for k, v in json.loads((state / "processes.json").read_text()).items()}
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _text(log: Path) -> str:
    return " ".join(log.read_text().split())      # rich may wrap a long line


def _serving(address: str) -> bool:
    try:
        with plain_channel(address) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@contextlib.contextmanager
def _up(tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """`harness up --auto-ports` on a fresh state directory, once it is up: (process, state dir, its stderr)."""
    state, log = tmp_path / "state", tmp_path / "up.log"
    seen: set[int] = set()
    with open(log, "w") as err:
        proc = subprocess.Popen([*HARNESS, "up", "--auto-ports", "--state-dir", str(state)],
                                stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "COLUMNS": "300", **env})
    try:
        eventually(lambda: "Harness is up" in log.read_text() or proc.poll() is not None, timeout=120,
                   what="`harness up` to start the suite")
        assert proc.poll() is None, log.read_text()
        seen.update(_recorded(state).values())
        yield proc, state, log
    finally:
        seen.update(_recorded(state).values())
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in seen:                       # a failing test leaves no service behind
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


def _restarted(state: Path, log: Path, name: str, old: int) -> int:
    """The pid of `name` once `harness up` said it restarted it (in place of `old`)."""
    return eventually(lambda: f"{name} restarted" in _text(log) and _recorded(state).get(name, old) != old
                      and _recorded(state)[name], timeout=60, what=f"{name} to be restarted")


def test_a_killed_agent_is_restarted_at_its_address_and_serves_with_the_suites_token(tmp_path):
    with _up(tmp_path) as (proc, state, log):
        addrs = json.loads((state / "suite.json").read_text())
        before = _recorded(state)
        crs = irm_pb2_grpc.ResourceManagerStub(plain_channel(addrs["crs"]))
        eventually(lambda: len(crs.DiscoverResources(irm_pb2.DiscoverResourcesRequest(resource_type="vm"))
                               .resources) == 6, what="the compute IRM's hosts in the CRS")
        res = crs.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="r14-restart",
                                                 groups=[vm_group("master", 1, 1, 0.5)]), timeout=60)
        vm = res.groups[0].resources[0]

        os.kill(before["agent"], signal.SIGKILL)           # as the OOM killer would
        agent = _restarted(state, log, "agent", before["agent"])
        text = _text(log)
        assert "agent exited (-9, SIGKILL); restarting in 1 s" in text, text
        assert "stopping the suite" not in text and proc.poll() is None
        assert _alive(agent) and _serving(addrs["agent"])                      # at the same address
        assert json.loads((state / "suite.json").read_text()) == addrs
        # The other services were not touched: the same processes, still serving.
        assert {k: v for k, v in _recorded(state).items() if k != "agent"} == \
            {k: v for k, v in before.items() if k != "agent"}
        assert all(_alive(pid) for name, pid in before.items() if name != "agent")

        # End to end through the restarted agent: it learns the VM from the compute IRM (GetVm, with the suite's
        # control token), runs the command; the compute IRM reads the VM's utilisation from it (GetVmMetrics,
        # token required: refused, it would answer no series) and releases it.
        ran = subprocess.run([*HARNESS, "run", res.id, "--state-dir", str(state), "--tenant", TENANT, "--",
                              sys.executable, "-c", "print('ran after the restart')"],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0 and "ran after the restart" in ran.stdout, ran.stderr
        metrics = crs.GetMetrics(irm_pb2.GetMetricsRequest(tenant=TENANT, reservation_id=res.id), timeout=30)
        assert {(s.name, s.resource_id) for s in metrics.series} == {("cpu_percent", vm.id),
                                                                       ("memory_percent", vm.id)}
        assert crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(
            tenant=TENANT, reservation_id=res.id), timeout=30).state == irm_pb2.Reservation.STATE_RELEASED

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not any(_alive(pid) for pid in [*before.values(), agent])


def test_a_service_that_keeps_crashing_is_given_up_on_and_the_suite_stopped(tmp_path):
    with _up(tmp_path, HARNESS_UP_BACKOFF="0.1,0.1", HARNESS_UP_GIVE_UP="2/60") as (proc, state, log):
        before = _recorded(state)
        os.kill(before["agent"], signal.SIGKILL)
        agent = _restarted(state, log, "agent", before["agent"])       # the first crash: restarted
        os.kill(agent, signal.SIGKILL)                                   # the second within 60 s: given up
        assert proc.wait(60) == 1
        text = _text(log)
        assert ("agent crashed 2 times within 60 s (last: -9, SIGKILL); giving up on it: stopping the suite"
                in text), text
        assert not any(_alive(pid) for pid in [*before.values(), agent])
        assert not (state / "suite.json").exists() and not (state / "processes.json").exists()


def test_harness_down_stops_the_suite_promptly_while_a_restart_waits_then_status_says_none_runs(tmp_path):
    with _up(tmp_path, HARNESS_UP_BACKOFF="300,300") as (proc, state, log):
        before = _recorded(state)
        os.kill(before["agent"], signal.SIGKILL)
        eventually(lambda: "agent exited (-9, SIGKILL); restarting in 300 s" in _text(log),
                   what="the restart's back-off")
        started = time.monotonic()
        down = subprocess.run([*HARNESS, "down", "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stderr
        assert proc.wait(10) == 0
        assert time.monotonic() - started < 60                 # not after the 300 s back-off
        assert not any(_alive(pid) for pid in before.values())
        status = subprocess.run([*HARNESS, "status", "--state-dir", str(state)], capture_output=True, text=True,
                                timeout=60)
        assert status.returncode == 1
        assert f"no suite runs from {state}: start one with `harness up`" in " ".join(status.stderr.split())


def test_commands_say_no_suite_runs_from_a_state_directory_without_one(tmp_path):
    def harness(*argv: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([*HARNESS, *argv], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})

    empty = tmp_path / "empty"
    for argv in (["status"], ["discover"], ["jobs", "list"], ["app", "list"]):
        r = harness(*argv, "--state-dir", str(empty))
        err = " ".join(r.stderr.split())
        assert r.returncode == 1 and f"no suite runs from {empty}: start one with `harness up`" in err, (argv, err)
        assert "UNREACHABLE" not in r.stdout and "Traceback" not in err
    assert "--am HOST:PORT" in harness("app", "list", "--state-dir", str(empty)).stderr
    r = harness("status", "--json", "--state-dir", str(empty))
    assert r.returncode == 1
    assert json.loads(r.stdout) == {"ok": False, "services": [], "crs_registry": None, "warnings": [],
                                    "problems": [f"no suite runs from {empty}: start one with `harness up`"]}
    # The default state directory ($HARNESS_HOME) without a suite: the same, naming it.
    home = tmp_path / "home"
    r = harness("status", HARNESS_HOME=str(home))
    assert r.returncode == 1 and f"no suite runs from {home}" in " ".join(r.stderr.split())
    # Asked for explicitly, the default ports are still checked (e.g. compose's published ones).
    r = harness("status", "--json", "--default-ports", "--state-dir", str(empty))
    assert {s["name"]: s["address"] for s in json.loads(r.stdout)["services"]} == {
        name: f"127.0.0.1:{port}" for name, port in suite_mod.DEFAULT_PORTS.items()}
