from alembic import context

from cross_resource_scheduler.models import Base
from services.db import run_migrations

run_migrations(context, Base.metadata)
