"""The whole suite as `harness up` runs it: CRS, compute IRM and agent as processes.

A tenant reserves through the CRS, runs real commands through the agent inside
the VMs' confines, reads utilisation back through the CRS, and releases.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import psutil
import pytest

from harness.v1 import agent_pb2, agent_pb2_grpc, irm_pb2, irm_pb2_grpc
from services import control
from services import suite as suite_mod
from services.launcher import LaunchError
from services.tls import plain_channel
from tests.conftest import PORT_TAKEN, eventually, until_ports_hold
from tests.integration.test_crs_flow import vm_group

TENANT = "acme"


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("suite"))
    # On ports it picks (--auto-ports): picked again if one was taken before its service listened there.
    procs = until_ports_hold(lambda: suite_mod.start(state, auto_ports=True), "the suite")
    addrs = {p.name: p.address for p in procs}
    crs = irm_pb2_grpc.ResourceManagerStub(plain_channel(addrs["crs"]))
    eventually(lambda: len(crs.DiscoverResources(irm_pb2.DiscoverResourcesRequest(resource_type="vm")).resources)
               == 6, what="the compute IRM's hosts in the CRS")
    yield {"state": state, "addrs": addrs, "crs": crs, "procs": procs}
    suite_mod.stop(procs)


def execute(vm: irm_pb2.AllocatedResource, argv: list[str], tenant: str = TENANT, **kw) -> dict:
    stub = agent_pb2_grpc.ExecutionAgentStub(plain_channel(vm.address))
    out = {"stdout": b"", "stderr": b"", "samples": [], "started": None, "exited": None}
    for ev in stub.Execute(agent_pb2.ExecuteRequest(tenant=tenant, vm_id=vm.id, argv=argv, **kw), timeout=60):
        kind = ev.WhichOneof("event")
        if kind in ("stdout", "stderr"):
            out[kind] += getattr(ev, kind)
        elif kind == "sample":
            out["samples"].append(ev.sample)
        else:
            out[kind] = getattr(ev, kind)
    return out


def test_status_reports_every_service_serving(running):
    r = subprocess.run([sys.executable, "-m", "services.cli", "status", "--json", "--state-dir", running["state"]],
                       capture_output=True, text=True, timeout=60)
    status = json.loads(r.stdout)
    assert r.returncode == 0 and status["ok"] is True
    assert {s["name"]: s["status"] for s in status["services"]} == {
        p.name: "SERVING" for p in suite_mod.plan(running["state"])}
    assert {"crs", "compute", "agent", "fpga-server", "fpga"} <= {s["name"] for s in status["services"]}



def _status(state: str, *json_flag: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", "status", *json_flag, "--state-dir", state],
                          capture_output=True, text=True, timeout=60)


def test_status_reports_every_irm_registered_with_the_crs(running):
    r = _status(running["state"], "--json")
    status = json.loads(r.stdout)
    assert r.returncode == 0 and status["ok"] is True, r.stdout + r.stderr
    irms = {s["name"]: s for s in status["services"] if "crs_registration" in s}
    assert set(irms) == {"compute", "fpga"}
    for name, s in irms.items():
        assert (s["crs_registration"], s["crs_up"], s["crs_registered_address"], s["manager"]) == (
            "registered", True, running["addrs"][name], name)
    assert status["crs_registry"] == {"address": running["addrs"]["crs"], "reachable": True}
    assert status["problems"] == [] and status["warnings"] == []
    plain = _status(running["state"])
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    lines = {line.split()[0]: line for line in plain.stdout.splitlines()}
    assert "crs: registered as 'compute'" in lines["compute"] and "crs: registered as 'fpga'" in lines["fpga"]
    assert lines["agent"].split()[2:] == ["SERVING"]       # services that do not register: as before


def test_the_operator_lists_and_deregisters_managers_with_the_suites_control_token(running):
    token_file = Path(running["state"]) / "control-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token_file.read_text()) == 32
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_CONTROL_TOKEN"}

    def managers(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.cli", "managers", *argv, "--state-dir",
                               running["state"]], capture_output=True, text=True, timeout=60, env=env)

    listed = managers()
    assert listed.returncode == 0, listed.stderr
    assert sorted(m["name"] for m in json.loads(listed.stdout)["managers"]) == ["compute", "fpga"]
    # Sent with the suite's token (else UNAUTHENTICATED), refused: the compute IRM still runs.
    refused = managers("deregister", "compute")
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr, refused.stderr
    assert "is up (it heartbeated" in refused.stderr


def test_status_checks_the_services_named_where_named(running):
    # The operators' review: a deployment of `harness serve`s on other ports could not be checked (--default-ports
    # checks all six services at 127.0.0.1:50051...).
    addrs = running["addrs"]
    r = subprocess.run([sys.executable, "-m", "services.cli", "status", "--json", "--service", f"crs={addrs['crs']}",
                        "--service", f"compute={addrs['compute']}"], capture_output=True, text=True, timeout=60)
    status = json.loads(r.stdout)
    assert r.returncode == 0 and status["ok"] is True, r.stdout + r.stderr
    assert [(s["name"], s["status"]) for s in status["services"]] == [("crs", "SERVING"), ("compute", "SERVING")]
    assert status["services"][1]["crs_registration"] == "registered"


def test_status_fails_while_an_irm_is_not_registered_with_the_crs(tmp_path, unused_address):
    # The operator's mistake: a config file pins the FPGA IRM to a CRS at a fixed port, while `--auto-ports`
    # put the suite's CRS elsewhere. Every service serves; the FPGA IRM never registers with the suite's CRS.
    from harness.v1 import registry_pb2, registry_pb2_grpc
    from services.registration import Membership

    nowhere = unused_address()          # nothing answers there, for the whole test
    conf = tmp_path / "harness.yaml"
    conf.write_text(f"orchestrator:\n  crs_address: {nowhere}\n"
                    "crs:\n  heartbeat_interval_s: 0.2\n  heartbeat_timeout_s: 1\n")
    state = str(tmp_path / "state")
    # One control token the test knows (the suite's own is in its services' environments only): the stand-in
    # manager below registers with it.
    token = "test-control-token"
    environ = {**os.environ, **{f"HARNESS_{section.upper()}_CONTROL_TOKEN": token
                                for section in ("crs", "compute", "agent", "fpga_server", "orchestrator")}}
    procs = until_ports_hold(lambda: suite_mod.start(state, auto_ports=True, config_file=str(conf), environ=environ),
                             "the suite")
    try:
        addrs = {p.name: p.address for p in procs}
        crs = addrs["crs"]

        def irms(status: dict) -> dict:
            return {s["name"]: s for s in status["services"] if "crs_registration" in s}

        r = _status(state, "--json")
        status = json.loads(r.stdout)
        assert r.returncode == 1 and status["ok"] is False
        assert {s["status"] for s in status["services"]} == {"SERVING"}     # health alone looks fine
        assert irms(status)["compute"]["crs_registration"] == "registered"
        assert irms(status)["fpga"]["crs_registration"] == "not_registered"
        (problem,) = status["problems"]
        assert f"fpga at {addrs['fpga']} serves but is not registered with the CRS at {crs}" in problem
        assert f"crs_address setting must point at the CRS's address {crs}" in problem
        assert "`orchestrator` section" in problem
        plain = _status(state)
        assert plain.returncode == 1
        lines = {line.split()[0]: line for line in plain.stdout.splitlines()}
        assert lines["fpga"].endswith("crs: NOT REGISTERED") and "crs: registered as 'compute'" in lines["compute"]
        assert f"must point at the CRS's address {crs}" in plain.stderr and "Traceback" not in plain.stderr

        registry = registry_pb2_grpc.ManagerRegistryStub(control.channel(plain_channel(crs), token))

        def fpga_up() -> bool | None:
            m = [m for m in registry.ListManagers(registry_pb2.ListManagersRequest()).managers if m.name == "fpga"]
            return m[0].up if m else None

        # A live registration of its name at another address (the address it advertises, say): a note, no failure.
        other = unused_address()
        member = Membership(crs, "fpga", other, ["vfpga"], heartbeat_interval_s=0.2, control_token=token)
        member.start()
        try:
            eventually(lambda: fpga_up() is True, what="the stand-in's registration")
            r = _status(state, "--json")
            status = json.loads(r.stdout)
            fpga = irms(status)["fpga"]
            assert (fpga["crs_registration"], fpga["crs_registered_address"], fpga["crs_up"]) == (
                "registered_elsewhere", other, True)
            # Nothing serves at that address, so the CRS cannot follow the registration's capacity: that is a
            # problem (ListManagers' follow_error), the only one, and in place of the note on the address.
            (problem,) = status["problems"]
            assert r.returncode == 1 and f"as 'fpga' at {other}, but the CRS cannot follow its capacity " \
                "(UNAVAILABLE" in problem and status["warnings"] == []
        finally:
            member.stop()
        # Its heartbeats stop: a registration at another address, marked down, is not the FPGA IRM's.
        eventually(lambda: fpga_up() is False, what="the stand-in marked down")
        r = _status(state, "--json")
        status = json.loads(r.stdout)
        fpga = irms(status)["fpga"]
        assert (fpga["crs_registration"], fpga["crs_up"]) == ("registered_elsewhere", False)
        assert r.returncode == 1 and "marked down" in status["problems"][0]

        # Registered at its own address, but no heartbeats from it reach this CRS: marked down.
        registry.RegisterManager(registry_pb2.RegisterManagerRequest(name="fpga", address=addrs["fpga"],
                                                                     resource_types=["vfpga"]), timeout=10)
        eventually(lambda: fpga_up() is False, what="the FPGA IRM's registration marked down")
        r = _status(state, "--json")
        status = json.loads(r.stdout)
        assert irms(status)["fpga"]["crs_registration"] == "registered_down" and r.returncode == 1
        (problem,) = status["problems"]
        assert "marked down" in problem and f"must point at the CRS's address {crs}" in problem
        plain = _status(state)
        assert "crs: registered as 'fpga', marked DOWN" in plain.stdout and plain.returncode == 1

        # The CRS gone: said so, no traceback, registrations unknown.
        next(p for p in procs if p.name == "crs").stop()
        r = _status(state, "--json")
        status = json.loads(r.stdout)
        assert r.returncode == 1 and status["crs_registry"]["reachable"] is False
        assert {s["crs_registration"] for s in irms(status).values()} == {"unknown"}
        assert status["problems"][0].startswith(f"crs at {crs} does not answer (UNAVAILABLE): `harness up` restarts")
        assert status["problems"][1:] == [f"the CRS at {crs} is unreachable (UNAVAILABLE): cannot tell whether the "
                                          "IRMs (compute, fpga) are registered with it"]
        plain = _status(state)
        assert plain.returncode == 1 and f"the CRS at {crs} is unreachable" in plain.stderr
        assert "Traceback" not in plain.stderr and "crs: unknown" in plain.stdout
    finally:
        suite_mod.stop(procs)

def test_run_in_vm_confined_and_measured(running):
    crs = running["crs"]
    res = crs.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="run-1", groups=[
        vm_group("master", 1, 1, 0.5), vm_group("small", 1, 1, 0.25)]))
    vms = {g.name: g.resources[0] for g in res.groups}
    try:
        # Busy for 1.6 s; it prints the share of a CPU it got (a loaded machine may give it half or less).
        busy = ("import os, time\n"
                "t = time.monotonic()\n"
                "while time.monotonic() - t < 1.6: pass\n"
                "share = time.process_time() / (time.monotonic() - t) * 100\n"
                "print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], os.environ['GREETING'], share)")
        r = execute(vms["master"], [sys.executable, "-c", busy], env={"GREETING": "hello"})
        assert r["exited"].exit_code == 0, r["stderr"]
        cpus, threads, greeting, share = r["stdout"].decode().rsplit(" ", 3)
        assert len(json.loads(cpus)) == 1 and threads == "1" and greeting == "hello"
        assert list(r["started"].cpus) == json.loads(cpus)
        assert len(r["samples"]) >= 2  # every 0.5 s
        # The samples see at least half the CPU it says it got.
        assert max(s.cpu_percent for s in r["samples"]) > 0.5 * float(share) > 0

        # Needs ~600 MB in a 256 MB VM: it really fails, and memory shows at the limit.
        hog = ("import numpy as np\nblocks = []\n"
               "for i in range(40):\n    blocks.append(np.ones(16 * 1024 * 1024 // 8))\n")
        r = execute(vms["small"], [sys.executable, "-c", hog])
        assert r["exited"].exit_code != 0
        assert "memory limit exceeded" in r["exited"].reason

        metrics = crs.GetMetrics(irm_pb2.GetMetricsRequest(tenant=TENANT, reservation_id=res.id))
        series = {(s.resource_id, s.name): [x.value for x in s.samples] for s in metrics.series}
        assert max(series[(vms["master"].id, "cpu_percent")]) > 0.5 * float(share)
        assert (vms["small"].id, "memory_percent") in series

        with pytest.raises(grpc.RpcError) as e:
            execute(vms["master"], ["true"], tenant="intruder")
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=TENANT, reservation_id=res.id))


def test_release_kills_running_work_and_closes_the_vm(running):
    crs = running["crs"]
    res = crs.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="kill-1", groups=[vm_group("g", 1, 1, 0.5)]))
    vm = res.groups[0].resources[0]
    started = threading.Event()
    result: dict = {}

    def run() -> None:
        stub = agent_pb2_grpc.ExecutionAgentStub(plain_channel(vm.address))
        for ev in stub.Execute(agent_pb2.ExecuteRequest(tenant=TENANT, vm_id=vm.id,
                                                        argv=["sleep", "120"]), timeout=60):
            if ev.WhichOneof("event") == "started":
                started.set()
            if ev.WhichOneof("event") == "exited":
                result["exited"] = ev.exited

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30)
    crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=TENANT, reservation_id=res.id))
    t.join(30)
    assert not t.is_alive() and result["exited"].exit_code != 0  # killed, long before 120 s
    with pytest.raises(grpc.RpcError) as e:
        execute(vm, ["true"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_harness_up_runs_in_foreground_and_stops_cleanly_on_ctrl_c(tmp_path):
    proc = _up(tmp_path)
    pids = [p for p in _children(proc.pid)]
    assert len(pids) == len(suite_mod.plan(str(tmp_path)))
    r = subprocess.run([sys.executable, "-m", "services.cli", "status", "--json", "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["ok"] is True
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert all(not _alive(p) for p in pids)
    assert not (tmp_path / "suite.json").exists()


def _up(state) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """`harness up --auto-ports` from `state`, once it is up: started again if a port it picked was taken before its
    service listened there (it stops the suite and exits saying so)."""

    def once() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--auto-ports", "--state-dir",
                                 str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = []
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "Harness is up" in line:
                return proc
        proc.wait(60)
        if PORT_TAKEN in "".join(lines):
            raise LaunchError("".join(lines))
        raise AssertionError("".join(lines))

    return until_ports_hold(once, "harness up")


def test_a_second_suite_on_one_state_directory_is_refused_and_a_closed_terminal_stops_the_first(tmp_path):
    first = _up(tmp_path)
    pids = _children(first.pid)
    try:
        addresses = (tmp_path / "suite.json").read_text()
        second = subprocess.run([sys.executable, "-m", "services.cli", "up", "--auto-ports", "--state-dir",
                                 str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and f"already running from {tmp_path}" in " ".join(second.stderr.split())
        assert (tmp_path / "suite.json").read_text() == addresses      # the first suite's, untouched
        first.send_signal(signal.SIGHUP)
        assert first.wait(60) == 0
        assert pids and all(not _alive(p) for p in pids)
    finally:
        _reap(first, pids)


def test_sigterm_stops_the_demo_and_its_suite(tmp_path):
    def once() -> tuple[subprocess.Popen, list[str]]:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "demo"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "started" in line and " am " in line:        # the last service: the whole suite runs
                return proc, lines
        # It ended before: again if a port the demo picked was taken before its service listened there.
        proc.wait(60)
        if PORT_TAKEN in "".join(lines):
            raise LaunchError("".join(lines))
        return proc, lines

    proc, lines = until_ports_hold(once, "harness demo")
    pids = _children(proc.pid)
    try:
        state = next(x.split("state in ", 1)[1].split(")")[0] for x in lines if "state in " in x)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 130, "".join(lines) + out
        assert pids and all(not _alive(p) for p in pids)
        assert not os.path.exists(state)
    finally:
        _reap(proc, pids)


def _reap(proc: subprocess.Popen, pids: list[int]) -> None:
    """A failed test leaves no suite behind."""
    import psutil

    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def test_demo_runs_end_to_end():
    def once() -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "services.cli", "demo"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "COLUMNS": "160"})
        if r.returncode != 0 and PORT_TAKEN in r.stdout + r.stderr:   # a port it picked taken meanwhile: again
            raise LaunchError(r.stdout + r.stderr)
        return r

    r = until_ports_hold(once, "harness demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Demo complete" in r.stdout
    assert "memory limit exceeded" in r.stdout


def _children(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children()]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cli_tenant_verbs_against_the_suite(running):
    def harness(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.cli", *argv, "--crs", running["addrs"]["crs"],
                               "--tenant", "cli-user"], capture_output=True, text=True, timeout=60)

    quote = harness("reserve", "--quote", "--group", "name=web,count=2,cores=1,memory_gb=1")
    assert quote.returncode == 0 and json.loads(quote.stdout)["price_per_minute"] > 0
    made = harness("reserve", "--group", "name=web,count=2,cores=1,memory_gb=1",
                   "--constraint", "different_host(web, web)", "--request-id", "cli-1")
    res = json.loads(made.stdout)
    assert made.returncode == 0 and res["state"] == "STATE_ACTIVE"
    assert len({r["physical_id"] for g in res["groups"] for r in g["resources"]}) == 2
    listed = json.loads(harness("reservations").stdout)
    assert [r["id"] for r in listed["reservations"]] == [res["id"]]
    # Options after the reservation, and the command's own `--` and flags kept as given.
    vm = res["groups"][0]["resources"][1]["id"]
    ran = subprocess.run([sys.executable, "-m", "services.cli", "run", res["id"], "--vm", vm, "--env", "GREETING=hi",
                          "--crs", running["addrs"]["crs"], "--tenant", "cli-user", "--",
                          sys.executable, "-c", "import os, sys; print(os.environ['GREETING'], sys.argv[1:])",
                          "--", "--vm"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "hi ['--', '--vm']" in ran.stdout
    assert json.loads(harness("release", res["id"]).stdout)["state"] == "STATE_RELEASED"
    bad = harness("reserve", "--group", "name=web,cores=0,memory_gb=1")
    assert bad.returncode == 1 and "groups[0].attributes[cores]" in bad.stderr


def test_harness_run_passes_the_exit_status_on_and_stops_the_command_when_it_is_stopped(running, tmp_path):
    crs = running["crs"]
    res = crs.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="run-cli-stop", groups=[
        vm_group("master", 1, 1, 0.5)]))

    def harness_run(*argv: str, **kw) -> subprocess.Popen:  # noqa: ANN003
        return subprocess.Popen([sys.executable, "-m", "services.cli", "run", res.id, "--crs", running["addrs"]["crs"],
                                 "--tenant", TENANT, "--", *argv], stderr=subprocess.PIPE, text=True, **kw)
    try:
        p = harness_run("/bin/sh", "-c", "exit 3", stdout=subprocess.DEVNULL)
        assert p.wait(60) == 3                               # the command's status, not just "failed"
        p = harness_run("/bin/sh", "-c", "kill -TERM $$", stdout=subprocess.DEVNULL)
        assert p.wait(60) == 128 + signal.SIGTERM            # killed by a signal: as a shell reports it

        # Ctrl-C: the remote command is stopped too (it would otherwise run on, with no limit).
        pid_file = tmp_path / "pid"
        p = harness_run("/bin/sh", "-c", f"echo $$ > {pid_file}; exec sleep 300", stdout=subprocess.DEVNULL)
        pid = int(eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30,
                             what="the command to run"))
        p.send_signal(signal.SIGINT)
        status = p.wait(30)
        err = p.stderr.read()
        assert status == 130, err
        assert "stopped execution" in err and "Traceback" not in err, err
        eventually(lambda: not psutil.pid_exists(pid), what=f"the remote command {pid} to be gone")

        # A reader that goes away (`harness run ... | head -1`): the command stops, no traceback.
        p = harness_run(sys.executable, "-c", "import time\nwhile True: print('y' * 1000, flush=True)",
                        stdout=subprocess.PIPE)
        assert p.stdout.readline().startswith("y")
        p.stdout.close()
        assert p.wait(30) == 128 + signal.SIGPIPE
        err = p.stderr.read()
        assert "stopped execution" in err and "Traceback" not in err, err

        # The same with stderr into that pipe too (`2>&1 | head -1`): nothing left to report to, the same status.
        pid_file = tmp_path / "pid2"
        p = subprocess.Popen([sys.executable, "-m", "services.cli", "run", res.id, "--crs", running["addrs"]["crs"],
                              "--tenant", TENANT, "--", "/bin/sh", "-c",
                              f"echo $$ > {pid_file}; exec yes {'y' * 100}"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout.readline().startswith("y")
        pid = int(eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30,
                             what="the command to run"))
        p.stdout.close()
        assert p.wait(30) == 128 + signal.SIGPIPE
        eventually(lambda: not psutil.pid_exists(pid), what=f"the remote command {pid} to be gone")
    finally:
        crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=TENANT, reservation_id=res.id))


def test_cli_jobs_verbs_against_the_suites_fpga_irm(running):
    def harness(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.cli", "jobs", *argv, "--state-dir", running["state"],
                               "--tenant", "cli-jobs"], capture_output=True, text=True, timeout=60)

    made = harness("register", "--design", "sleep", "--deadline", "120", "--size", "5", "--request-id", "cli-j1")
    assert made.returncode == 0, made.stderr
    job = json.loads(made.stdout)
    assert job["state"] == "STATE_ACTIVE" and job["policy"] == "edf" and job["devices"] >= 1
    again = harness("register", "--design", "sleep", "--deadline", "120", "--size", "5", "--request-id", "cli-j1")
    assert json.loads(again.stdout)["id"] == job["id"]                  # the same request: the same job
    assert [j["id"] for j in json.loads(harness("list").stdout)["jobs"]] == [job["id"]]
    # Reporting the job's whole size completes it: it retires itself and leaves the active list; a watch on it
    # prints its state now, then its changes, and ends with its retirement.
    watch = subprocess.Popen([sys.executable, "-m", "services.cli", "jobs", "watch", job["id"], "--state-dir",
                              running["state"], "--tenant", "cli-jobs"], stdout=subprocess.PIPE, text=True)
    assert json.loads(watch.stdout.readline())["state"] == "STATE_ACTIVE"
    reported = json.loads(harness("report", job["id"], "5").stdout)
    out, _ = watch.communicate(timeout=30)
    assert watch.returncode == 0 and json.loads(out.splitlines()[-1])["state"] == "STATE_RETIRED"
    assert reported["state"] == "STATE_RETIRED" and int(reported["completed_actions"]) == 5
    assert json.loads(harness("get", job["id"]).stdout)["allocations"]
    assert json.loads(harness("list").stdout)["jobs"] == []      # every field printed, an empty list too
    assert [j["id"] for j in json.loads(harness("list", "--all").stdout)["jobs"]] == [job["id"]]
    # Bad input: the field to fix, on stderr, and a failing exit code.
    bad = harness("register", "--design", "sleep", "--deadline", "-1", "--size", "5")
    assert bad.returncode == 1 and "deadline.deadline_s" in bad.stderr
    other = harness("get", "job-0000")
    assert other.returncode == 1 and "NOT_FOUND" in other.stderr
    assert harness("register", "--design", "sleep").returncode == 2     # no goal given
    huge = harness("register", "--design", "sleep", "--deadline", "9", "--size", "5", "--min", "3000000000")
    assert huge.returncode == 2 and "--min: 3000000000 is outside" in huge.stderr


def test_a_config_files_settings_beat_the_suites_wiring(tmp_path):
    # The suite wires its services (names, addresses) with --set; a config file that sets one of them wins.
    from harness.v1 import fpga_pb2, fpga_pb2_grpc

    conf = tmp_path / "harness.yaml"
    conf.write_text("fpga-server:\n  name: fpga-7\n  devices: 3\n")
    procs = until_ports_hold(lambda: suite_mod.start(str(tmp_path / "state"), auto_ports=True,
                                                     config_file=str(conf)), "the suite")
    try:
        orch = next(p for p in procs if p.name == "fpga")
        (info,) = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address)).ListDevices(
            fpga_pb2.ListDevicesRequest(tenant="t"), timeout=10).servers
        assert (info.name, len(info.devices)) == ("fpga-7", 3)
        # The suite's FPGA-server takes control calls from its Orchestrator only (a token made for this suite).
        server = next(p for p in procs if p.name == "fpga-server")
        with pytest.raises(grpc.RpcError) as e:
            fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address)).GetServer(
                fpga_pb2.GetServerRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # So does its CRS take registrations and heartbeats from its IRMs only: they are registered (they send
        # the token), a caller without it adds no manager and keeps none up.
        from harness.v1 import registry_pb2, registry_pb2_grpc

        crs = next(p for p in procs if p.name == "crs")
        reg = registry_pb2_grpc.ManagerRegistryStub(plain_channel(crs.address))
        eventually(lambda: {m.name for m in reg.ListManagers(registry_pb2.ListManagersRequest(), timeout=10).managers
                            if m.up} == {"compute", "fpga"}, what="the suite's IRMs registered with its CRS")
        for call, request in ((reg.RegisterManager, registry_pb2.RegisterManagerRequest(
                name="intruder", address=server.address, resource_types=["vm"])),
                              (reg.Heartbeat, registry_pb2.HeartbeatRequest(name="fpga", address=orch.address))):
            with pytest.raises(grpc.RpcError) as e:
                call(request, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "the CRS" in e.value.details() and "control token" in e.value.details()
        assert "intruder" not in {m.name for m in reg.ListManagers(registry_pb2.ListManagersRequest(),
                                                                    timeout=10).managers}
        assert suite_mod.control_token(str(tmp_path / "state")) != ""        # the operator's CLI may use it
    finally:
        suite_mod.stop(procs)
    assert not suite_mod.control_token_file(str(tmp_path / "state")).exists()     # no suite runs: no token left
