from alembic import context

import irm_fpga.job_models  # noqa: F401 - its tables join Base.metadata
from irm_fpga.models import Base
from services.db import run_migrations

run_migrations(context, Base.metadata)
