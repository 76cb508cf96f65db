"""The previous release, read from git: what upgrades and compatibility checks compare against."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The last release (0.1.0): executors without tokens, sessions or lease tokens.
PREVIOUS_RELEASE = "dcd54095d30ec60e544521a243285cd4bc656cba"
PACKAGES = ("proto", "controller", "executor", "connectors")


def unpack(where: Path, *paths: str, commit: str = PREVIOUS_RELEASE) -> Path:
    """`paths` of `commit` (the previous release by default) under `where`."""
    archive = where / "release.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, *paths], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(where, filter="data")
    archive.unlink()
    return where
