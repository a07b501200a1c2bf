"""`harness up --auto-ports` keeps its ports across restarts of one state directory where it can."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from services import suite


def test_auto_ports_are_the_last_starts_where_still_free(tmp_path):
    first = {p.name: p.address for p in suite.plan(str(tmp_path), auto_ports=True)}
    # The databases remember these (a VM's agent address, an FPGA group's Orchestrator): a restart keeps them.
    assert {p.name: p.address for p in suite.plan(str(tmp_path), auto_ports=True)} == first
    agent_port = int(first["agent"].rsplit(":", 1)[1])
    with socket.socket() as taken:            # someone else took the agent's port meanwhile
        taken.bind(("127.0.0.1", agent_port))
        again = {p.name: p.address for p in suite.plan(str(tmp_path), auto_ports=True)}
    assert again["agent"] != first["agent"] and {k: v for k, v in again.items() if k != "agent"} == {
        k: v for k, v in first.items() if k != "agent"}
    # Another state directory is another suite: its own ports.
    assert {p.name: p.address for p in suite.plan(str(tmp_path / "other"), auto_ports=True)} != first


def test_a_port_whose_connections_linger_after_a_stop_is_still_the_suites(tmp_path):
    agent_port = int({p.name: p.address for p in suite.plan(str(tmp_path), auto_ports=True)}["agent"]
                     .rsplit(":", 1)[1])
    # The agent served a connection and stopped first: its side of the connection lingers in TIME_WAIT.
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as gRPC binds
        listener.bind(("127.0.0.1", agent_port))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", agent_port))
        served, _ = listener.accept()
        served.close()                          # the server closes first
        client.recv(1)                          # the client sees the end, then closes
        client.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", agent_port))   # what a plain bind says now
    # A restart a moment later: gRPC can listen there again, so the agent keeps its address.
    again = {p.name: p.address for p in suite.plan(str(tmp_path), auto_ports=True)}
    assert again["agent"] == f"127.0.0.1:{agent_port}"


def test_what_a_config_file_sets_beats_the_suites_wiring(tmp_path):
    conf = tmp_path / "harness.yaml"
    conf.write_text("compute:\n  crs_address: '10.0.0.1:50051,10.0.0.2:50051'\nfpga-server: {name: fpga-7}\n")
    chosen = suite._file_settings(str(conf))
    assert chosen == {"compute": {"crs_address"}, "fpga_server": {"name"}}
    assert suite._file_settings(None) == {}


def test_what_the_environment_sets_beats_the_suites_wiring_too(tmp_path):
    conf = tmp_path / "harness.yaml"
    conf.write_text("agent: {work_dir: /x}\n")
    env = {"HARNESS_CONFIG": str(conf), "HARNESS_COMPUTE_CRS_ADDRESS": "10.0.0.1:50051", "HOME": "/h"}
    assert suite._file_settings(None, env) == {"agent": {"work_dir"}, "compute": {"crs_address"}}


def test_one_suite_per_state_directory_while_any_of_its_services_lives(tmp_path):
    fd = suite._lock(str(tmp_path))
    with pytest.raises(suite.SuiteRunning, match=rf"already running from {tmp_path} \(started by pid \d+\)"):
        suite._lock(str(tmp_path))
    # A service inherits the lock: with `harness up` gone (killed), a second suite is still refused.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             pass_fds=(fd,))
    os.close(fd)
    with pytest.raises(suite.SuiteRunning):
        suite._lock(str(tmp_path))
    child.communicate(b"")
    os.close(suite._lock(str(tmp_path)))      # the last holder is gone: free again


def test_auto_ports_are_one_per_service_even_where_the_last_start_had_one_twice(tmp_path):
    # Ports chosen one at a time (bound and let go) could come back twice: two services were planned on one
    # port, and every retry kept it (seen in CI: the Orchestrator on the FPGA-server's port, three times).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    suite.ports_file(str(tmp_path)).write_text(json.dumps({name: port for name in suite.DEFAULT_PORTS}))
    for _ in range(3):
        ports = [p.address for p in suite.plan(str(tmp_path), auto_ports=True)]
        assert len(set(ports)) == len(ports) == len(suite.DEFAULT_PORTS), ports
    for _ in range(20):      # and afresh
        ports = [p.address for p in suite.plan(str(tmp_path / f"fresh{_}"), auto_ports=True)]
        assert len(set(ports)) == len(ports), ports
