"""fpga jobs: the hash of the request a request_id was first registered with

Revision ID: f1c6a8e3b7d2
Revises: b8d4f0a6c2e1
"""

import sqlalchemy as sa
from alembic import op

revision = "f1c6a8e3b7d2"
down_revision = "b8d4f0a6c2e1"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing jobs get "": their request_id is replayed without comparing the request (it was never recorded).
    with op.batch_alter_table("fpga_jobs") as batch_op:
        batch_op.add_column(sa.Column("request_hash", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("fpga_jobs") as batch_op:
        batch_op.drop_column("request_hash")
