"""The Python client's types say what the API answers: every key they name is in its schemas."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from agent_reach_client import types
from pydantic import BaseModel

from agent_reach_controller.api import schemas

PAIRS = [
    (types.Task, schemas.TaskOut),
    (types.TaskError, schemas.TaskErrorOut),
    (types.Step, schemas.StepOut),
    (types.Turn, schemas.TurnReplies),
    (types.PendingCall, schemas.PendingCall),
    (types.Accepted, schemas.TaskAccepted),
    (types.Event, schemas.EventOut),
]


@pytest.mark.parametrize(("client", "server"), PAIRS, ids=lambda t: t.__name__)
def test_the_client_names_only_fields_the_api_answers_with(
    client: Any, server: type[BaseModel]
) -> None:
    assert set(get_type_hints(client)) <= set(server.model_fields)


def test_a_task_carries_its_error() -> None:
    assert "error" in get_type_hints(types.Task)
