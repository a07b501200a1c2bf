"""TLS across the suite's processes: a CRS, a compute IRM and its agent serving TLS only, each trusting one CA.
The IRM registers and streams its capacity to the CRS, the agent confirms VMs with the IRM, and the CLI reserves
and runs through them, all over TLS; a client without the CA gets nowhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services import tls
from tests.conftest import Suite, eventually


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("tls")
    files = tls.generate(str(tmp / "tls"), ["127.0.0.1"])
    secured = {"tls_cert_file": files["cert"], "tls_key_file": files["key"], "tls_ca_file": files["ca"]}
    suite = Suite(str(tmp))
    try:
        crs = suite.start("crs", heartbeat_interval_s=0.3, **secured)
        # The agent on a port chosen for it before the compute IRM starts (each is told the other's address).
        suite.compute_and_agent(compute=dict(crs_address=crs.address, heartbeat_interval_s=0.3, **secured),
                                agent=secured)
        yield {"crs": crs.address, "ca": files["ca"], "tmp": tmp}
    finally:
        suite.stop_all()


def _harness(*argv: str, ca: str | None, state_dir: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != tls.ENV_CA}
    if ca is not None:
        env[tls.ENV_CA] = ca
    return subprocess.run([sys.executable, "-m", "services.cli", *argv, "--state-dir", state_dir], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_reserves_and_runs_over_tls_and_a_client_without_the_ca_gets_nowhere(cloud) -> None:
    state = str(cloud["tmp"] / "cli")
    # The compute IRM's hosts reach the CRS over TLS (registration, then its capacity stream).
    eventually(lambda: "r1-h1" in _harness("discover", "--crs", cloud["crs"], ca=cloud["ca"], state_dir=state).stdout,
               timeout=30, what="the compute IRM's hosts in the CRS")
    reserved = _harness("reserve", "--crs", cloud["crs"], "--group", "name=g,cores=1,memory_gb=0.25", ca=cloud["ca"],
                        state_dir=state)
    assert reserved.returncode == 0, reserved.stderr
    res = json.loads(reserved.stdout)["id"]
    # harness run: the CLI to the CRS and to the agent, the agent to the compute IRM (GetVm): TLS each.
    ran = _harness("run", res, "--crs", cloud["crs"], "--", "/bin/echo", "over tls", ca=cloud["ca"], state_dir=state)
    assert ran.returncode == 0, ran.stderr
    assert "over tls" in ran.stdout
    # A program the agent runs is told the CA, so that our client libraries in it (VirtualFpga.attach) speak TLS.
    told = _harness("run", res, "--crs", cloud["crs"], "--", "/bin/sh", "-c", "echo CA=$HARNESS_TLS_CA_FILE",
                    ca=cloud["ca"], state_dir=state)
    assert f"CA={cloud['ca']}" in told.stdout, told.stderr
    plain = _harness("reservations", "--crs", cloud["crs"], ca=None, state_dir=state)
    assert plain.returncode == 1
    assert "UNAVAILABLE" in plain.stderr
    assert _harness("release", res, "--crs", cloud["crs"], ca=cloud["ca"], state_dir=state).returncode == 0


def test_a_cli_given_a_ca_it_cannot_use_says_so_in_one_line(cloud) -> None:
    (cloud["tmp"] / "not-a-ca.pem").write_text("hello")
    done = _harness("reservations", "--crs", cloud["crs"], ca=str(cloud["tmp"] / "not-a-ca.pem"),
                    state_dir=str(cloud["tmp"] / "cli"))
    assert done.returncode == 2
    # Verbs that connect to nothing do not care (the CA may be the file `harness tls generate` is about to make).
    made = subprocess.run([sys.executable, "-m", "services.cli", "tls", "generate", "--dir",
                           str(cloud["tmp"] / "made"), "--host", "crs"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, tls.ENV_CA: str(cloud["tmp"] / "made" / "services" / "ca.pem")})
    assert made.returncode == 0, made.stderr
    assert done.stderr.strip().splitlines() == [
        f"harness: HARNESS_TLS_CA_FILE {cloud['tmp'] / 'not-a-ca.pem'}: not a PEM CA certificate (no -----BEGIN line)"]
