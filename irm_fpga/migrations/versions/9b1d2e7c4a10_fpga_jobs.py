"""fpga jobs (issue 5: QoS job manager)

Revision ID: 9b1d2e7c4a10
Revises: 4f5cc957f0f2
"""
import sqlalchemy as sa
from alembic import op

revision = '9b1d2e7c4a10'
down_revision = '4f5cc957f0f2'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('fpga_jobs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('request_id', sa.String(length=256), nullable=False),
    sa.Column('design', sa.String(length=64), nullable=False),
    sa.Column('group_id', sa.String(length=64), nullable=False),
    sa.Column('policy', sa.String(length=32), nullable=False),
    sa.Column('goal', sa.String(length=16), nullable=False),
    sa.Column('deadline_s', sa.Float(), nullable=False),
    sa.Column('deadline_at', sa.Float(), nullable=False),
    sa.Column('size_actions', sa.Integer(), nullable=False),
    sa.Column('throughput_goal', sa.Float(), nullable=False),
    sa.Column('min_devices', sa.Integer(), nullable=False),
    sa.Column('max_devices', sa.Integer(), nullable=False),
    sa.Column('priority', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('devices', sa.Integer(), nullable=False),
    sa.Column('observed_actions', sa.Integer(), nullable=False),
    sa.Column('reported_actions', sa.Integer(), nullable=False),
    sa.Column('achieved_throughput', sa.Float(), nullable=False),
    sa.Column('allocations', sa.JSON(), nullable=False),
    sa.Column('registered_at', sa.Float(), nullable=False),
    sa.Column('retired_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_fpga_jobs')),
    sa.UniqueConstraint('tenant', 'request_id', name=op.f('uq_fpga_jobs_tenant'))
    )
    with op.batch_alter_table('fpga_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_fpga_jobs_tenant'), ['tenant'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('fpga_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_fpga_jobs_tenant'))
    op.drop_table('fpga_jobs')
