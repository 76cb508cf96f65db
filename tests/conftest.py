"""Shared fixtures: real Postgres, Redis, promtool (fail under CI when missing, skip otherwise)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from typing import NoReturn

import psycopg
import pytest

POSTGRES_ADMIN = os.environ.get(
    "AGENT_REACH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("AGENT_REACH_TEST_REDIS", "redis://127.0.0.1:6379/15")
IN_CI = os.environ.get("CI") == "true"


def _unavailable(what: str, exc: Exception) -> None:
    _missing(f"{what} is not reachable ({type(exc).__name__}: {exc})")


def _missing(message: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{message}; under CI=true this is a failure, not a skip", pytrace=False)
    pytest.skip(message)


def _server_url(database: str) -> str:
    return POSTGRES_ADMIN.rsplit("/", 1)[0] + f"/{database}"


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """A database migrated once per session; tests clone it (CREATE DATABASE … TEMPLATE)."""
    from agent_reach_controller.storage import migrate

    try:
        admin = psycopg.connect(POSTGRES_ADMIN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        _unavailable("PostgreSQL", exc)
        raise
    name = f"reach_tpl_{uuid.uuid4().hex[:10]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        migrate.upgrade(_server_url(name))
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url(postgres_template: str) -> Iterator[str]:
    """A fresh, migrated Postgres database for one test."""
    name = f"reach_t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"')
    try:
        yield _server_url(name)
    finally:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    """A fresh, migrated SQLite database file for one test."""
    from agent_reach_controller.storage import migrate

    url = f"sqlite:///{tmp_path}/reach.db"
    migrate.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """The same test on both backends."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus's promtool (Debian package `prometheus`; `make tools` installs it)."""
    path = shutil.which("promtool")
    if path is None:
        _missing("promtool is not installed (run `make tools`)")
    return path


@pytest.fixture
def redis_url() -> str:
    """A flushed Redis database (db 15) for one test."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        _unavailable("Redis", exc)
    finally:
        client.close()
    return REDIS_URL
