"""A private, throwaway PostgreSQL cluster on 127.0.0.1, for tests that crash and restart it.

The shared server on 5432 is used by other tests and must never be crashed; this one belongs to
the test session. Postgres refuses to run as root, so under root every server command runs as
the `postgres` OS user (`runuser -u postgres --`) in a temp dir that user owns.

    with PrivatePostgres.create() as pg:
        url = pg.url("postgres")
        pg.crash()   # pg_ctl stop -m immediate: no checkpoint, clients see their connection die
        pg.start()   # crash recovery, then accepting connections again

`fsync=off` and `full_page_writes=off`: a crash here kills processes, not the machine, so the
kernel's page cache still holds every acknowledged write and nothing committed is lost.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.server import Background, free_port

__all__ = ["PostgresUnavailableError", "PrivatePostgres", "find_bindir"]


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries, or no way to run them here."""


def find_bindir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin (or $AGENT_REACH_FAULTS_PG_BIN)."""
    override = os.environ.get("AGENT_REACH_FAULTS_PG_BIN")
    if override:
        return Path(override)
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for bindir in reversed(candidates):
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    raise PostgresUnavailableError("no initdb/pg_ctl found (set AGENT_REACH_FAULTS_PG_BIN)")


class PrivatePostgres(Background):
    """One initdb'd cluster in its own directory, on its own port, started and crashed at will."""

    def __init__(self, root: Path, *, port: int, bindir: Path, as_user: str | None) -> None:
        self.root = root
        self.data = root / "data"
        self.logfile = root / "server.log"
        self.port = port
        self.bindir = bindir
        self._as_user = as_user

    @classmethod
    def create(cls, *, port: int | None = None) -> PrivatePostgres:
        """initdb a new cluster in a fresh temp dir and start it."""
        bindir = find_bindir()
        as_user = "postgres" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="reach-private-pg-"))
        if as_user is not None:
            try:
                entry = pwd.getpwnam(as_user)
            except KeyError:
                shutil.rmtree(root, ignore_errors=True)
                raise PostgresUnavailableError(
                    "running as root, but there is no postgres user"
                ) from None
            os.chown(root, entry.pw_uid, entry.pw_gid)
        root.chmod(0o700)
        server = cls(root, port=port or free_port(), bindir=bindir, as_user=as_user)
        try:
            server._initdb()
            server.start()
        except BaseException:
            server.destroy()
            raise
        return server

    def _stop(self) -> None:
        self.destroy()

    def url(self, database: str = "postgres", *, port: int | None = None) -> str:
        """A libpq URL to `database`, over TCP (`port` overrides, e.g. a proxy in between)."""
        return (
            f"postgresql://postgres@127.0.0.1:{port or self.port}/{database}"
            "?sslmode=disable&gssencmode=disable"
        )

    def _run(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_user is not None:
            command = ["runuser", "-u", self._as_user, "--", *command]
        done = subprocess.run(
            command,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n"
                f"{self.server_log()[-3000:]}"
            )
        return done.stdout

    def _initdb(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            "max_connections": "200",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "on",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# agent-reach fault tests\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self) -> float:
        """Start the server (crash recovery included); returns the seconds it took."""
        began = time.monotonic()
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60", "start"
        )
        return time.monotonic() - began

    def crash(self) -> None:
        """Stop at once, without a checkpoint (as a crash would): `pg_ctl stop -m immediate`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def stop(self) -> None:
        """A clean shutdown (`-m fast`); quiet if it is not running."""
        if self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def running(self) -> bool:
        status = subprocess.run(
            [
                *(["runuser", "-u", self._as_user, "--"] if self._as_user else []),
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "status",
            ],
            capture_output=True,
            check=False,
        )
        return status.returncode == 0

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.logfile.read_text(errors="replace")
        return ""

    def destroy(self) -> None:
        """Stop the server (immediately) and delete its directory."""
        with contextlib.suppress(Exception):
            if self.running():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
