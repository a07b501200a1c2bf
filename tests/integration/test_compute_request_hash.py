"""The compute IRM's request_hash migration: reservations made before it keep replaying (unchecked), on
SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from irm_compute import inventory as inv
from irm_compute.cost import CostModel
from irm_compute.service import MIGRATIONS
from irm_compute.shapes import VmGroup
from irm_compute.store import ComputeStore
from services.clock import VirtualClock
from services.db import Database

BEFORE_THE_HASH = "38714fad045a"
VERSION_TABLE = "alembic_version_compute"


def migrate_to(db: Database, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["version_table"] = VERSION_TABLE
    with db.engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()


def test_rows_from_before_the_hash_replay_unchecked_and_new_ones_are_checked(db_url: str) -> None:
    db = Database(db_url)
    try:
        migrate_to(db, BEFORE_THE_HASH)
        with db.engine.begin() as conn:     # a reservation (of no VMs) as the old schema held it
            conn.execute(text(
                """INSERT INTO compute_reservations (id, tenant, request_id, state, price_per_minute, created_at,
                   released_at, "groups", notes) VALUES ('res-old', 't', 'old', 'active', 0, 1, 0, '[]', '[]')"""))
        db.migrate(MIGRATIONS, VERSION_TABLE)
        db.migrate(MIGRATIONS, VERSION_TABLE)   # idempotent
        store = ComputeStore(db, CostModel(), VirtualClock(1000.0))
        store.sync_inventory(inv.from_dict({"hosts": [{"id": "a", "cores": 4, "memory_gb": 8}]}))
        shape = VmGroup("g", 1, 1, 1024)
        old = store.reserve("t", "old", [shape], request_hash="whatever")
        assert not old.created and old.reservation.id == "res-old" and old.reservation.request_hash == ""
        new = store.reserve("t", "new", [shape], request_hash="h1")
        assert new.created and store.get("t", request_id="new").request_hash == "h1"
    finally:
        db.dispose()
