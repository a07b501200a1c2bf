"""fpga jobs indexes: control rounds and restarts read active/queued jobs by state, recent ones by registration time,
and a group's job by group id; without indexes each scanned every retired job ever kept

Revision ID: b8d4f0a6c2e1
Revises: e5a7c2d9f130
"""

from alembic import op

revision = "b8d4f0a6c2e1"
down_revision = "e5a7c2d9f130"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fpga_jobs", schema=None) as batch_op:
        batch_op.create_index("ix_fpga_jobs_state_registered_at", ["state", "registered_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_fpga_jobs_registered_at"), ["registered_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_fpga_jobs_group_id"), ["group_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("fpga_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_fpga_jobs_group_id"))
        batch_op.drop_index(batch_op.f("ix_fpga_jobs_registered_at"))
        batch_op.drop_index("ix_fpga_jobs_state_registered_at")
