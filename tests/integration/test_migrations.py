"""Every service's Alembic migrations build its schema on PostgreSQL, re-running them is a no-op, and the schema
they build is the one its models declare (on SQLite too, where some column types were deliberately left)."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

from services.db import Database

SERVICES = [
    ("irm_compute.service", "alembic_version_compute", {"compute_hosts", "compute_reservations", "compute_vms"}),
    ("cross_resource_scheduler.service", "alembic_version_crs",
     {"crs_managers", "crs_reservations", "crs_compensations"}),
    ("irm_fpga.orchestrator", "alembic_version_fpga",
     {"fpga_groups", "fpga_clients", "fpga_reservations", "fpga_jobs"}),
    ("application_manager.service", "alembic_version_am",
     {"am_applications", "am_sessions", "am_runs", "am_models", "am_executions"}),
]


@pytest.mark.parametrize("module, version_table, tables", SERVICES)
def test_migrations_on_postgresql(fresh_pg_url, module, version_table, tables):
    import importlib

    migrations = importlib.import_module(module).MIGRATIONS
    db = Database(fresh_pg_url)
    try:
        db.migrate(migrations, version_table)
        db.migrate(migrations, version_table)  # idempotent
        have = set(inspect(db.engine).get_table_names())
        assert tables | {version_table} <= have
    finally:
        db.dispose()


@pytest.mark.parametrize("module, version_table, tables", SERVICES)
def test_the_migrated_schema_is_the_models_one(db_url, module, version_table, tables):
    import importlib

    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    service = importlib.import_module(module)
    metadata = importlib.import_module(module.rsplit(".", 1)[0] + ".models").Base.metadata
    db = Database(db_url)
    try:
        db.migrate(service.MIGRATIONS, version_table)
        with db.engine.connect() as conn:
            # SQLite keeps the 32-bit and VARCHAR(32) columns the FPGA IRM widened on PostgreSQL (its INTEGER is
            # 64-bit and its VARCHAR unbounded): types are compared on PostgreSQL only.
            ctx = MigrationContext.configure(conn, opts={
                "version_table": version_table, "compare_type": conn.dialect.name != "sqlite",
                "include_object": lambda obj, name, kind, *_: not (kind == "table" and name == version_table)})
            assert compare_metadata(ctx, metadata) == []
    finally:
        db.dispose()


def test_the_am_owner_migration_leaves_one_running_session_per_application(db_url):
    """Two AM processes before 3f8b6d2a9c14 could leave two sessions of one application running: the latest
    stays running (its process may still be there), the other ends as interrupted, and the index holds."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from application_manager import service

    db = Database(db_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(service.MIGRATIONS))
    cfg.attributes["version_table"] = "alembic_version_am"
    try:
        with db.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "7c1e5a9d2b40")
            conn.execute(text("INSERT INTO am_applications (id, tenant, name, manifest, slo, app_dir, created_at) "
                              "VALUES ('app-1', 't', 'a', '{}', '{}', '/x', 0)"))
            for sid, started in (("prof-old", 1.0), ("prof-new", 2.0), ("prof-done", 3.0)):
                state = "done" if sid == "prof-done" else "running"
                conn.execute(text("INSERT INTO am_sessions (id, application_id, profiler, state, runs, max_runs, spent,"
                                  " message, params, started_at, ended_at) VALUES (:id, 'app-1', 'bo', :state, 0, 1,"
                                  " 0, '', '{}', :started, 0)"), {"id": sid, "state": state, "started": started})
            conn.commit()
            command.upgrade(cfg, "head")
            conn.commit()
            states = dict(conn.execute(text("SELECT id, state FROM am_sessions")).all())
            assert states == {"prof-old": "failed", "prof-new": "running", "prof-done": "done"}
            with pytest.raises(IntegrityError):
                conn.execute(text("UPDATE am_sessions SET state = 'running' WHERE id = 'prof-old'"))
    finally:
        db.dispose()


@pytest.mark.parametrize("module, version_table, tables", SERVICES)
def test_a_database_from_a_newer_harness_is_refused_saying_so(db_url, module, version_table, tables):
    # Going back a version (or two versions on one database): the schema is at a revision these migrations do
    # not have. Was Alembic's "Can't locate revision" traceback on every start.
    import importlib

    from sqlalchemy import text

    from services.db import SchemaTooNew

    migrations = importlib.import_module(module).MIGRATIONS
    db = Database(db_url)
    try:
        db.migrate(migrations, version_table)
        with db.engine.begin() as conn:
            conn.execute(text(f"UPDATE {version_table} SET version_num = 'f00dfeedbeef'"))
        with pytest.raises(SchemaTooNew) as e:
            db.migrate(migrations, version_table)
        assert "is at schema revision f00dfeedbeef" in str(e.value) and "a newer Harness wrote it" in str(e.value)
        assert "restore the backup" in str(e.value)
        with db.engine.connect() as conn:         # left as it was
            assert conn.execute(text(f"SELECT version_num FROM {version_table}")).scalar() == "f00dfeedbeef"
    finally:
        db.dispose()


def test_harness_serve_on_a_database_from_a_newer_harness_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    from sqlalchemy import text

    from application_manager.service import MIGRATIONS

    url = f"sqlite:///{tmp_path / 'am.db'}"
    db = Database(url)
    try:
        db.migrate(MIGRATIONS, "alembic_version_am")
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version_am SET version_num = 'f00dfeedbeef'"))
    finally:
        db.dispose()
    r = subprocess.run([sys.executable, "-m", "services.cli", "serve", "am", "--address", "127.0.0.1:0",
                        "--set", f"database={url}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("harness serve am:")]
    assert "is at schema revision f00dfeedbeef (alembic_version_am)" in line and "am.db" in line
