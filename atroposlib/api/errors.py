"""Errors the API state raises for requests it refuses; ``factory.py`` maps each to its HTTP status.

::

    AtroposError
    └── ApiRequestError            a request the server refuses (status_code, detail, reason)
        ├── UnknownEnvError        404: env_id was never registered (or the API was reset)
        ├── InvalidGroupError      422: a scored group cannot be queued as sent
        ├── PayloadTooLargeError   413: a group larger than the queue itself
        ├── QueueFullError         429: the queue is at its limit; retry after ``retry_after`` s
        ├── IdempotencyKeyError    422: an Idempotency-Key too long, or reused for another body
        ├── StepConflictError      409: GET /batch?step=N for a batch that cannot be served
        └── InsufficientStorageError 507: the --db disk is full; retry after ``retry_after`` s

``reason`` is a short machine-readable name of the refusal (the ``reason`` label of the
``atropos_api_groups_refused_total`` metric).
"""

from __future__ import annotations

from atroposlib.errors import AtroposError


class ApiRequestError(AtroposError):
    """A request the API refuses; ``detail`` says what is wrong and how to fix it."""

    status_code = 400
    reason = "bad_request"

    def __init__(self, detail: str, headers: dict[str, str] | None = None, reason: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}
        if reason is not None:
            self.reason = reason


class UnknownEnvError(ApiRequestError):
    """The env_id is not registered (404)."""

    status_code = 404
    reason = "unknown_env"


class InvalidGroupError(ApiRequestError):
    """A scored group is malformed for this server (422); ``reason`` names the check it failed."""

    status_code = 422
    reason = "invalid_group"


class PayloadTooLargeError(ApiRequestError):
    """A group can never fit the configured queue limits (413)."""

    status_code = 413
    reason = "too_large"


class QueueFullError(ApiRequestError):
    """The queue is full (429); the answer carries ``Retry-After``."""

    status_code = 429
    reason = "queue_full"

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class IdempotencyKeyError(ApiRequestError):
    """An ``Idempotency-Key`` header that cannot be honoured (422)."""

    status_code = 422
    reason = "idempotency_key"


class StepConflictError(ApiRequestError):
    """``GET /batch?step=N`` names a step the server cannot serve (409)."""

    status_code = 409
    reason = "step_conflict"


class InsufficientStorageError(ApiRequestError):
    """The store could not write (disk full); nothing was changed (507, with ``Retry-After``)."""

    status_code = 507
    reason = "storage_full"

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after
