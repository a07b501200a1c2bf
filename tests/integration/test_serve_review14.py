"""`harness serve` refusing what it cannot use, as an operator meets it (real processes): a database this
configuration cannot use is exit status 2 with one line naming the file or URL (never the password), as any setting
to fix; one that does not answer stays 3 (a later start may succeed); a setting that would break the service is
exit status 2 before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url


def serve(service: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`harness serve SERVICE` run to its end: a refused start ends at once (a service that serves would meet the
    timeout, and the test fail)."""
    return subprocess.run([sys.executable, "-m", "services.cli", "serve", service, "--address", "127.0.0.1:0",
                           *args], capture_output=True, text=True, timeout=60, cwd=str(cwd))


def refused(out: subprocess.CompletedProcess[str], service: str, status: int = 2) -> str:
    """The one line of a refused start (no traceback, no log lines), exit `status`."""
    assert out.returncode == status, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"harness serve {service}: ")
    return out.stderr.strip()


def _can_create_in(directory: Path) -> bool:
    try:
        (directory / f".probe-{uuid.uuid4().hex}").touch()
    except OSError:
        return False
    return True


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this user cannot create files in: one made read-only, or, for root (whom permissions do not
    stop), a sysfs directory, where nobody can."""
    made = tmp_path / "state"
    made.mkdir()
    made.chmod(0o555)
    try:
        directory = made if not _can_create_in(made) else Path("/sys/kernel")
        assert directory.is_dir() and not _can_create_in(directory), "no read-only directory to test with"
        yield directory
    finally:
        made.chmod(0o755)


def test_a_read_only_state_dir_is_status_2_naming_the_file_and_why(tmp_path: Path, read_only_dir: Path) -> None:
    out = serve("crs", "--set", f"state_dir={read_only_dir}", cwd=tmp_path)
    message = refused(out, "crs")
    assert f"the SQLite database {read_only_dir / 'crs.db'} cannot be used: unable to open database file" in message
    assert f"cannot create files in {read_only_dir}:" in message and message.endswith("; fix state_dir")


def test_a_database_file_that_is_no_database_is_status_2(tmp_path: Path) -> None:
    (tmp_path / "crs.db").write_bytes(b"not a database " * 100)
    out = serve("crs", "--set", f"state_dir={tmp_path}", cwd=tmp_path)
    assert f"the SQLite database {tmp_path / 'crs.db'} cannot be used: file is not a database" in refused(out, "crs")


def test_a_wrong_postgresql_password_is_status_2_without_the_password(tmp_path: Path, postgres_url: str) -> None:
    url = make_url(postgres_url).set(password="wrong-Pa55word-xyz")
    out = serve("crs", "--set", f"database={url.render_as_string(hide_password=False)}", cwd=tmp_path)
    message = refused(out, "crs")
    assert f"the database {url.render_as_string(hide_password=True)} refused:" in message
    assert "password authentication failed" in message and message.endswith("; fix database")
    assert "wrong-Pa55word-xyz" not in out.stderr + out.stdout


def test_a_missing_postgresql_database_is_status_2(tmp_path: Path, postgres_url: str) -> None:
    name = f"harness_missing_{uuid.uuid4().hex[:12]}"
    url = make_url(postgres_url).set(database=name)
    out = serve("fpga", "--set", f"database={url.render_as_string(hide_password=False)}", cwd=tmp_path)
    message = refused(out, "fpga")
    assert f"the database {url.render_as_string(hide_password=True)} refused:" in message
    assert f'database "{name}" does not exist' in message
    password = make_url(postgres_url).password
    assert not password or f":{password}@" not in out.stderr


def test_a_database_that_does_not_answer_stays_status_3(tmp_path: Path) -> None:
    out = serve("crs", "--set", "database=postgresql+psycopg://harness:s3cret-pw@127.0.0.1:1/harness", cwd=tmp_path)
    message = refused(out, "crs", status=3)       # one line: libpq's hint on a line of its own is joined
    assert "the database did not answer:" in message and "Connection refused" in message
    assert "postgresql+psycopg://harness:***@127.0.0.1:1/harness" in message and "s3cret-pw" not in message


@pytest.mark.parametrize("service, setting, expected", [
    ("crs", "heartbeat_timeout_s=1",
     "harness serve crs: crs.heartbeat_timeout_s = 1.0: expected more than heartbeat_interval_s (2.0)"),
    ("fpga", "autoscaler_interval_s=0",
     "harness serve fpga: orchestrator.autoscaler_interval_s = 0.0: expected seconds, more than 0"),
    ("fpga", "servers=", "harness serve fpga: orchestrator.servers = []: expected at least one FPGA-server address"),
])
def test_a_setting_that_would_break_the_service_is_one_line_and_status_2(tmp_path: Path, service: str, setting: str,
                                                                         expected: str) -> None:
    out = serve(service, "--set", f"state_dir={tmp_path}", "--set", setting, cwd=tmp_path)
    assert refused(out, service).startswith(expected)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".db")], "refused before its database was made"
