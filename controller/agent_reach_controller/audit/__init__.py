"""The append-only, hash-chained audit log (see `log` for how it is written and checked)."""

from agent_reach_controller.audit.chain import GENESIS, Entry, Problem, entry_hash
from agent_reach_controller.audit.log import VerifyReport, record, seal, verify

__all__ = ["GENESIS", "Entry", "Problem", "VerifyReport", "entry_hash", "record", "seal", "verify"]
