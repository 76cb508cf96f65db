"""Flow control at dispatch: circuit breakers (concurrency caps live in the claim itself)."""
