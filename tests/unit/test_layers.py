"""SQL is written in one place. import-linter (`make lint`) keeps SQLAlchemy, Alembic and psycopg
inside `agent_reach_controller.storage`; this test catches what an import rule cannot see: a SQL
statement spelled as a plain string anywhere else in the controller, the CLI or the executor."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    ROOT / "controller" / "agent_reach_controller",
    ROOT / "controller" / "agent_reach_cli",
    ROOT / "executor",
    ROOT / "connectors",
]
STORAGE = ROOT / "controller" / "agent_reach_controller" / "storage"

STATEMENT = re.compile(
    r"^\s*(SELECT\s+.+\s+FROM\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s"
    r"|LISTEN\s|NOTIFY\s|PRAGMA\s|CREATE\s+(TABLE|INDEX)\s|ALTER\s+TABLE\s|LOCK\s+TABLE\s)",
    re.DOTALL,  # our SQL is written in capitals; prose ("Select a tool from…") is not
)


def sql_strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and STATEMENT.match(node.value)
    ]


def test_the_detector_sees_sql_it_must_see(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        'A = "SELECT id FROM steps WHERE x = 1"\n'
        'B = """\n  UPDATE steps SET status = 2"""\n'
        'C = "Select a tool from the catalogue"\n'
        'D = "delete from the queue"\n'
    )
    assert [line for line, _ in sql_strings(sample)] == [1, 2]


def test_no_sql_statement_outside_the_storage_layer() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text.strip()[:60]!r}"
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        if STORAGE not in path.parents
        for line, text in sql_strings(path)
    ]
    assert not found, "SQL outside storage/:\n" + "\n".join(found)
