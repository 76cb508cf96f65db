"""The database as its own dump tool writes it: what a "real delete" test searches."""

from __future__ import annotations

import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path


def database_dump(database_url: str) -> str:
    """Every row of the database: `pg_dump --data-only` on Postgres; on SQLite its `.dump`
    after a WAL checkpoint, and the bytes of the database file and its WAL and shared memory
    (where a deleted row would linger without `secure_delete`)."""
    if database_url.startswith("sqlite"):
        path = Path(database_url.split(":///", 1)[1])
        with closing(sqlite3.connect(path)) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            text = "\n".join(db.iterdump())
        raw = b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
        return text + raw.decode("utf-8", errors="replace")
    return subprocess.run(
        ["pg_dump", "--data-only", database_url.replace("+psycopg", "")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
