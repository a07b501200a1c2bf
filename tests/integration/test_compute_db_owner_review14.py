"""One compute IRM per database (review 14): a second compute IRM (another `name`, another site) started on the
database of a first is refused at start-up, one line and exit status 2, before it touches anything; the first's
hosts stay as they were. A database made before owners were recorded (hosts and all) is adopted by the first IRM
that starts on it. And the price coefficients, back-end and fault of a compute IRM are checked at start-up: a
negative price (which any max_price_per_minute would pass) or an unknown name is refused the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from harness.v1 import irm_pb2, irm_pb2_grpc
from irm_compute.service import MIGRATIONS, ComputeConfig, ComputeIrm
from services.config import ConfigError
from services.db import Database
from services.tls import plain_channel

SITE_A = """
hosts:
  - {id: a-h1, site: a, rack: r1, cores: 8, memory_gb: 16}
  - {id: a-h2, site: a, rack: r1, cores: 8, memory_gb: 16}
"""
SITE_B = """
hosts:
  - {id: b-h1, site: b, rack: r1, cores: 4, memory_gb: 8}
"""
REFUSED = "give each compute IRM its own database"


def serve_compute(tmp_path: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    """`harness serve compute` that is expected to refuse to start; if it serves instead, it is stopped and the
    test fails saying so."""
    argv = [sys.executable, "-m", "services.cli", "serve", "compute", "--address", "127.0.0.1:0",
            "--set", f"state_dir={tmp_path}"]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the compute IRM started (it should have been refused): {err[-2000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("harness serve compute: cannot start: "), out.stderr
    return out.stderr


def hosts_in(url: str) -> dict[str, bool]:
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            return {row[0]: bool(row[1]) for row in conn.execute(text("SELECT id, enabled FROM compute_hosts"))}
    finally:
        db.dispose()


def test_a_second_compute_irm_on_one_database_is_refused_and_the_first_keeps_its_hosts(suite, tmp_path):
    (tmp_path / "a.yaml").write_text(SITE_A)
    (tmp_path / "b.yaml").write_text(SITE_B)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a = suite.start("compute", name="site-a", database=url, inventory=str(tmp_path / "a.yaml"))

    out = serve_compute(tmp_path, "name=site-b", f"database={url}", f"inventory={tmp_path / 'b.yaml'}")
    message = one_line_error(out)
    assert "holds the state of compute IRM 'site-a'; this one is 'site-b'" in message and REFUSED in message

    # Site A still offers its own hosts, all of them, and nothing of B's.
    with plain_channel(a.address) as ch:
        found = irm_pb2_grpc.ResourceManagerStub(ch).DiscoverResources(irm_pb2.DiscoverResourcesRequest(),
                                                                       timeout=30).resources
    assert sorted(r.id for r in found) == ["a-h1", "a-h2"] and {r.manager for r in found} == {"site-a"}
    assert hosts_in(url) == {"a-h1": True, "a-h2": True}

    # The owner itself restarts on it as before.
    a.stop()
    again = suite.start("compute", name="site-a", database=url, inventory=str(tmp_path / "a.yaml"))
    assert again.alive() and hosts_in(url) == {"a-h1": True, "a-h2": True}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_database_made_before_owners_is_adopted_by_the_first_irm_that_starts(tmp_path, request, backend):
    """The upgrade path: the compute tables at the previous revision, with site A's hosts (one in use), no owner."""
    from alembic import command
    from alembic.config import Config

    url = request.getfixturevalue("fresh_pg_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'old.db'}"
    (tmp_path / "a.yaml").write_text(SITE_A)
    (tmp_path / "b.yaml").write_text(SITE_B)
    db = Database(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["version_table"] = "alembic_version_compute"
    try:
        with db.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "b81f4c2e9d07")
            for host, used in (("a-h1", 2), ("a-h2", 0)):
                conn.execute(text(
                    "INSERT INTO compute_hosts (id, site, rack, cores, memory_mb, frequency_ghz, traits, agent, "
                    "used_cores, used_memory_mb, generation, enabled) VALUES (:id, 'a', 'r1', 8, 16384, 2.2, '[]', "
                    "'', :used, :mem, 3, :on)"), {"id": host, "used": used, "mem": used * 1024, "on": True})
            conn.commit()
    finally:
        db.dispose()

    a = ComputeIrm(ComputeConfig(name="site-a", database=url, inventory=str(tmp_path / "a.yaml")))
    try:
        assert {h.id: (h.used_cores, h.enabled) for h in a.store.all_hosts()} == {
            "a-h1": (2, True), "a-h2": (0, True)}          # adopted as they were: what is in use stays in use
    finally:
        a.watchers.close()
        a.db.dispose()
    with pytest.raises(ConfigError, match=f"holds the state of compute IRM 'site-a'; this one is 'site-b'.*{REFUSED}"):
        ComputeIrm(ComputeConfig(name="site-b", database=url, inventory=str(tmp_path / "b.yaml")))
    assert hosts_in(url) == {"a-h1": True, "a-h2": True}


@pytest.mark.parametrize(("setting", "fragment"), [
    ("per_core=-1", "per_core -1.0: expected a finite price per minute >= 0"),
    ("base=-1", "base -1.0: expected a finite price per minute >= 0"),
    ("reference_frequency_ghz=0", "reference_frequency_ghz 0.0: expected a finite number of GHz, more than 0"),
    ("backend=bogus", "backend 'bogus': expected one of 'local', 'replay'"),
    ("fault=bogus", "fault 'bogus': expected one of '', 'crash_after_commit'"),
])
def test_bad_prices_backends_and_faults_are_refused_at_start_up(tmp_path, setting, fragment):
    message = one_line_error(serve_compute(tmp_path, setting))
    assert f"compute configuration: {fragment}" in message
    assert not list(tmp_path.glob("*.db")), "refused before any database was made"


@pytest.mark.parametrize("prices", [{"per_gb": float("nan")}, {"per_core": float("inf")}, {"base": -0.01}])
def test_prices_not_finite_or_below_zero_are_refused_in_process_too(tmp_path, prices):
    # (`harness serve` refuses nan and inf already while reading the settings: a ComputeConfig made in code is
    # checked by the IRM itself.)
    with pytest.raises(ConfigError, match="expected a finite price per minute >= 0"):
        ComputeIrm(ComputeConfig(state_dir=str(tmp_path), **prices))
    assert not list(tmp_path.glob("*.db"))


def test_zero_prices_are_fine(tmp_path):
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), per_core=0, per_gb=0, base=0, backend="replay"))
    irm.watchers.close()
    irm.db.dispose()
