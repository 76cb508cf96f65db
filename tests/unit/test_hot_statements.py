"""The hot path's hand-written SQL agrees with the state machine it bypasses."""

from __future__ import annotations

import psycopg._queries

from agent_reach.states import StepStatus, Transition, sources, target
from agent_reach_controller.storage import claims, commit


def test_the_one_statement_claim_leases_what_the_state_machine_says() -> None:
    # CLAIM_READY spells the statuses out: ready steps are leased, and become running.
    assert sources(Transition.LEASE) == {StepStatus.READY}
    assert target(Transition.LEASE) is StepStatus.RUNNING
    assert "status = 'ready'" in claims.CLAIM_READY
    assert "SET status = 'running'" in claims.CLAIM_READY


def test_the_claims_stay_short_enough_for_psycopg_to_cache_their_parse() -> None:
    """A longer text has its placeholders found afresh on every execute, and a claim runs on
    nearly every poll (the guarded one was 4,269 characters before `tight`)."""
    assert commit.PARSE_CACHED_CHARS <= psycopg._queries.MAX_CACHED_STATEMENT_LENGTH
    for sql in (claims.CLAIM_READY, claims.CLAIM_READY_GUARDED, claims.FAIR_ORDER):
        assert len(sql.encode()) <= commit.PARSE_CACHED_CHARS


def test_tight_drops_whitespace_only_and_a_comment_still_ends_at_its_line() -> None:
    sql = "\n    SELECT 1  -- the first\n\n        , 'a  b'\n    FROM t\n"
    assert commit.tight(sql) == "SELECT 1  -- the first\n, 'a  b'\nFROM t"
    assert commit.tight(sql).split() == sql.split()
    composed = commit.compose((("\n    SELECT 1 AS one\n      FROM t\n", "one"),))
    assert composed == "WITH q0 AS (SELECT 1 AS one\nFROM t) SELECT (SELECT one FROM q0)"
