"""`make migrations-check`: upgrade → downgrade → upgrade and `alembic check`, on each backend.

SQLite always; Postgres when reachable (required under CI=true).
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid

import psycopg

from agent_reach_controller.storage import migrate

ADMIN_URL = os.environ.get(
    "AGENT_REACH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def round_trip(url: str) -> None:
    migrate.upgrade(url)
    migrate.check(url)
    migrate.downgrade(url)
    migrate.upgrade(url)
    migrate.check(url)


def _postgres_round_trip() -> bool:
    name = f"reach_migrations_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            raise SystemExit(f"Postgres is required under CI and is unreachable: {exc}") from exc
        print(f"Postgres unreachable ({exc.__class__.__name__}); checked SQLite only")
        return False
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            base = ADMIN_URL.rsplit("/", 1)[0]
            round_trip(f"{base}/{name}")
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    return True


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        round_trip(f"sqlite:///{tmp}/check.db")
    backends = "SQLite and Postgres" if _postgres_round_trip() else "SQLite"
    print(f"migrations round-trip and match the models on {backends}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
