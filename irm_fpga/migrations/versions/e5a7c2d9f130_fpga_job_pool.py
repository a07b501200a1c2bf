"""fpga job pool: the Hydrogen elasticity manager's pool survives a restart

Revision ID: e5a7c2d9f130
Revises: a4c9e1f7b2d8
"""

import sqlalchemy as sa
from alembic import op

revision = "e5a7c2d9f130"
down_revision = "a4c9e1f7b2d8"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fpga_job_pool",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("policy", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fpga_job_pool")
