"""am_sessions/am_executions.release_pending: reservations of interrupted runs still to release at the CRS

Revision ID: b4e2c8f1a6d3
Revises: 3f8b6d2a9c14
"""
from alembic import op
import sqlalchemy as sa


revision = 'b4e2c8f1a6d3'
down_revision = '3f8b6d2a9c14'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows ended before this revision are taken as released (what their sweep did or logged stands).
    with op.batch_alter_table('am_sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('release_pending', sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table('am_executions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('release_pending', sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('am_executions', schema=None) as batch_op:
        batch_op.drop_column('release_pending')
    with op.batch_alter_table('am_sessions', schema=None) as batch_op:
        batch_op.drop_column('release_pending')
