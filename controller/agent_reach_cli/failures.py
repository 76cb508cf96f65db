"""What `reach` says when a command cannot go on: one sentence on stderr, never a traceback."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import Any

# A command that could not run at all (bad input, nothing to talk to), as argparse's own exit.
EXIT_CANNOT_RUN = 2
EXIT_INTERRUPTED = 130
# PyYAML's mark: where, then the line of the file it quotes (which may hold a secret) and a caret.
_YAML_MARK = re.compile(r'\s*in "<[^>]*>", (line \d+, column \d+):\n[^\n]*\n *\^')
# What a database that was never migrated answers (SQLite, Postgres).
_NOT_MIGRATED = re.compile(r"no such table|relation .* does not exist")


class CommandError(Exception):
    """A command cannot go on; its message is the sentence `reach` prints."""


def run(handler: Callable[[Any], int], args: Any) -> int:
    """`handler(args)`'s exit code; an expected failure becomes one line on stderr and exit 2.

    Anything `explain` does not know is a bug and keeps its traceback, for the report.
    """
    try:
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `reach … | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's own flush cannot fail too
        return 1
    except Exception as exc:
        said = explain(exc)
        if said is None:
            raise
        print(f"reach: {said}", file=sys.stderr)
        return EXIT_CANNOT_RUN


def explain(exc: BaseException) -> str | None:
    """An expected failure as one sentence (no secret: never a URL's credentials, never SQL
    parameters); None for anything else."""
    said = _said(exc)
    if said is None:
        return None
    return " ".join(_YAML_MARK.sub(r" at \1", said).split())  # one line, whatever it quoted


def _said(exc: BaseException) -> str | None:
    for kinds, say in _sayings():
        if isinstance(exc, kinds):
            return say(exc)
    if _is_database_error(exc):
        message = _driver_message(exc)
        hint = " (has `reach migrate` run on it?)" if _NOT_MIGRATED.search(message) else ""
        return f"database error: {message}{hint}"
    if isinstance(exc, BaseExceptionGroup):
        parts = [explain(inner) for inner in exc.exceptions]
        return None if None in parts else "; ".join(p for p in parts if p)
    return None


Saying = tuple[type[BaseException] | tuple[type[BaseException], ...], Callable[[Any], str]]


def _sayings() -> list[Saying]:
    """Expected failures, most specific first, and how each is said."""
    import httpx
    import pydantic
    import yaml

    from agent_reach.addresses import ListenError

    return [
        # Their message is the sentence; a file's names the file and what is wrong in it.
        ((CommandError, ListenError, *_file_errors()), str),
        (OSError, _os_said),
        (yaml.YAMLError, lambda exc: f"not valid YAML: {exc}"),
        (pydantic.ValidationError, _invalid_said),
        (
            httpx.HTTPError,
            lambda exc: f"cannot reach {_request_url(exc)}: {str(exc) or type(exc).__name__}",
        ),
        (httpx.InvalidURL, lambda exc: f"not a usable URL: {exc}"),
    ]


def _os_said(exc: OSError) -> str:
    return f"cannot use {exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc)


def _invalid_said(exc: Any) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
    )
    what = "settings" if exc.title.endswith("Settings") else exc.title
    return f"invalid {what}: {problems}"


def _file_errors() -> tuple[type[Exception], ...]:
    """Errors of the files a controller reads at start: tools, policy, console users."""
    from agent_reach_controller.identity.policy import PolicyFileError
    from agent_reach_controller.identity.sign_ins import ProxyUsersError
    from agent_reach_controller.tools.catalog import ToolFileError

    return (ToolFileError, PolicyFileError, ProxyUsersError)


def _request_url(exc: Any) -> str:
    try:
        return str(exc.request.url)
    except RuntimeError:  # an error raised before any request was made
        return "the server"


def _is_database_error(exc: BaseException) -> bool:
    """SQLAlchemy's or the driver's "cannot connect" or "cannot run that" (the CLI may not import
    SQLAlchemy: the storage layer alone does, so it is recognised by its module)."""
    return any(
        cls.__module__.partition(".")[0] in ("sqlalchemy", "psycopg", "sqlite3")
        and cls.__name__ in ("OperationalError", "InterfaceError", "ProgrammingError")
        for cls in type(exc).__mro__
    )


def _driver_message(exc: BaseException) -> str:
    """The driver's first line: SQLAlchemy's own text adds the statement and its parameters."""
    original = getattr(exc, "orig", None) or exc
    return str(original).strip().splitlines()[0] if str(original).strip() else type(exc).__name__
