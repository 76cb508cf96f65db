"""Pure rules with no I/O: how a task advances, what an outcome means, approvals,
breakers, caps and rate limits."""
