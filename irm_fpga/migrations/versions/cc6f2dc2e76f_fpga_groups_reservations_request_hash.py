"""fpga groups and reservations: the hash of the request a request_id was first used with

Revision ID: cc6f2dc2e76f
Revises: f1c6a8e3b7d2
"""

import sqlalchemy as sa
from alembic import op

revision = "cc6f2dc2e76f"
down_revision = "f1c6a8e3b7d2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows get "": their request_id is replayed without comparing the request (it was never recorded).
    for table in ("fpga_groups", "fpga_reservations"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column("request_hash", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    for table in ("fpga_groups", "fpga_reservations"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_column("request_hash")
