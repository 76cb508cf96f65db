"""Fixtures of the fault suite: a private Postgres, a run directory, one FaultEnv per scenario.

Run with `make test-faults` (`AGENT_REACH_FAULTS_PROFILE=long` for the long profile). Other
knobs: `AGENT_REACH_FAULTS_DIR` (where runs are written; default a new /tmp/reach-faults-*),
`AGENT_REACH_FAULTS_SEED` (replay a run's random choices), `AGENT_REACH_FAULTS_KEEP=1` (keep
the directories of passing scenarios too; failing ones are always kept),
`AGENT_REACH_FAULTS_STRICT=1` (a scenario that tolerates a known, reported product bug fails
instead of marking it xfail; none does today). `AGENT_REACH_FAULTS_PG_BIN` names the PostgreSQL
binaries to use.
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from agent_reach_controller.storage import migrate
from tests.faults import profiles
from tests.faults.harness import FaultEnv, Faults, Figures, seed
from tests.support.history import History
from tests.support.pgserver import PostgresUnavailableError, PrivatePostgres

IN_CI = os.environ.get("CI") == "true"
_FIGURES_KEY = pytest.StashKey[Figures]()
_KEPT_KEY = pytest.StashKey[list[str]]()
_RUN_DIR_KEY = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: a fault-injection scenario (make test-faults)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    profile = profiles.current()
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.timeout(profile.timeout_s))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    item.stash.setdefault(_FAILED_KEY, False)
    if getattr(report, "failed", False):
        item.stash[_FAILED_KEY] = True
    return report


_FAILED_KEY = pytest.StashKey[bool]()


def _machine() -> str:
    from tests.bench.machine import cpu_model, git_commit, memory_gib

    memory = memory_gib()
    return (
        f"{cpu_model()}, {os.cpu_count()} cores"
        + (f", {memory:.0f} GiB" if memory else "")
        + f"; Python {platform.python_version()}; commit {git_commit()}"
    )


@pytest.fixture(scope="session")
def fault_run_dir(pytestconfig: pytest.Config) -> Path:
    given = os.environ.get("AGENT_REACH_FAULTS_DIR")
    root = Path(given) if given else Path(tempfile.mkdtemp(prefix="reach-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    pytestconfig.stash[_RUN_DIR_KEY] = root
    return root


@pytest.fixture(scope="session")
def figures(pytestconfig: pytest.Config, fault_run_dir: Path) -> Figures:
    profile = profiles.current()
    found = Figures(path=fault_run_dir / "figures.txt")
    found.header = [f"profile {profile.name}; {_machine()}"]
    found.path.write_text("\n".join(found.header) + "\n")
    pytestconfig.stash[_FIGURES_KEY] = found
    return found


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A cluster of our own (crashable), with a migrated template database."""
    try:
        pg = PrivatePostgres.create()
    except (PostgresUnavailableError, RuntimeError, OSError) as exc:
        message = f"cannot start a private PostgreSQL ({exc})"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with pg:
        with psycopg.connect(pg.url(), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "reach_template"')
        migrate.upgrade(pg.url("reach_template"))
        yield pg


@pytest.fixture
def fault_env(
    request: pytest.FixtureRequest,
    private_postgres: PrivatePostgres,
    fault_run_dir: Path,
    figures: Figures,
) -> Iterator[FaultEnv]:
    name = request.node.name
    directory = fault_run_dir / name
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    pg = private_postgres
    if not pg.running():
        pg.start()  # a previous scenario may have failed while it was down
    database = f"reach_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg.url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}" TEMPLATE "reach_template"')
    # Up to the migrations on disk now (usually nothing to do): a long session outlives edits.
    migrate.upgrade(pg.url(database))
    history = History(directory / "history.jsonl")
    run_seed = seed()
    profile = profiles.current()
    history.record("run", scenario=name, profile=profile.name, seed=run_seed, database=database)
    env = FaultEnv(
        name=name,
        profile=profile,
        dir=directory,
        history=history,
        pg=pg,
        database=database,
        rng=random.Random(run_seed),
        figures=figures,
        faults=Faults(history, pg),
    )
    try:
        yield env
    finally:
        env.faults.heal_all()
        env.close()
        history.close()
        failed = request.node.stash.get(_FAILED_KEY, False)
        if failed:
            kept = request.config.stash.setdefault(_KEPT_KEY, [])
            kept.append(f"{name}: history {history.path} (seed {run_seed})")
            print(f"\nhistory kept: {history.path} (seed {run_seed})")
        elif os.environ.get("AGENT_REACH_FAULTS_KEEP") != "1":
            shutil.rmtree(directory, ignore_errors=True)
        if pg.running():
            with psycopg.connect(pg.url(), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    found = config.stash.get(_FIGURES_KEY, None)
    kept = config.stash.get(_KEPT_KEY, [])
    if found is None:
        return
    terminalreporter.section("fault figures")
    for line in [*found.header, *found.lines]:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"(also in {found.path})")
    for line in kept:
        terminalreporter.write_line(f"kept for inspection — {line}")
