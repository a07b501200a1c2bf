"""Every service's Alembic migrations build its schema on PostgreSQL, and re-running them is a no-op."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from services.db import Database

SERVICES = [
    ("irm_compute.service", "alembic_version_compute", {"compute_hosts", "compute_reservations", "compute_vms"}),
    ("cross_resource_scheduler.service", "alembic_version_crs",
     {"crs_managers", "crs_reservations", "crs_compensations"}),
    ("irm_fpga.orchestrator", "alembic_version_fpga",
     {"fpga_groups", "fpga_clients", "fpga_reservations", "fpga_jobs"}),
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
