"""am_releases: reservations runs may have left at the CRS, released once it answers

Revision ID: 5d9a3e7c1f28
Revises: b4e2c8f1a6d3
"""
from alembic import op
import sqlalchemy as sa


revision = '5d9a3e7c1f28'
down_revision = 'b4e2c8f1a6d3'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nothing to carry over: before this revision a release that failed was only logged.
    op.create_table('am_releases',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('reservation_id', sa.String(length=64), nullable=False),
    sa.Column('reserve_request', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_am_releases'))
    )


def downgrade() -> None:
    op.drop_table('am_releases')
