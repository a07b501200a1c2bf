"""`harness serve` that cannot start says why and exits non-zero (no traceback): a taken port, a database
that does not answer, a misnamed config section, an unreadable config or inventory, a bad address or database
URL; and services whose control tokens disagree say so instead of "unreachable, retry later". Real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from harness.v1 import agent_pb2, agent_pb2_grpc
from services.tls import plain_channel


def serve(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "serve", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


@contextmanager
def serving(service: str, *args: str, cwd: Path, address: str = "127.0.0.1:0") -> Iterator[int]:
    """`harness serve service` in the background; yields its port once it serves, stops it afterwards."""
    port_file = cwd / f"{service}.port"
    with open(cwd / f"{service}.log", "w") as log:   # a file, not a pipe nobody drains
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", service, "--address", address,
                                 "--port-file", str(port_file), *args], stdout=log, stderr=log, cwd=cwd)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, f"{service} exited: {(cwd / f'{service}.log').read_text()}"
            assert time.monotonic() < deadline, f"{service} did not start"
            time.sleep(0.05)
        yield int(port_file.read_text())
    finally:
        proc.terminate()
        proc.wait(10)


def one_line_error(out: subprocess.CompletedProcess[str], service: str) -> str:
    """The message of a refused start: exit status 2, one line on stderr naming the service, no traceback."""
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"harness serve {service}: ")
    return out.stderr


def test_a_taken_port_and_an_absent_database_are_messages_not_tracebacks(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = serve("crs", "--address", f"127.0.0.1:{port}", "--set", f"state_dir={tmp_path}", cwd=str(tmp_path))
    assert out.returncode == 2 and "could not listen on 127.0.0.1" in out.stderr and "Traceback" not in out.stderr
    out = serve("crs", "--address", "127.0.0.1:0", "--set",
                "database=postgresql+psycopg://harness:harness@127.0.0.1:1/harness", cwd=str(tmp_path))
    assert out.returncode == 3 and "the database did not answer" in out.stderr and "Traceback" not in out.stderr


def test_a_config_section_nobody_reads_is_an_error(tmp_path):
    conf = tmp_path / "harness.yaml"
    conf.write_text("fpga-servr:\n  devices: 2\n")
    out = serve("fpga-server", "--address", "127.0.0.1:0", "--config", str(conf), cwd=str(tmp_path))
    assert out.returncode == 2 and "unknown section(s) ['fpga-servr']" in out.stderr


def test_a_config_file_without_the_services_section_is_an_error_unless_a_suite_shares_it(tmp_path):
    # The operators' review: `harness serve compute --config crs-a.yaml` served on every default -- its own SQLite
    # file, no control token, no tenants file, no CRS -- without a word.
    conf = tmp_path / "crs-a.yaml"
    conf.write_text("crs:\n  name: crs-a\n")
    message = one_line_error(serve("compute", "--set", f"state_dir={tmp_path}", "--config", str(conf),
                                   cwd=str(tmp_path)), "compute")
    assert f"{conf} has no 'compute' section (it has: crs): give compute its own section there" in message
    with serving("compute", "--set", f"state_dir={tmp_path}", "--config", str(conf), "--shared-config",
                 cwd=tmp_path) as port:
        assert port > 0                 # `harness up`'s file is every service's: one may have no section


@pytest.mark.parametrize(("args", "fragments"), [
    (["--config", "malformed.yaml"], ["config file malformed.yaml is not valid YAML: line 3"]),
    (["--config", "nope.yaml"], ["cannot read config file nope.yaml: No such file or directory"]),
    (["--set", "state_dir"], ["--set 'state_dir': expected field=value"]),
    (["--set", "database=postgres://harness:s3cret@db/harness"],
     ["invalid database URL 'postgres://harness:***@db/harness'", "postgresql+psycopg://"]),
    (["--set", "database=foo://x"], ["invalid database URL 'foo://x'"]),
    (["--set", "database=notaurl"], ["invalid database URL 'notaurl'", "sqlite:///path"]),
    (["--address", "127.0.0.1:99999"], ["address '127.0.0.1:99999': expected HOST:PORT with PORT in 0..65535"]),
    (["--address", "localhost"], ["address 'localhost': expected HOST:PORT"]),
    (["--set", "address=::1:50051"], ["address '::1:50051'", "[::1]:50051"]),     # IPv6 wants brackets
    (["--set", "state_dir=/proc/x/y"], ["state_dir '/proc/x/y': cannot make it"]),  # the setting named
])
def test_bad_settings_are_one_line_and_status_2(tmp_path, args, fragments):
    (tmp_path / "malformed.yaml").write_text("crs:\n  filters: [traits,\n")
    out = serve("crs", "--set", f"state_dir={tmp_path}", *args, cwd=str(tmp_path))
    message = one_line_error(out, "crs")
    assert all(f in message for f in fragments), message
    assert "s3cret" not in message


def test_a_config_file_named_by_the_environment_that_is_missing_is_a_message(tmp_path):
    out = subprocess.run([sys.executable, "-m", "services.cli", "serve", "crs"], capture_output=True, text=True,
                         timeout=60, cwd=str(tmp_path), env={**os.environ, "HARNESS_CONFIG": "nope.yaml"})
    assert "cannot read HARNESS_CONFIG file nope.yaml: No such file or directory" in one_line_error(out, "crs")


@pytest.mark.parametrize(("text", "fragment"), [
    ("hosts: [\n", "inventory hosts.yaml is not valid YAML: line 2"),
    ("generate:\n  - 5\n", "inventory hosts.yaml: generate[0] must be a mapping"),
])
def test_a_bad_inventory_is_a_message(tmp_path, text, fragment):
    (tmp_path / "hosts.yaml").write_text(text)
    out = serve("compute", "--address", "127.0.0.1:0", "--set", f"state_dir={tmp_path}", "--set",
                "inventory=hosts.yaml", cwd=str(tmp_path))
    assert fragment in one_line_error(out, "compute")


def test_a_bracketed_ipv6_address_still_serves(tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with serving("fpga-server", cwd=tmp_path, address="[::1]:0") as port:
        socket.create_connection(("::1", port), timeout=5).close()


def test_an_agent_whose_control_token_the_compute_irm_rejects_says_so_not_retry_later(tmp_path):
    with serving("compute", "--set", f"state_dir={tmp_path}", "--set", "control_token=irm-secret",
                 cwd=tmp_path) as compute, \
         serving("agent", "--set", f"compute_address=127.0.0.1:{compute}", "--set", "control_token=agent-secret",
                 "--set", f"work_dir={tmp_path / 'agent'}", cwd=tmp_path) as agent, \
         plain_channel(f"127.0.0.1:{agent}") as channel:
        call = agent_pb2_grpc.ExecutionAgentStub(channel).Execute(
            agent_pb2.ExecuteRequest(tenant="alice", vm_id="vm-1", argv=["true"]), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            list(call)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION      # retrying cannot help: not UNAVAILABLE
    assert "control_token differs from the compute IRM's" in e.value.details()
    # The operators' review: only the tenant was told; the agent's log says it too, with the fix.
    assert "the compute IRM rejects this agent's control token" in (tmp_path / "agent.log").read_text()


def test_an_agent_pointed_at_another_service_than_its_compute_irm_says_so(tmp_path):
    # The operators' review: compute_address at a CRS gave the tenant "UNAVAILABLE ... UNIMPLEMENTED: Method not
    # found!" and a hint that the agent may be restarting; the agent's log was silent.
    with serving("crs", "--set", f"state_dir={tmp_path}", cwd=tmp_path) as crs, \
         serving("agent", "--set", f"compute_address=127.0.0.1:{crs}", "--set", f"work_dir={tmp_path / 'agent'}",
                 cwd=tmp_path) as agent, \
         plain_channel(f"127.0.0.1:{agent}") as channel:
        call = agent_pb2_grpc.ExecutionAgentStub(channel).Execute(
            agent_pb2.ExecuteRequest(tenant="alice", vm_id="vm-1", argv=["true"]), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            list(call)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"compute_address 127.0.0.1:{crs} is no compute IRM" in e.value.details()
    assert "is no compute IRM (it has no ComputeControl)" in (tmp_path / "agent.log").read_text()


def test_an_orchestrator_whose_control_token_an_fpga_server_rejects_says_so(tmp_path):
    with serving("fpga-server", "--set", "control_token=server-secret", cwd=tmp_path) as fpga_server:
        out = serve("fpga", "--address", "127.0.0.1:0", "--set", f"state_dir={tmp_path}", "--set",
                    f"servers=127.0.0.1:{fpga_server}", "--set", "control_token=other", cwd=str(tmp_path))
    message = one_line_error(out, "fpga")
    assert f"control token rejected by FPGA-server at 127.0.0.1:{fpga_server}: set control_token to the " \
           "FPGA-server's" in message
