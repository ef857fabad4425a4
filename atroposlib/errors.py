"""Exception hierarchy for atroposlib; every error a client or server raises derives from here.

::

    AtroposError
    ├── ConfigError                 bad configuration (CLI flag, YAML, config model)
    ├── ApiError                    talking to the trajectory API failed
    │   ├── ApiUnavailableError     connection refused / timed out / 5xx after retries
    │   ├── ApiRejectedError        4xx: the request itself is wrong (status_code, detail)
    │   │   └── ApiBackpressureError  429: the queue is full; retry after ``retry_after`` s
    │   └── ApiNotRegisteredError   /batch before a trainer called /register
    ├── InferenceError              an inference server (vLLM, SGLang, OpenAI) failed
    │   ├── InferenceUnavailableError  no healthy server within the timeout
    │   └── ProxyError              the ManagedServer proxy refused or failed a request
    └── RolloutError                a rollout or reward function failed (the group is dropped)
        └── RolloutTimeoutError     a rollout ran past ``rollout_timeout`` (also a TimeoutError)

The packages add their own branches (each module's docstring draws its part):

::

    AtroposError
    ├── ConfigError
    │   ├── FrozenConfigError       envs.config: a config field assigned after the run started
    │   ├── UnknownEnvironmentError env_runtime.entry_points: no env of that name
    │   ├── UnknownTrainerError     launch.trainers: no trainer of that name
    │   └── PreflightError          utils.preflight: a path or port is not usable
    ├── ApiRequestError             api.errors: a request run-api refuses (mapped to 4xx)
    ├── ProxyHTTPError              proxy.errors: what the proxy answers in OpenAI format
    ├── TeacherDistillationError    envs.teacher_distillation_env: a teacher answer is unusable
    ├── RolloutFormatError          tools.rollouts: a rollout cannot become SFT/DPO data
    ├── PayloadError, UpdateFailed  inference.node: a weight update the node refuses or fails
    ├── DeltaError                  inference.weights.delta: a weight delta does not apply
    │   └── DeltaRefused            inference.node: a node refuses a delta (HTTP 409)
    └── LaunchError                 launch.supervision: a part of the run failed to start or died

Each class also keeps the built-in base that callers caught before (``ConfigError`` is a
``ValueError``, ``FrozenConfigError`` an ``AttributeError``, ``RolloutFormatError`` a
``ValueError``, ``LaunchError`` a ``RuntimeError``, ``RolloutTimeoutError`` a ``TimeoutError``).
Warnings derive from :class:`AtroposWarning` (a ``UserWarning``).
"""

from __future__ import annotations


class AtroposError(Exception):
    """Base class of every atroposlib error."""


class ConfigError(AtroposError, ValueError):
    """A configuration value is invalid; the message says which and how to fix it."""


class ApiError(AtroposError):
    """Talking to the trajectory API failed."""


class ApiUnavailableError(ApiError):
    """The API could not be reached, or kept answering 5xx, after all retries."""


class ApiRejectedError(ApiError):
    """The API refused a request with a 4xx status.

    Attributes:
        status_code: the HTTP status (400-499).
        detail: the server's explanation (string or JSON structure).
    """

    def __init__(self, status_code: int, detail: object):
        super().__init__(f"API rejected the request ({status_code}): {detail}")
        self.status_code = status_code
        self.detail = detail


class ApiBackpressureError(ApiRejectedError):
    """The API's queue is full (429). Retry after ``retry_after`` seconds."""

    def __init__(self, detail: object, retry_after: float):
        super().__init__(429, detail)
        self.retry_after = retry_after


class ApiNotRegisteredError(ApiError):
    """``GET /batch`` was called before any trainer registered with ``POST /register``."""


class InferenceError(AtroposError):
    """An inference server call failed."""


class InferenceUnavailableError(InferenceError):
    """No healthy inference server became available within the timeout."""


class ProxyError(InferenceError):
    """The proxy refused or failed a request (raised on the client side).

    Attributes:
        status_code: HTTP status of the answer.
        type: OpenAI error type from the body (e.g. ``not_found_error``).
        code: error code from the body (e.g. ``session_expired``).
    """

    def __init__(self, status_code: int, message: str, type: str | None = None,  # noqa: A002
                 code: str | None = None):
        super().__init__(f"proxy answered {status_code}: {message}")
        self.status_code = status_code
        self.type = type
        self.code = code


class RolloutError(AtroposError):
    """A rollout or reward computation failed; the group is dropped and counted, never scored 0."""


class RolloutTimeoutError(RolloutError, TimeoutError):
    """A rollout ran past the env's ``rollout_timeout`` (our own limit, not the client's).

    Raised where atroposlib bounds a rollout (each member's attempt, a ``SingleTurnEnv``'s
    sampling call). Its wire kind is ``timeout``; a runner drops the group (``Skip.TIMEOUT``)
    without pausing inference: a slow server is not an outage. The inference client's own
    timeouts (``openai.APITimeoutError``, ``httpx.TimeoutException``, a bare ``TimeoutError``
    from a transport) are not this class and still count as inference failures.
    """

    rollout_failure_kind = "timeout"


class AtroposWarning(UserWarning):
    """Base class of every warning atroposlib issues (``-W error::...AtroposWarning`` names them all)."""
