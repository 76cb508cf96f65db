"""The hot path's hand-written SQL agrees with the state machine it bypasses."""

from __future__ import annotations

from agent_reach.states import StepStatus, Transition, sources, target
from agent_reach_controller.storage import claims


def test_the_one_statement_claim_leases_what_the_state_machine_says() -> None:
    # CLAIM_READY spells the statuses out: ready steps are leased, and become running.
    assert sources(Transition.LEASE) == {StepStatus.READY}
    assert target(Transition.LEASE) is StepStatus.RUNNING
    assert "status = 'ready'" in claims.CLAIM_READY
    assert "SET status = 'running'" in claims.CLAIM_READY
