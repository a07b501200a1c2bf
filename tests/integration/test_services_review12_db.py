"""services.db on a real database (SQLite and PostgreSQL, as `db_url` decides): two processes of a service that
start at once on a fresh database both migrate it, and both must come up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from services.db import Database, migration_lock_key

SERVICES = [
    ("irm_compute.service", "alembic_version_compute"),
    ("cross_resource_scheduler.service", "alembic_version_crs"),
    ("irm_fpga.orchestrator", "alembic_version_fpga"),
    ("application_manager.service", "alembic_version_am"),
]
ROOT = Path(__file__).resolve().parents[2]


# One service process starting: import it, say so, migrate when told (Alembic's context is per process, so two
# migrations at once are two processes, as in life).
CHILD = r"""
import importlib, sys
from services.db import Database
module, version_table, url = sys.argv[1:]
migrations = importlib.import_module(module).MIGRATIONS
db = Database(url)
print("ready", flush=True)
sys.stdin.readline()
try:
    db.migrate(migrations, version_table)
    print("ok", flush=True)
except Exception as e:
    print(type(e).__name__, str(getattr(e, "orig", e)).splitlines()[0], flush=True)
finally:
    db.dispose()
"""


@pytest.mark.parametrize("module, version_table", SERVICES)
def test_two_processes_migrating_one_fresh_database_at_once_both_succeed(db_url, module, version_table):
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, module, version_table, db_url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:                          # both start on the fresh database at the same moment
            p.stdin.write("go\n")
            p.stdin.flush()
        outcomes = [p.communicate(timeout=120)[0].strip() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert outcomes == ["ok", "ok"]
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            versions = conn.execute(text(f"SELECT version_num FROM {version_table}")).scalars().all()
            assert len(versions) == 1            # one head, recorded once
            if conn.dialect.name == "postgresql":
                # Released after each migration: no advisory lock left in this database.
                held = conn.execute(text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar()
                assert held == 0
        assert version_table in inspect(db.engine).get_table_names()
    finally:
        db.dispose()


def test_the_migration_lock_key_is_stable_and_per_version_table():
    key = migration_lock_key("alembic_version_am")
    assert key == migration_lock_key("alembic_version_am")
    assert -(2 ** 63) <= key < 2 ** 63
    assert len({migration_lock_key(v) for _, v in SERVICES}) == len(SERVICES)


# A service process that stops right after its migration's first commit until told to go on (the window in which
# another process could find the schema half-upgraded), then finishes its migration.
PAUSING_CHILD = CHILD.replace('print("ready", flush=True)\nsys.stdin.readline()\n', r"""
from sqlalchemy.engine import Connection
commit = Connection._commit_impl
commits = []
def pausing_commit(self):
    commit(self)
    commits.append(1)
    if len(commits) == 1:
        print("paused", flush=True)
        sys.stdin.readline()
Connection._commit_impl = pausing_commit
""")
assert "pausing_commit" in PAUSING_CHILD


@pytest.mark.parametrize("module, version_table", SERVICES)
def test_no_other_process_sees_a_sqlite_migration_half_done(tmp_path, module, version_table):
    # Alembic commits each revision apart on SQLite unless told its DDL is transactional: a process starting
    # between two commits ran the next revisions itself, and the first then failed on them ("duplicate column").
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    first = subprocess.Popen([sys.executable, "-c", PAUSING_CHILD, module, version_table, url],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert first.stdout.readline().strip() == "paused"
        second = subprocess.run([sys.executable, "-c", CHILD, module, version_table, url], input="go\n",
                                capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert second.stdout.split() == ["ready", "ok"], second.stderr
        assert first.communicate("go\n", timeout=120)[0].strip() == "ok"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            assert len(conn.execute(text(f"SELECT version_num FROM {version_table}")).scalars().all()) == 1
    finally:
        db.dispose()
