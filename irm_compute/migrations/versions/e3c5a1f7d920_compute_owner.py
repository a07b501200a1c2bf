"""compute owner: the one compute IRM whose state these tables hold

Revision ID: e3c5a1f7d920
Revises: b81f4c2e9d07
"""

import sqlalchemy as sa
from alembic import op

revision = "e3c5a1f7d920"
down_revision = "b81f4c2e9d07"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty after the upgrade: the first compute IRM that starts records its name (on a database made before this
    # revision, it adopts the hosts, reservations and VMs already there; see ComputeStore.claim).
    op.create_table(
        "compute_owner",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("manager", sa.String(length=128), nullable=False),
        sa.Column("claimed_at", sa.Float(), nullable=False),
        sa.Column("probed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compute_owner")),
    )


def downgrade() -> None:
    op.drop_table("compute_owner")
