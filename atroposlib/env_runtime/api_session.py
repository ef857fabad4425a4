"""Serve mode's session with the trajectory API: registration, ``/info``, W&B info, status.

:class:`ApiSession` owns the one :class:`~atroposlib.api.client.AsyncAtroposClient` an env
serves through and the registration it holds. It registers with ``POST /register-env``
(waiting while the API says "wait for trainer to start"), adopts the trainer's limits from
``GET /info``, re-registers once per loss of registration (a 404, or several 5xx in a row from
Atropos 0.4's API, which answers 500 for an env id it forgot) and reads ``GET /status-env``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import httpx

from atroposlib.api.client import AsyncAtroposClient
from atroposlib.api.models import RegisterEnv
from atroposlib.errors import (
    ApiBackpressureError,
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
)

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv
    from atroposlib.envs.run_state import RunState

logger = logging.getLogger(__name__)

#: Consecutive 5xx answers from /status-env after which the env registers again.
STATUS_ERRORS_BEFORE_REREGISTER = 5


async def sleep_or_stop(stop_event: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop_event`` is set meanwhile."""
    try:
        await asyncio.wait_for(stop_event.wait(), timeout=seconds)
    except TimeoutError:
        pass


class ApiSession:
    """One env's registration with run-api and the client it talks through."""

    def __init__(self, env: BaseEnv, state: RunState, stop_event: asyncio.Event,
                 register_interval: float = 1.0):
        """Create the client (no I/O yet).

        Args:
            env: the environment (its config names the API and what to register).
            state: the env's run state; registration and ``/info`` fill it.
            stop_event: set to give up waiting (registration, W&B info).
            register_interval: seconds between ``/register-env`` attempts while waiting.
        """
        self.env = env
        self.config = env.config
        self.state = state
        self.stop_event = stop_event
        self.register_interval = register_interval
        self.client = AsyncAtroposClient(env.config.rollout_server_url, max_attempts=3, max_retry_seconds=30)
        self.register_lock = asyncio.Lock()
        self.status_server_errors = 0
        self.last_status_at = 0.0  # monotonic time of the last status answer (or outage)

    async def register(self, first: bool = True) -> None:
        """Register (or re-register) with the API, waiting for the trainer to start."""
        env = self.env
        desired = self.config.wandb_name or env.name or type(env).__name__
        payload = RegisterEnv(
            max_token_length=self.config.max_seq_len,
            desired_name=desired,
            weight=self.config.inference_weight,
            group_size=self.config.group_size,
            min_batch_allocation=self.config.min_batch_allocation,
        )
        waited = 0
        while not self.stop_event.is_set():
            try:
                response = await self.client.register_env(payload)
            except (ApiUnavailableError, ApiBackpressureError) as exc:
                logger.warning("cannot register with %s yet (%s); retrying", self.client.base_url, exc)
                await sleep_or_stop(self.stop_event, min(10.0, self.register_interval * 5))
                continue
            if response.get("status") == "success":
                break
            if waited % 30 == 0:
                logger.info("API says %r; waiting for the trainer", response.get("status"))
            waited += 1
            await sleep_or_stop(self.stop_event, self.register_interval)
        else:
            return
        state = self.state
        state.env_id = int(response["env_id"])
        state.wandb_prepend = response.get("wandb_name")
        state.checkpoint_dir = response.get("checkpoint_dir")
        state.checkpoint_interval = int(response.get("checkpoint_interval") or -1)
        if first:
            state.curr_step = int(response.get("starting_step") or 0)
            if state.total_steps == -1:
                num_steps = int(response.get("num_steps") or -1)
                if num_steps == -1:
                    raise ConfigError(
                        "total_steps is -1 (take it from the trainer) but the trainer registered "
                        "num_steps=-1; set --env.total_steps"
                    )
                state.total_steps = num_steps
            if state.curr_step > 0:
                env.load_checkpoint()
        logger.info(
            "%s as env_id=%d (%s) at step %d",
            "registered" if first else "re-registered",
            env.env_id,
            env.wandb_prepend,
            env.curr_step,
        )

    async def reregister(self, stale_env_id: int | None) -> None:
        """Re-register once per loss of registration (concurrent callers share one attempt)."""
        async with self.register_lock:
            if self.env.env_id != stale_env_id:
                return
            logger.warning("API no longer knows env_id=%s (restarted?); re-registering", stale_env_id)
            await self.register(first=False)
            await self.read_info()

    async def read_info(self) -> None:
        """Adopt ``batch_size`` and ``max_token_len`` from ``GET /info``.

        Raises:
            ConfigError: ``group_size`` exceeds the trainer's batch size.
        """
        info = await self.client.info()
        batch_size = int(info.get("batch_size", -1))
        if batch_size != -1:
            if self.config.group_size > batch_size:
                raise ConfigError(
                    f"group_size {self.config.group_size} > trainer batch_size {batch_size}: the "
                    "groups could never be batched; lower --env.group_size"
                )
            self.state.batch_size = batch_size
        if int(info.get("max_token_len", -1)) != -1:
            self.state.max_seq_len = int(info["max_token_len"])
        if self.state.batch_size == -1:
            logger.warning("batch size unknown (trainer did not report it); off-policy limit off")

    async def wandb_project(self, wait: float = 60.0) -> tuple[str | None, str | None]:
        """The trainer's W&B ``(project, group)``, waiting up to ``wait`` s for it to publish them."""
        project = group = None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.stop_event.is_set():
            try:
                info = await self.client.wandb_info()
            except (ApiUnavailableError, ApiRejectedError):
                info = {}
            project, group = info.get("project"), info.get("group")
            if project:
                break
            await sleep_or_stop(self.stop_event, 1.0)
        return project, group

    async def read_status(self) -> dict[str, Any] | None:
        """``GET /status-env``; None when it could not be read (re-registering when forgotten).

        A 404 re-registers at once; a run of :data:`STATUS_ERRORS_BEFORE_REREGISTER` 5xx answers
        too (Atropos 0.4's API answers 500 for an env id it forgot); an unreachable API is a
        warning, and serving goes on with the last status.
        """
        env_id = self.env.env_id
        try:
            status = await self.client.status_env(env_id)
        except ApiRejectedError as exc:
            if exc.status_code == 404:
                await self.reregister(env_id)
                return None
            raise
        except ApiUnavailableError as exc:
            self.last_status_at = time.monotonic()
            if isinstance(exc.__cause__, httpx.TransportError):
                self.status_server_errors = 0
            else:
                self.status_server_errors += 1
                if self.status_server_errors >= STATUS_ERRORS_BEFORE_REREGISTER:
                    self.status_server_errors = 0
                    await self.reregister(env_id)
                    return None
            logger.warning("cannot read /status-env (%s); continuing with the last status", exc)
            return None
        self.status_server_errors = 0
        self.last_status_at = time.monotonic()
        return status

    async def disconnect(self) -> None:
        """``POST /disconnect-env`` (best effort) when registered."""
        env_id = self.env.env_id
        if env_id is None:
            return
        try:
            await self.client.disconnect_env(env_id)
            logger.info("disconnected env_id=%d from the API", env_id)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            logger.warning("disconnect-env failed: %s", exc)


__all__ = ["STATUS_ERRORS_BEFORE_REREGISTER", "ApiSession", "sleep_or_stop"]
