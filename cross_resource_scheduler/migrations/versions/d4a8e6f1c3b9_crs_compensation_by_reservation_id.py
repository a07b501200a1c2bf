"""crs compensations: a released part recorded once, by its manager reservation id (were one row per request id it
might have had), and an index for the compensator's read of a manager's rows due

Revision ID: d4a8e6f1c3b9
Revises: 9f8d13967cd6
"""

import sqlalchemy as sa
from alembic import op

revision = "d4a8e6f1c3b9"
down_revision = "9f8d13967cd6"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows get "": given back by request id, as they were written.
    with op.batch_alter_table("crs_compensations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("irm_reservation_id", sa.Text(), nullable=False, server_default=""))
        batch_op.drop_index(batch_op.f("ix_crs_compensations_manager"))
        batch_op.create_index("ix_crs_compensations_manager_next_try_at", ["manager", "next_try_at"], unique=False)


def downgrade() -> None:
    # Rows by reservation id, unknown to the code of the revision before, would be given back by request id "":
    # nothing. They are dropped; the parts they name stay held until an operator releases them at their managers.
    op.execute(sa.text("DELETE FROM crs_compensations WHERE irm_reservation_id != ''"))
    with op.batch_alter_table("crs_compensations", schema=None) as batch_op:
        batch_op.drop_index("ix_crs_compensations_manager_next_try_at")
        batch_op.create_index(batch_op.f("ix_crs_compensations_manager"), ["manager"], unique=False)
        batch_op.drop_column("irm_reservation_id")
