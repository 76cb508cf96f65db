"""Run Alembic migrations programmatically (`reach migrate`, tests, the Helm hook)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from agent_reach_controller.storage.engine import sync_url

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(database_url: str) -> Config:
    """An Alembic config pointing at our migrations and the given database."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", sync_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the schema up to `revision`."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Take the schema down to `revision`."""
    command.downgrade(alembic_config(database_url), revision)


def check(database_url: str) -> None:
    """Fail if the models and the migrated schema differ (`alembic check`)."""
    command.check(alembic_config(database_url))
