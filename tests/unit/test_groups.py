"""GroupCommit: who runs alone, who waits to share a transaction, and what each caller hears."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from agent_reach_controller.services.groups import GroupCommit, GroupFailed


class Recorder:
    """`alone` and `together` that record their calls; a gate holds the first call open."""

    def __init__(self) -> None:
        self.alone_calls: list[int] = []
        self.groups: list[list[int]] = []
        self.gate = asyncio.Event()
        self.fail_group: BaseException | None = None
        self.refuse: set[int] = set()

    async def alone(self, item: int) -> str:
        self.alone_calls.append(item)
        if len(self.alone_calls) == 1:
            await self.gate.wait()
        if item in self.refuse:
            raise KeyError(item)
        return f"alone {item}"

    async def together(self, items: Sequence[int]) -> list[str]:
        self.groups.append(list(items))
        if self.fail_group is not None:
            raise self.fail_group
        return [f"together {i}" for i in items]


async def _started(rec: Recorder, n: int) -> None:
    """Let the event loop run until `n` alone calls have begun (bounded)."""
    for _ in range(1000):
        if len(rec.alone_calls) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{n} alone calls never began")


async def _while_busy(
    groups: GroupCommit[int, str], rec: Recorder, n: int, *, cancel: int | None = None
) -> list[str | BaseException]:
    """Call 0 .. n-1 at once: call 0 runs alone and holds the gate while the others arrive
    (call `cancel`, if given, then goes away); then the gate opens. Each call's answer."""
    calls = [asyncio.ensure_future(groups(i)) for i in range(n)]
    await _started(rec, 1)
    if cancel is not None:
        calls[cancel].cancel()
    rec.gate.set()
    return await asyncio.gather(*calls, return_exceptions=True)


async def test_a_lone_caller_never_waits_for_company() -> None:
    rec = Recorder()
    rec.gate.set()
    groups = GroupCommit(rec.alone, rec.together, open=1)
    assert [await groups(i) for i in range(3)] == ["alone 0", "alone 1", "alone 2"]
    assert rec.groups == []
    assert groups.stats.sizes == {1: 3}


async def test_callers_arriving_while_busy_share_the_next_transaction() -> None:
    rec = Recorder()
    groups = GroupCommit(rec.alone, rec.together, open=1, size=3)
    answers = await _while_busy(groups, rec, 6)
    assert answers == ["alone 0"] + [f"together {i}" for i in range(1, 6)]
    assert rec.groups == [[1, 2, 3], [4, 5]]  # at most `size` per transaction, in arrival order
    assert groups.stats.sizes == {1: 1, 3: 1, 2: 1}


async def test_a_refused_group_runs_each_member_alone_for_its_own_answer() -> None:
    rec = Recorder()
    rec.fail_group = GroupFailed(KeyError(2))
    rec.refuse = {2}
    groups = GroupCommit(rec.alone, rec.together, open=1)
    answers = await _while_busy(groups, rec, 4)
    assert answers[0] == "alone 0"
    assert answers[1] == "alone 1"
    assert isinstance(answers[2], KeyError)  # only the member that was refused fails
    assert answers[3] == "alone 3"
    assert groups.stats.split == 1


async def test_an_unknown_outcome_reaches_every_member() -> None:
    rec = Recorder()
    rec.fail_group = ConnectionError("lost during COMMIT")
    groups = GroupCommit(rec.alone, rec.together, open=1)
    answers = await _while_busy(groups, rec, 3)
    assert answers[0] == "alone 0"
    assert all(isinstance(a, ConnectionError) for a in answers[1:])
    assert rec.alone_calls == [0]  # never run again: the group may have committed


async def test_a_caller_that_went_away_is_left_out_of_its_group() -> None:
    rec = Recorder()
    groups = GroupCommit(rec.alone, rec.together, open=1)
    answers = await _while_busy(groups, rec, 4, cancel=2)
    assert isinstance(answers[2], asyncio.CancelledError)
    assert rec.groups == [[1, 3]]


def test_open_and_size_must_be_positive() -> None:
    async def alone(item: int) -> int:
        return item

    async def together(items: Sequence[int]) -> list[int]:
        return list(items)

    with pytest.raises(ValueError, match="open >= 1"):
        GroupCommit(alone, together, open=0)
