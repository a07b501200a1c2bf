"""am_releases.attempts/next_try_at: a per-row back-off for releases the CRS refuses for good

Revision ID: 8a6c4e2f9d17
Revises: 5d9a3e7c1f28
"""
from alembic import op
import sqlalchemy as sa


revision = '8a6c4e2f9d17'
down_revision = '5d9a3e7c1f28'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows kept before this revision are due at once, as every row was at every sweep.
    with op.batch_alter_table('am_releases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch_op.add_column(sa.Column('next_try_at', sa.Float(), server_default=sa.text('0'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('am_releases', schema=None) as batch_op:
        batch_op.drop_column('next_try_at')
        batch_op.drop_column('attempts')
