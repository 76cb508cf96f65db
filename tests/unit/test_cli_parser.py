"""`reach` argument parsing: flags given before a subcommand are not lost after it."""

from __future__ import annotations

import pytest

from agent_reach_cli.main import build_parser


@pytest.mark.parametrize(
    ("argv", "url", "key"),
    [
        (["tools", "--url", "http://a", "--api-key", "k1", "show", "x"], "http://a", "k1"),
        (["tools", "show", "x", "--url", "http://b", "--api-key", "k2"], "http://b", "k2"),
        (["tools", "--url", "http://c", "export"], "http://c", None),
        (["tools"], None, None),
        (["replay", "T", "--url", "http://d"], "http://d", None),
        (["trace", "export", "T", "--api-key", "k3"], None, "k3"),
    ],
)
def test_client_flags_reach_the_command(argv: list[str], url: str | None, key: str | None) -> None:
    args = build_parser().parse_args(argv)
    assert (args.url, args.api_key) == (url, key)


def test_list_flags_before_the_list_subcommand_are_kept() -> None:
    args = build_parser().parse_args(["tools", "--format", "openai", "--include-disabled", "list"])
    assert (args.format, args.include_disabled) == ("openai", True)
    plain = build_parser().parse_args(["tools", "list"])
    assert (plain.format, plain.include_disabled) == ("native", False)


@pytest.mark.parametrize(
    ("flags", "stream"),
    [([], None), (["--stream"], True), (["--no-stream"], False)],
)
def test_the_executor_stream_flag_is_left_to_the_environment_unless_given(
    flags: list[str], stream: bool | None
) -> None:
    """None leaves AGENT_REACH_EXECUTOR_STREAM (or the default, off) to decide."""
    args = build_parser().parse_args(["executor", "--controller", "c:1", *flags])
    assert args.stream is stream
