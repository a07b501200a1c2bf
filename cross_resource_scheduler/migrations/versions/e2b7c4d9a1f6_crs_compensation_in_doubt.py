"""crs compensations: whether a part is in doubt, and when to try it next (were in memory only)

Revision ID: e2b7c4d9a1f6
Revises: c5e1a9d3b7f2
"""

import sqlalchemy as sa
from alembic import op

revision = "e2b7c4d9a1f6"
down_revision = "c5e1a9d3b7f2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows: not in doubt (what a restart took them for before) and due at once.
    with op.batch_alter_table("crs_compensations") as batch_op:
        batch_op.add_column(sa.Column("in_doubt", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("next_try_at", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("crs_compensations") as batch_op:
        batch_op.drop_column("next_try_at")
        batch_op.drop_column("in_doubt")
