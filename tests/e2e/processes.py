"""Real processes for end-to-end tests: controllers, executors and `reach dev`, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent_reach_controller.identity import keys
from agent_reach_controller.identity.keys import new_key
from agent_reach_controller.identity.pools import token_hash

REACH = [sys.executable, "-m", "agent_reach_cli.main"]
# The admin key of test clusters (a controller's bootstrap key; never a real deployment's).
TEST_API_KEY = new_key().token
# The executor pool token of test clusters: controllers admit it through a provisioning file that
# holds its hash, executors present it; executor authentication is on in every test cluster.
TEST_EXECUTOR_TOKEN = new_key(keys.POOL_TOKEN_PREFIX).token


def write_token_file(path: Path, *entries: dict[str, Any]) -> Path:
    """A controller's `--executor-tokens` file: the test pool, plus `entries`."""
    pools = [{"name": "test", "sha256": token_hash(TEST_EXECUTOR_TOKEN)}, *entries]
    path.write_text(json.dumps({"tokens": pools}))
    return path


def wait_until(
    predicate: Callable[[], Any], *, within: float, what: str, every: float = 0.05
) -> Any:
    """Poll `predicate` until it returns something truthy; fail with `what` after `within` s."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    info: dict[str, Any] = field(default_factory=dict)

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Cluster:
    """Starts processes in a temp dir and stops every one of them at the end."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        # Every controller accepts this admin key, and every `reach` client command sends it.
        self.api_key = TEST_API_KEY
        self.executor_token = TEST_EXECUTOR_TOKEN
        self.tokens_file = write_token_file(workdir / "executor-tokens.json")
        self.env = {
            **os.environ,
            "AGENT_REACH_CONTROLLER_BOOTSTRAP_KEY": self.api_key,
            "AGENT_REACH_API_KEY": self.api_key,
            "AGENT_REACH_CONTROLLER_EXECUTOR_TOKENS": str(self.tokens_file),
            "AGENT_REACH_EXECUTOR_TOKEN": self.executor_token,
            **(env or {}),
        }
        self.procs: list[Proc] = []

    def spawn(self, name: str, args: list[str]) -> Proc:
        """Any `reach` command as a process of the cluster (a demo service, say)."""
        return self._spawn(name, args)

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log = self.workdir / f"{name}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(
            [*REACH, *args],
            cwd=self.workdir,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        handle.close()
        proc = Proc(name=name, popen=popen, log=log)
        self.procs.append(proc)
        return proc

    def _await_ready_file(self, proc: Proc, ready: Path) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            if proc.popen.poll() is not None:
                raise AssertionError(f"{proc.name} exited early:\n{proc.output()[-4000:]}")
            if ready.exists() and ready.read_text():
                parsed: dict[str, Any] = json.loads(ready.read_text())
                return parsed
            return None

        info: dict[str, Any] = wait_until(read, within=60, what=f"{proc.name} to listen")
        proc.info = info
        return info

    def controller(
        self, name: str, *, database_url: str, tools: Path, extra: Sequence[str] = ()
    ) -> Proc:
        ready = self.workdir / f"{name}.ready.json"
        proc = self._spawn(
            name,
            [
                "controller",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--database-url",
                database_url,
                "--tools",
                str(tools),
                "--ready-file",
                str(ready),
                *extra,
            ],
        )
        self._await_ready_file(proc, ready)
        return proc

    def executor(
        self, name: str, *, controller: Proc, slots: int = 8, extra: Sequence[str] = ()
    ) -> Proc:
        return self._spawn(
            name,
            ["executor", "--controller", controller.info["grpc"], "--slots", str(slots), *extra],
        )

    def dev(self, name: str, *, tools: Path, extra: Sequence[str] = ()) -> Proc:
        ready = self.workdir / f"{name}.ready.json"
        proc = self._spawn(
            name,
            [
                "dev",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--tools",
                str(tools),
                "--ready-file",
                str(ready),
                "--log-format",
                "json",
                *extra,
            ],
        )
        self._await_ready_file(proc, ready)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate(timeout=15)


@contextlib.contextmanager
def cluster(workdir: Path, env: dict[str, str] | None = None) -> Iterator[Cluster]:
    c = Cluster(workdir, env)
    try:
        yield c
    finally:
        c.stop_all()


def api(proc: Proc) -> httpx.Client:
    """An HTTP client of a controller started by a Cluster, with the cluster's admin key."""
    return httpx.Client(
        base_url=f"http://{proc.info['http']}",
        timeout=30,
        headers={"Authorization": f"Bearer {TEST_API_KEY}"},
    )


def all_terminal(client: httpx.Client, task_ids: list[str]) -> list[dict[str, Any]] | None:
    tasks = [client.get(f"/v1/tasks/{t}").json() for t in task_ids]
    if all(t["status"] in ("succeeded", "failed", "cancelled") for t in tasks):
        return tasks
    return None
