"""`reach`'s one-line failures: what counts as expected, and how it is said."""

from __future__ import annotations

import argparse

import pytest

from agent_reach_cli import failures


def test_a_bug_keeps_its_traceback() -> None:
    def broken(args: argparse.Namespace) -> int:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        failures.run(broken, argparse.Namespace())


def test_an_expected_failure_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def refuses(args: argparse.Namespace) -> int:
        raise failures.CommandError("no such\n  thing")

    assert failures.run(refuses, argparse.Namespace()) == 2
    assert capsys.readouterr().err == "reach: no such thing\n"


def test_a_group_is_said_when_every_part_is_expected() -> None:
    group = ExceptionGroup("start", [failures.CommandError("a"), FileNotFoundError(2, "gone", "f")])
    assert failures.explain(group) == "a; cannot use f: gone"
    assert (
        failures.explain(ExceptionGroup("start", [failures.CommandError("a"), KeyError()])) is None
    )
