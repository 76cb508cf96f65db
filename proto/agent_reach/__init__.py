"""Agent-Reach contract package: states, transitions, error codes, ids and the wire protocol."""
