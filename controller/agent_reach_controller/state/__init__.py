"""The state machine's use cases: submit, advance, dispatch, record results, cancel."""
