"""am_runs.transient: runs that failed through no fault of their configuration

Revision ID: 7c1e5a9d2b40
Revises: 216cf3c778fd
"""
from alembic import op
import sqlalchemy as sa


revision = '7c1e5a9d2b40'
down_revision = '216cf3c778fd'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing runs stay what they were recorded as: measurements (false).
    with op.batch_alter_table('am_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('transient', sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('am_runs', schema=None) as batch_op:
        batch_op.drop_column('transient')
