"""Why a replica does not serve a request it would serve later or elsewhere (see api/errors.py)."""

from __future__ import annotations


class NotServingError(Exception):
    """Nothing is wrong with the request, but it is not served here now: the caller retries
    after `retry_after` seconds (another replica may answer at once)."""

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class ShuttingDownError(NotServingError):
    """This replica is stopping: it finishes what it serves and takes nothing new."""


class NotStartedError(NotServingError):
    """This replica does not serve this yet (its server is still starting)."""


class StorageUnavailableError(Exception):
    """The database did not answer a route that asks it directly (readiness, pool figures)."""
