"""The image's install, reproduced without a container engine: deploy/Dockerfile's build-stage RUN
lines run as written (its /opt/reach is a scratch virtualenv, its /src a scratch copy of exactly
what the COPY lines and Dockerfile.dockerignore let in), then both entrypoints run as an
unprivileged user whose working directory and HOME it cannot write, as on the image's read-only
root filesystem, and carry out a task. The installed size is reported.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.processes import wait_until
from tests.support.pgserver import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
BUILD_STAGE, FINAL_STAGE = DOCKERFILE.split("\nFROM ")[1:3]
UNPRIVILEGED = "nobody"


def _as_user() -> list[str]:
    """How to run a command as someone who cannot write the working directory: root drops to
    `nobody` (root writes anywhere), as the image's USER; anyone else is already bound by the
    directory's mode."""
    if os.geteuid() != 0:
        return []
    user = pwd.getpwnam(UNPRIVILEGED)
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"  # execs: signals reach the process
    return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def _python() -> str:
    """A Python 3.11+ the unprivileged user may run (root's own may sit in an unreadable home)."""
    for candidate in (sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"):
        probe = subprocess.run(
            [*_as_user(), candidate, "-c", "import sys; assert sys.version_info >= (3, 11)"],
            cwd="/",
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    pytest.fail("no Python 3.11+ that an unprivileged user can run")


def _stage_env(stage: str) -> dict[str, str]:
    env = {}
    for line in stage.splitlines():
        if line.startswith("ENV "):
            for name, value in re.findall(r"(\w+)=(\S+)", line):
                env[name] = value
    return env


def _run_lines(stage: str) -> list[str]:
    text = stage.replace("\\\n", " ")
    return [
        line.removeprefix("RUN ").strip() for line in text.splitlines() if line.startswith("RUN ")
    ]


@pytest.fixture(scope="module")
def image() -> Iterator[Path]:
    """/opt/reach, built as the Dockerfile builds it."""
    scratch = Path(tempfile.mkdtemp(prefix="reach-image-", dir="/tmp"))
    scratch.chmod(0o755)
    venv, src = scratch / "opt-reach", scratch / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".mypy_cache")
    try:
        env = {"PATH": f"{Path(_python()).parent}:{os.environ['PATH']}", "HOME": str(scratch)}
        # Where this machine's pip finds packages, as a build host's network would serve them.
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
        env.update(_stage_env(BUILD_STAGE))
        for line in BUILD_STAGE.splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    (src / source).parent.mkdir(parents=True, exist_ok=True)
                    if (ROOT / source).is_dir():
                        shutil.copytree(ROOT / source, src / source, ignore=ignore)
                    else:
                        shutil.copy2(ROOT / source, src / source)
        python = _python()
        for line in _run_lines(BUILD_STAGE):
            command = line.replace("/opt/reach", str(venv))
            command = command.replace("python -m venv", f"{python} -m venv")
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=src,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        yield venv
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _spawn(
    venv: Path, home: Path, args: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*_as_user(), str(venv / "bin" / "reach"), *args],
            cwd=home,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_both_entrypoints_run_from_the_installed_image_without_writing(
    image: Path, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = image.parent
    home = scratch / "readonly-home"  # the image's working directory and HOME
    home.mkdir(mode=0o555)
    files = scratch / "etc"
    files.mkdir(mode=0o755)
    tools = files / "tools.yaml"
    tools.write_text(
        "tools:\n  - {name: echo.say, description: Echo, connector: echo,"
        " input_schema: {type: object}, risk: read, idempotent: true}\n"
    )
    reach = str(image / "bin" / "reach")
    made = subprocess.run(
        [reach, "executors", "create-token", "--offline", "--name", "image"],
        capture_output=True,
        text=True,
        check=True,
    )
    tokens = files / "executor-tokens.yaml"
    tokens.write_text(made.stderr[made.stderr.index("tokens:") :])
    for path in (tools, tokens):
        path.chmod(0o644)
    base = {
        "PATH": f"{image / 'bin'}:/usr/bin:/bin",
        **_stage_env(FINAL_STAGE),
        "HOME": str(home),
    }
    assert base["PYTHONDONTWRITEBYTECODE"] == "1"
    subprocess.run(
        [*_as_user(), reach, "migrate", "--database-url", postgres_url],
        cwd=home,
        env=base,
        check=True,
        capture_output=True,
    )
    key_made = subprocess.run(
        [
            reach,
            "keys",
            "create",
            "--database-url",
            postgres_url,
            "--name",
            "image",
            "--role",
            "admin",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    key = next(word for word in key_made.stdout.split() if word.startswith("ark_"))
    http, grpc = free_port(), free_port()
    controller = _spawn(
        image,
        home,
        [
            "controller",
            "--http",
            f"127.0.0.1:{http}",
            "--grpc",
            f"127.0.0.1:{grpc}",
            "--tools",
            str(tools),
        ],
        {
            **base,
            "AGENT_REACH_CONTROLLER_DATABASE_URL": postgres_url,
            "AGENT_REACH_CONTROLLER_EXECUTOR_TOKENS": str(tokens),
        },
        scratch / "controller.log",
    )
    metrics = free_port()
    executor_env = {
        **base,
        "AGENT_REACH_EXECUTOR_TOKEN": made.stdout.strip(),
        "AGENT_REACH_EXECUTOR_METRICS": f"127.0.0.1:{metrics}",
        "AGENT_REACH_HEALTH_URL": f"http://127.0.0.1:{metrics}/metrics",
    }
    executor = _spawn(
        image,
        home,
        ["executor", "--controller", f"127.0.0.1:{grpc}"],
        executor_env,
        scratch / "executor.log",
    )
    try:

        def health(env: dict[str, str], url: str | None = None) -> bool:
            for proc, log in ((controller, "controller.log"), (executor, "executor.log")):
                if proc.poll() is not None:
                    raise AssertionError((scratch / log).read_text()[-3000:])
            # The image's HEALTHCHECK, as it runs it.
            check = ["python", "-m", "agent_reach_cli.health", *(["--url", url] if url else [])]
            return (
                subprocess.run(
                    [*_as_user(), str(image / "bin" / check[0]), *check[1:]],
                    cwd=home,
                    env=env,
                    check=False,
                    capture_output=True,
                ).returncode
                == 0
            )

        wait_until(
            lambda: health(base, f"http://127.0.0.1:{http}/readyz"),
            within=60,
            what="the controller's health check",
        )
        wait_until(lambda: health(executor_env), within=60, what="the executor's health check")
        with httpx.Client(
            base_url=f"http://127.0.0.1:{http}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ) as api:
            body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {"said": "hi"}}]}
            task = api.post("/v1/tasks", json=body, params={"wait": 20}).json()
            assert task["status"] == "succeeded", task
    finally:
        for proc in (executor, controller):
            proc.terminate()
            proc.wait(30)
    assert list(home.iterdir()) == []
    assert controller.returncode == 0, (scratch / "controller.log").read_text()[-3000:]
    assert executor.returncode == 0, (scratch / "executor.log").read_text()[-3000:]
    size = sum(f.stat().st_size for f in image.rglob("*") if f.is_file() and not f.is_symlink())
    with capsys.disabled():
        print(f"\nthe image's /opt/reach, installed: {size / 2**20:.0f} MiB")
