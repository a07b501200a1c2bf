"""crs reservations: the CRS process placing a pending reservation

Revision ID: 9f8d13967cd6
Revises: e2b7c4d9a1f6
"""

import sqlalchemy as sa
from alembic import op

revision = "9f8d13967cd6"
down_revision = "e2b7c4d9a1f6"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows get "": an owner that cannot be checked, so a pending one waits out the horizon as before.
    with op.batch_alter_table("crs_reservations") as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(256), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("crs_reservations") as batch_op:
        batch_op.drop_column("owner")
