"""The transition table: only legal moves, terminal states absorbing, tasks derived honestly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.states import (
    STEP_TRANSITIONS,
    TERMINAL_STEP_STATES,
    IllegalTransitionError,
    StepStatus,
    TaskStatus,
    Transition,
    apply,
    derive_task_status,
    is_legal,
)

# The edges of ARCHITECTURE.md's state diagram, written out independently of the table they check.
DESIGN_EDGES = {
    ("blocked", "ready"),
    ("blocked", "skipped"),
    ("blocked", "failed"),
    ("blocked", "cancelled"),
    ("ready", "running"),
    ("ready", "awaiting_approval"),
    ("ready", "cancelled"),
    ("running", "succeeded"),
    ("running", "ready"),
    ("running", "failed"),
    ("running", "outcome_unknown"),
    ("running", "cancelled"),
    ("awaiting_approval", "ready"),
    ("awaiting_approval", "rejected"),
    ("awaiting_approval", "cancelled"),
    ("outcome_unknown", "ready"),
    ("outcome_unknown", "succeeded"),
    ("outcome_unknown", "failed"),
    ("outcome_unknown", "cancelled"),
    # Beyond the diagram, for issue 3's schedule_to_start: a queued attempt no executor took in
    # time fails from the queue, or is re-routed (queued again) to the tool's fallback.
    ("ready", "failed"),
    ("ready", "ready"),
    # A fan-out step (issue 14) never runs: it ends from blocked once its children have.
    ("blocked", "succeeded"),
    # A verified write whose check did not hold waits for a person (its tool says ask).
    ("blocked", "outcome_unknown"),
}


def test_table_matches_design() -> None:
    edges = {(src.value, to.value) for frm, to in STEP_TRANSITIONS.values() for src in frm}
    assert edges == DESIGN_EDGES


@given(st.lists(st.sampled_from(list(Transition)), max_size=40))
def test_random_sequences_only_take_legal_edges(sequence: list[Transition]) -> None:
    status = StepStatus.BLOCKED
    for transition in sequence:
        before = status
        try:
            status = apply(status, transition)
        except IllegalTransitionError:
            assert status == before
            continue
        assert (before.value, status.value) in DESIGN_EDGES
        assert is_legal(before, status)
        assert before not in TERMINAL_STEP_STATES


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STEP_STATES))
def test_terminal_states_are_absorbing(terminal: StepStatus) -> None:
    for transition in Transition:
        with pytest.raises(IllegalTransitionError):
            apply(terminal, transition)


@given(st.lists(st.sampled_from(list(StepStatus)), min_size=1, max_size=12))
def test_task_is_terminal_only_when_every_step_is(statuses: list[StepStatus]) -> None:
    task = derive_task_status(statuses)
    all_terminal = all(s in TERMINAL_STEP_STATES for s in statuses)
    assert (task in {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED}) == all_terminal
    if task is TaskStatus.SUCCEEDED:
        assert all(s in (StepStatus.SUCCEEDED, StepStatus.SKIPPED) for s in statuses)
