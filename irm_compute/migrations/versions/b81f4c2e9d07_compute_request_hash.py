"""compute reservations: the hash of the request a request_id was first used with

Revision ID: b81f4c2e9d07
Revises: 38714fad045a
"""

import sqlalchemy as sa
from alembic import op

revision = "b81f4c2e9d07"
down_revision = "38714fad045a"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows get "": their request_id is replayed without comparing the content (it was never recorded).
    with op.batch_alter_table("compute_reservations") as batch_op:
        batch_op.add_column(sa.Column("request_hash", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("compute_reservations") as batch_op:
        batch_op.drop_column("request_hash")
