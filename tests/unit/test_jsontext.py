"""Compact JSON (domain/jsontext.py): orjson's bytes are `json.dumps`'s, and what orjson will not
write goes to `json.dumps`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach_controller.domain.jsontext import compact


def reference(value: Any) -> bytes:
    """What the hot path wrote before: `json.dumps`, compact, datetimes in ISO 8601."""

    def default(v: Any) -> Any:
        if isinstance(v, datetime):
            return v.isoformat()
        raise TypeError(type(v).__name__)

    text = json.dumps(value, default=default, separators=(",", ":"), ensure_ascii=False)
    return text.encode()


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.datetimes(timezones=st.just(UTC)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_the_bytes_are_those_json_dumps_wrote(value: Any) -> None:
    assert json.loads(compact(value)) == json.loads(reference(value))
    if not _has_float(value):  # floats: both round-trip exactly, their spellings may differ
        assert compact(value) == reference(value)


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, list):
        return any(map(_has_float, value))
    if isinstance(value, dict):
        return any(map(_has_float, value.values()))
    return False


def test_timestamps_keep_their_offset_and_microseconds() -> None:
    east = timezone(timedelta(hours=2))
    stamps = [datetime(2026, 12, 6, 11, 0, tzinfo=UTC), datetime(2026, 1, 2, 3, 4, 5, 6, east)]
    assert compact(stamps) == b'["2026-12-06T11:00:00+00:00","2026-01-02T03:04:05.000006+02:00"]'


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (2**64, b"18446744073709551616"),  # beyond orjson's 64 bits: exact all the same
        ({1: "a"}, b'{"1":"a"}'),  # a key that is not a string, as json.dumps writes it
        ("x\ud800", b'"x\\ud800"'),  # an unpaired surrogate, escaped (Postgres refuses it)
    ],
)
def test_what_orjson_refuses_is_written_as_json_dumps_writes_it(value: Any, written: bytes) -> None:
    assert compact(value) == written


def test_what_neither_can_write_is_refused() -> None:
    with pytest.raises(TypeError):
        compact({"a": object()})
