"""fpga jobs: room for a plugged-in scheduling algorithm's name (`package.module:function`)

Revision ID: a4c9e1f7b2d8
Revises: d7e2b9c41f63
"""

import sqlalchemy as sa
from alembic import op

revision = "a4c9e1f7b2d8"
down_revision = "d7e2b9c41f63"
branch_labels = None
depends_on = None

# SQLite does not enforce VARCHAR lengths (and re-creating fpga_jobs there would cascade to its controllers).


def _retype(old: int, new: int) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("fpga_jobs", "policy", existing_type=sa.String(old), type_=sa.String(new), existing_nullable=False)


def upgrade() -> None:
    _retype(32, 255)


def downgrade() -> None:
    _retype(255, 32)
