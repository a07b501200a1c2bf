"""crs reservations: the hash of the request a request_id was first used with

Revision ID: c5e1a9d3b7f2
Revises: f7823496aba7
"""

import sqlalchemy as sa
from alembic import op

revision = "c5e1a9d3b7f2"
down_revision = "f7823496aba7"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows get "": their request_id is replayed without comparing the content (it was never recorded).
    with op.batch_alter_table("crs_reservations") as batch_op:
        batch_op.add_column(sa.Column("request_hash", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("crs_reservations") as batch_op:
        batch_op.drop_column("request_hash")
