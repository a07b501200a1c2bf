"""fpga job controllers (issue 5: the job manager's per-job state survives a restart)

Revision ID: c3f8a1d2e5b7
Revises: 9b1d2e7c4a10
"""

import sqlalchemy as sa
from alembic import op

revision = "c3f8a1d2e5b7"
down_revision = "9b1d2e7c4a10"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fpga_job_controllers",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("last_time", sa.Float(), nullable=False),
        sa.Column("last_actions", sa.Integer(), nullable=False),
        sa.Column("a_hat", sa.Float(), nullable=True),
        sa.Column("throughput", sa.Float(), nullable=True),
        sa.Column("goal", sa.Float(), nullable=True),
        sa.Column("request", sa.Integer(), nullable=False),
        sa.Column("performance", sa.Float(), nullable=False),
        sa.Column("sample_time", sa.Float(), nullable=False),
        sa.Column("sample_actions", sa.Integer(), nullable=False),
        sa.Column("seen", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["fpga_jobs.id"],
            name=op.f("fk_fpga_job_controllers_job_id_fpga_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_fpga_job_controllers")),
    )


def downgrade() -> None:
    op.drop_table("fpga_job_controllers")
