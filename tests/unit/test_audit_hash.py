"""The audit chain's hash: its exact input, what changes it, and the chain checker."""

from __future__ import annotations

import hashlib
import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from agent_reach_controller.audit.chain import (
    GENESIS,
    ChainChecker,
    Entry,
    canonical,
    entry_hash,
    iso_utc,
)
from agent_reach_controller.audit.log import MAX_DATA_CHARS, _checked_data

AT = datetime(2026, 11, 30, 8, 0, 0, 123456, tzinfo=UTC)


def entry(seq: int = 1, **changes: object) -> Entry:
    fields: dict[str, object] = {
        "seq": seq,
        "at": AT,
        "actor": "alice",
        "tenant": "acme",
        "action": "task.submit",
        "target": "task:t-1",
        "data": {"steps": 2, "goal": "北京 weather"},
    }
    fields.update(changes)
    return Entry(**fields)  # type: ignore[arg-type]


def test_canonical_json_is_exact() -> None:
    assert canonical(entry()) == (
        '{"action":"task.submit","actor":"alice","at":"2026-11-30T08:00:00.123456Z",'
        '"data":{"goal":"北京 weather","steps":2},"seq":1,"target":"task:t-1","tenant":"acme"}'
    )


def test_hash_is_sha256_of_prev_hash_then_canonical_json() -> None:
    expected = hashlib.sha256((GENESIS + canonical(entry())).encode("utf-8")).hexdigest()
    assert entry_hash(GENESIS, entry()) == expected
    assert len(expected) == 64
    # Pinned, so a change of format cannot go unnoticed (it would break every stored chain).
    assert expected == "183dc7cfa9e60f81b1f023ece95b4f06b754a0481e87f01600d511afd138e223"


def test_key_order_and_time_zone_do_not_matter() -> None:
    reordered = entry(data={"goal": "北京 weather", "steps": 2})
    shanghai = entry(at=AT.astimezone(timezone(timedelta(hours=8))))
    assert entry_hash(GENESIS, reordered) == entry_hash(GENESIS, entry())
    assert entry_hash(GENESIS, shanghai) == entry_hash(GENESIS, entry())
    assert iso_utc(shanghai.at) == "2026-11-30T08:00:00.123456Z"


@pytest.mark.parametrize(
    "change",
    [
        {"seq": 2},
        {"at": AT + timedelta(microseconds=1)},
        {"actor": "mallory"},
        {"tenant": None},
        {"action": "task.cancel"},
        {"target": "task:t-2"},
        {"data": {"steps": 3, "goal": "北京 weather"}},
    ],
)
def test_every_field_is_hashed(change: dict[str, object]) -> None:
    assert entry_hash(GENESIS, entry(**change)) != entry_hash(GENESIS, entry())


def test_prev_hash_is_hashed() -> None:
    assert entry_hash("f" * 64, entry()) != entry_hash(GENESIS, entry())


def test_naive_times_and_nan_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        entry_hash(GENESIS, entry(at=AT.replace(tzinfo=None)))
    with pytest.raises(ValueError, match="JSON compliant"):
        entry_hash(GENESIS, entry(data={"x": math.nan}))


def chain(n: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        e = entry(seq, target=f"task:t-{seq}")
        digest = entry_hash(prev, e)
        rows.append({"id": seq * 10, "entry": e, "prev_hash": prev, "hash": digest})
        prev = digest
    return rows


def check(rows: list[dict[str, object]]) -> ChainChecker:
    checker = ChainChecker()
    for row in rows:
        if checker.feed(**row):  # type: ignore[arg-type]
            break
    return checker


def test_an_intact_chain_passes() -> None:
    checker = check(chain(5))
    assert checker.problem is None
    assert checker.checked == 5
    assert checker.head_seq == 5


def test_a_missing_entry_is_a_gap_at_its_seq() -> None:
    rows = chain(5)
    del rows[2]
    problem = check(rows).problem
    assert problem is not None
    assert (problem.kind, problem.seq) == ("seq_gap", 3)
    assert "seq 4 (id 40)" in problem.detail


def test_a_changed_entry_is_a_hash_mismatch() -> None:
    rows = chain(5)
    rows[1]["entry"] = entry(2, target="task:other")
    problem = check(rows).problem
    assert problem is not None
    assert (problem.kind, problem.seq, problem.id) == ("hash_mismatch", 2, 20)


def test_a_broken_link_is_a_prev_hash_mismatch() -> None:
    rows = chain(5)
    rows[3]["prev_hash"] = "a" * 64
    checker = check(rows)
    assert checker.problem is not None
    assert (checker.problem.kind, checker.problem.seq) == ("prev_hash_mismatch", 4)
    assert checker.checked == 3


def test_a_row_with_seq_but_no_hash_is_incomplete() -> None:
    rows = chain(2)
    rows[1]["hash"] = None
    problem = check(rows).problem
    assert problem is not None
    assert (problem.kind, problem.seq) == ("incomplete_seal", 2)


def test_audit_data_refuses_secrets_and_bulk() -> None:
    assert _checked_data({"key_id": "k1", "roles": ["admin"], "secret_hash": "x"}) == {
        "key_id": "k1",
        "roles": ["admin"],
        "secret_hash": "x",
    }
    for bad in (
        {"token": "t"},
        {"headers": {"Authorization": "Bearer x"}},
        {"items": [{"api_key": "k"}]},
        {"client_secret": "s"},
    ):
        with pytest.raises(ValueError, match="secrets"):
            _checked_data(bad)
    with pytest.raises(ValueError, match="characters"):
        _checked_data({"blob": "x" * MAX_DATA_CHARS})
    assert _checked_data(None) == {}


def test_a_seq_below_the_expected_one_is_a_gap_too() -> None:
    rows = chain(3)
    rows[1]["entry"] = entry(1, target="task:t-2")
    problem = check(rows).problem
    assert problem is not None
    assert (problem.kind, problem.seq) == ("seq_gap", 2)
    assert problem.detail == "expected seq 2, found seq 1 (id 20)"


# An entry with what JSON makes hard: no tenant, a time that is not UTC and has no microseconds,
# escapes, characters beyond the BMP, keys that sort differently as bytes and as code points,
# numbers of every kind, empty and nested containers.
AWKWARD = entry(
    seq=9_007_199_254_740_993,
    at=datetime(2026, 3, 29, 1, 30, 0, 0, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
    actor='key:"q"\\\n',
    tenant=None,
    action="tool.update",
    target="tool:\u2028\x01/é",
    data={
        "é": 1,
        "z": -0.0,
        "a": [1.5, 1e300, 10**30, True, False, None, {}, []],
        "Z": {"😀": "\t", "b": {"": "\x7f"}},
    },
)


def test_an_awkward_entry_is_pinned_too() -> None:
    assert canonical(AWKWARD) == (
        '{"action":"tool.update","actor":"key:\\"q\\"\\\\\\n","at":"2026-03-29T11:00:00.000000Z",'
        '"data":{"Z":{"b":{"":"\x7f"},"😀":"\\t"},"a":[1.5,1e+300,1000000000000000000000000000000,'
        'true,false,null,{},[]],"z":-0.0,"é":1},"seq":9007199254740993,'
        '"target":"tool:\u2028\\u0001/é","tenant":null}'
    )
    assert entry_hash("ab" * 32, AWKWARD) == (
        "1f412a96684a42876b457349a8de1c6dbe0e9eef5d26d04495b02a238177de10"
    )


def test_a_year_before_1000_keeps_strftimes_spelling() -> None:
    # Not a time any entry was made at, but the spelling a hash covers never changes.
    assert iso_utc(datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC)) == "999-01-02T03:04:05.000000Z"


def reference_canonical(e: Entry) -> str:
    """The definition the chain's docstring gives, spelled the plain way."""
    return json.dumps(
        {
            "seq": e.seq,
            "at": e.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "actor": e.actor,
            "tenant": e.tenant,
            "action": e.action,
            "target": e.target,
            "data": e.data,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def test_canonical_json_is_the_definitions_byte_for_byte() -> None:
    rng = random.Random(33)
    alphabet = 'aZ09 _-:/"\\\n\t\x00\x1f\x7fé北😀\u2028'

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))

    def value(depth: int) -> object:
        kind = rng.randrange(8 if depth < 3 else 5)
        leaves = [
            text,
            lambda: rng.randrange(-(2**70), 2**70),
            lambda: rng.uniform(-1e9, 1e9) * 10 ** rng.randrange(-320, 300),
            lambda: rng.choice([True, False, None]),
            lambda: rng.randrange(-5, 5),
        ]
        if kind < len(leaves):
            return leaves[kind]()
        if kind == 5:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {text(): value(depth + 1) for _ in range(rng.randrange(4))}

    for seq in range(1, 501):
        offset = timedelta(minutes=rng.randrange(-14 * 60, 14 * 60))
        at = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(10**16))
        e = entry(
            seq=seq,
            at=at.astimezone(timezone(offset)),
            actor=text() or "a",
            tenant=rng.choice([None, text()]),
            action=text() or "x.y",
            target=text() or "t",
            data={text(): value(0) for _ in range(rng.randrange(5))},
        )
        assert canonical(e) == reference_canonical(e)
        assert (
            entry_hash(GENESIS, e)
            == hashlib.sha256((GENESIS + reference_canonical(e)).encode("utf-8")).hexdigest()
        )
