"""`harness serve` that cannot start says why and exits non-zero (no traceback): a taken port, a database
that does not answer, a misnamed config section. Real processes."""

from __future__ import annotations

import socket
import subprocess
import sys


def serve(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "serve", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


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
