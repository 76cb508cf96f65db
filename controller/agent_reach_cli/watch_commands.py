"""`reach status TASK_ID --watch`: follow a task's event stream and redraw its plan tree.

On a terminal the tree is redrawn in place (plain ANSI: cursor up, clear below); otherwise each
change is one line. A stream that closes before the task ends (the server's duration limit, a
replica restarting) is resumed with Last-Event-ID. Exit 0 when the task succeeded, 1 when it ended
otherwise (or the server refused), 2 when the controller cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

import httpx

from agent_reach_cli.client_commands import _print, _url, auth_headers
from agent_reach_cli.plan_tree import SseParser, TaskState, apply_event, plan_from, render_tree

# Heartbeats come every 15 s; four missed ones mean the connection is gone.
READ_TIMEOUT_S = 60.0
# Give up after this long without a working stream.
GIVE_UP_AFTER_S = 30.0
RETRYABLE = frozenset({429, 502, 503, 504})


class Screen(Protocol):
    def changed(self, state: TaskState, lines: list[str]) -> None: ...

    def finish(self, state: TaskState) -> None: ...


class Redraw:
    """The tree, redrawn in place on a terminal after every chunk of events."""

    def __init__(self, out: TextIO, *, unicode: bool) -> None:
        self._out = out
        self._unicode = unicode
        self._drawn = 0

    def changed(self, state: TaskState, lines: list[str]) -> None:
        del lines
        self._draw(state)

    def finish(self, state: TaskState) -> None:
        self._draw(state)

    def _draw(self, state: TaskState) -> None:
        width = max(20, _columns() - 1)
        tree = [line[:width] for line in render_tree(state, now=_now(), unicode=self._unicode)]
        # Back to the first line drawn last time, clear to the end of the screen, draw again.
        up = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
        self._out.write(up + "\n".join(tree) + "\n")
        self._out.flush()
        self._drawn = len(tree)


class Lines:
    """One line per change (stdout is not a terminal), then the final tree."""

    def __init__(self, out: TextIO, *, unicode: bool) -> None:
        self._out = out
        self._unicode = unicode

    def changed(self, state: TaskState, lines: list[str]) -> None:
        del state
        for line in lines:
            self._out.write(line + "\n")
        self._out.flush()

    def finish(self, state: TaskState) -> None:
        self._out.write("\n".join(render_tree(state, now=_now(), unicode=self._unicode)) + "\n")
        self._out.flush()


class _Refused(Exception):
    """The server answered the stream with an error that waiting will not fix."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class _Busy(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


def watch(args: argparse.Namespace) -> int:
    headers = auth_headers(args)
    url = f"{_url(args)}/v1/tasks/{args.task_id}"
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    with httpx.Client(timeout=timeout, headers=headers) as client:
        try:
            first = client.get(url)
        except httpx.HTTPError as exc:
            print(f"reach: cannot reach the controller at {url}: {exc}", file=sys.stderr)
            return 2
        if not first.is_success:
            _print(first)
            return 1
        state = plan_from(first.json())
        unicode = _can_encode(sys.stdout, "├─✓✗▶○⊘│└·→")
        screen: Screen = (
            Redraw(sys.stdout, unicode=unicode)
            if sys.stdout.isatty()
            else Lines(sys.stdout, unicode=unicode)
        )
        return _follow(client, f"{url}/events", state, screen)


def _follow(client: httpx.Client, url: str, state: TaskState, screen: Screen) -> int:
    """Stream until the end message, reconnecting where the last stream stopped."""
    parser = SseParser()
    failing_since: float | None = None
    while True:
        try:
            ended = _stream(client, url, parser, state, screen)
            failing_since = None
        except _Refused as refused:
            _print(refused.response)
            return 1
        except (httpx.HTTPError, _Busy) as exc:
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > GIVE_UP_AFTER_S:
                print(f"reach: lost the event stream at {url}: {exc}", file=sys.stderr)
                return 2
            time.sleep(exc.retry_after if isinstance(exc, _Busy) else 1.0)
            continue
        if ended is not None:
            screen.finish(state)
            return 0 if ended == "succeeded" else 1


def _stream(
    client: httpx.Client, url: str, parser: SseParser, state: TaskState, screen: Screen
) -> str | None:
    """One connection: apply its events; the task's final status if it ended, else None."""
    headers = {"Accept": "text/event-stream"}
    if parser.last_id is not None:
        headers["Last-Event-ID"] = parser.last_id
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code in RETRYABLE:
            raise _Busy(_retry_after(response))
        if not response.is_success:
            response.read()
            raise _Refused(response)
        for chunk in response.iter_text():
            changes: list[str] = []
            for message in parser.feed(chunk):
                data: dict[str, Any] = json.loads(message.data)
                if message.event == "end":
                    if changes:
                        screen.changed(state, changes)
                    state.status = str(data["status"])
                    return state.status
                changes.append(apply_event(state, data))
            if changes:
                screen.changed(state, changes)
    return None


def _retry_after(response: httpx.Response) -> float:
    value = response.headers.get("retry-after", "")
    return min(float(value), 10.0) if value.isdigit() else 1.0


def _can_encode(out: TextIO, text: str) -> bool:
    try:
        text.encode(out.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _columns() -> int:
    return shutil.get_terminal_size().columns


def _now() -> datetime:
    return datetime.now(UTC)
