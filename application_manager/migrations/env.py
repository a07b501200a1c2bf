from alembic import context

from application_manager.models import Base
from services.db import run_migrations

run_migrations(context, Base.metadata)
