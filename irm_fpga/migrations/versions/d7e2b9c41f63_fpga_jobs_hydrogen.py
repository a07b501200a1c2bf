"""fpga jobs: Hydrogen policies (a job's expected seconds per action) and 64-bit action counts

Revision ID: d7e2b9c41f63
Revises: c3f8a1d2e5b7
"""

import sqlalchemy as sa
from alembic import op

revision = "d7e2b9c41f63"
down_revision = "c3f8a1d2e5b7"
branch_labels = None
depends_on = None

# The API's action counts are int64; 32-bit columns overflowed on PostgreSQL. SQLite's INTEGER is
# 64-bit already (and re-creating fpga_jobs there would cascade to its controllers): left as it is.
_WIDENED = {"fpga_jobs": ("size_actions", "observed_actions", "reported_actions"),
            "fpga_job_controllers": ("last_actions", "sample_actions")}


def _retype(old: sa.types.TypeEngine, new: sa.types.TypeEngine) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, columns in _WIDENED.items():
        for c in columns:
            op.alter_column(table, c, existing_type=old, type_=new, existing_nullable=False)


def upgrade() -> None:
    op.add_column("fpga_jobs", sa.Column("action_seconds", sa.Float(), nullable=False, server_default="0"))
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())
    op.drop_column("fpga_jobs", "action_seconds")
