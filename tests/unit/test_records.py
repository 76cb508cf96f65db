"""Rows read from storage become frozen values field by field (records.py): every column must
have its field, or reading it would drop it without a word."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from agent_reach.states import StepStatus, TaskStatus
from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.storage.schema import steps, tasks


@pytest.mark.parametrize(("table", "row"), [(steps, StepRow), (tasks, TaskRow)])
def test_every_column_has_its_field(table: object, row: type) -> None:
    fields = {f.name for f in dataclasses.fields(row)}
    assert set(table.c.keys()) <= fields  # type: ignore[attr-defined]


def test_a_row_read_field_by_field_equals_one_built_by_its_constructor() -> None:
    now = datetime.now(UTC)
    values = {
        **dict.fromkeys(steps.c.keys()),
        "id": 7,
        "task_id": "t",
        "step_id": "a",
        "position": 0,
        "trace_id": "0" * 32,
        "tool": "echo.say",
        "tool_version": "1",
        "connector": "echo",
        "args": {"n": 1},
        "depends_on": ["b"],
        "status": "running",
        "attempt": 2,
        "max_attempts": 3,
        "idempotency_key": "t:a",
        "created_at": now,
        "updated_at": now,
        "priority": 0,
        "tenant": "default",
        "environment": "sandbox",
        "queued_at": now,
        "not_a_field": "ignored",
    }
    read = StepRow.from_mapping(values)
    built = StepRow(
        **{
            **{k: v for k, v in values.items() if k != "not_a_field"},
            "status": StepStatus.RUNNING,
            "depends_on": ("b",),
        }
    )
    assert read == built
    assert read.status is StepStatus.RUNNING
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.status = StepStatus.READY  # type: ignore[misc]
    task = TaskRow.from_mapping(
        {
            **dict.fromkeys(tasks.c.keys()),
            "task_id": "t",
            "status": "pending",
            "version": 1,
            "tenant": "default",
        }
    )
    assert task.status is TaskStatus.PENDING
    assert task.input_tokens is None  # as read: the column's value, not the field's default


def test_a_row_stored_before_environments_reads_as_dev() -> None:
    """Rows a release before 0025 wrote have no environment (NULL): their tasks ran in dev."""
    now = datetime.now(UTC)
    step = StepRow.from_mapping(
        {
            **dict.fromkeys(steps.c.keys()),
            "status": "ready",
            "depends_on": [],
            "created_at": now,
            "updated_at": now,
        }
    )
    task = TaskRow.from_mapping({**dict.fromkeys(tasks.c.keys()), "status": "pending"})
    assert (step.environment, task.environment) == ("dev", "dev")
    prod = TaskRow.from_mapping(
        {**dict.fromkeys(tasks.c.keys()), "status": "pending", "environment": "prod"}
    )
    assert prod.environment == "prod"
