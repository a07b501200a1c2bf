"""am_sessions/am_executions owner + heartbeat; am_sessions.stop_requested; one running session per application

Revision ID: 3f8b6d2a9c14
Revises: 7c1e5a9d2b40
"""
from alembic import op
import sqlalchemy as sa


revision = '3f8b6d2a9c14'
down_revision = '7c1e5a9d2b40'
branch_labels = None
depends_on = None

RUNNING = sa.text("state = 'running'")


def upgrade() -> None:
    # Rows already running keep no owner: the next AM to start takes them as interrupted, as before.
    with op.batch_alter_table('am_sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('stop_requested', sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table('am_executions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', sa.Float(), nullable=True))
    # Before the index: of several sessions running on one application (two AM processes before this
    # revision), all but the latest end as interrupted.
    op.execute(
        "UPDATE am_sessions SET state = 'failed', message = 'interrupted: another session of the application ran', "
        "ended_at = started_at WHERE state = 'running' AND EXISTS (SELECT 1 FROM am_sessions o "
        "WHERE o.application_id = am_sessions.application_id AND o.state = 'running' AND "
        "(o.started_at > am_sessions.started_at OR (o.started_at = am_sessions.started_at AND o.id > am_sessions.id)))")
    op.create_index('uq_am_sessions_running_application', 'am_sessions', ['application_id'], unique=True,
                    sqlite_where=RUNNING, postgresql_where=RUNNING)


def downgrade() -> None:
    op.drop_index('uq_am_sessions_running_application', table_name='am_sessions')
    with op.batch_alter_table('am_executions', schema=None) as batch_op:
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('owner')
    with op.batch_alter_table('am_sessions', schema=None) as batch_op:
        batch_op.drop_column('stop_requested')
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('owner')
