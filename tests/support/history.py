"""An append-only JSONL history of what clients, faults and observers did, for checkers to read.

Every record is one JSON object per line with:

- `seq`: its order in this history (0, 1, …),
- `t`: `time.monotonic_ns()` when it was recorded (system-wide on Linux, so comparable with the
  sink's `Delivery.at` and with other processes on the machine),
- `wall`: `time.time_ns()`, to compare with timestamps the controller stores (events, leases),
- `kind`: what happened (`submit`, `fault`, `heal`, `task`, `event`, `delivery`, …),

plus the fields given to `record`. Lines are flushed as they are written, so a run that dies
halfway still leaves its evidence on disk. Thread-safe.

    history = History(path)
    history.record("fault", action="sigkill", target="executor-a", pid=1234)
    ...
    for r in History.load(path):
        ...
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.server import Background

__all__ = ["History", "Record"]

Record = dict[str, Any]


class History(Background):
    """Appends records to a JSONL file (and keeps them in memory for quick reads)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8")
        self._records: list[Record] = []

    def record(self, kind: str, **fields: Any) -> Record:
        """Append one record and return it (with its `seq`, `t` and `wall`)."""
        with self._lock:
            entry: Record = {
                "seq": len(self._records),
                "t": time.monotonic_ns(),
                "wall": time.time_ns(),
                "kind": kind,
                **fields,
            }
            line = json.dumps(entry, default=str, separators=(",", ":"))
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()
            self._records.append(entry)
            return entry

    def records(self, kind: str | None = None) -> list[Record]:
        """What was recorded so far (of `kind`, if given), oldest first."""
        with self._lock:
            return [r for r in self._records if kind is None or r["kind"] == kind]

    def last(self, kind: str) -> Record | None:
        with self._lock:
            for entry in reversed(self._records):
                if entry["kind"] == kind:
                    return entry
        return None

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _stop(self) -> None:
        self.close()

    @staticmethod
    def load(path: Path) -> list[Record]:
        """Every record of a history file, oldest first (a torn last line is ignored)."""
        return list(History.iter(path))

    @staticmethod
    def iter(path: Path) -> Iterator[Record]:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.endswith("\n"):
                    return  # the writer died mid-line
                yield json.loads(line)
