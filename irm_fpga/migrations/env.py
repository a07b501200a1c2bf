from alembic import context

from irm_fpga.models import Base
from services.db import run_migrations

run_migrations(context, Base.metadata)
