"""OpenEnv environment servers served as Atropos environments, one episode per rollout.

``atropos-env openenv:SPEC serve|process|evaluate`` where ``SPEC`` is

* ``module:app``: an OpenEnv server app (built with ``openenv.core.env_server.create_app``);
  the env starts it with uvicorn on a free ``127.0.0.1`` port and stops it when it exits;
* ``http://HOST:PORT``: an OpenEnv server already running.

One item is one set of ``reset`` arguments (``{"seed": seed + k}`` by default, or the list
``--env.resets``); a group is ``group_size`` episodes from it, each over its own OpenEnv
session. An episode is a chat: the system prompt names the action's JSON schema, each
observation is a user turn (JSON), the model's reply is the action (a JSON object, or the raw
text when the action has a single required field), and the episode ends when OpenEnv says
``done`` or after ``max_turns`` replies. Score = the sum of OpenEnv's step rewards, plus
``invalid_action_penalty`` per reply that is no valid action (the model is told why and
asked again). Each episode is one tracked conversation, so the group carries the exact token
ids, the sampler's log-probs and a mask over the model's tokens of every turn.

(verifiers 0.4 also ships an OpenEnv taskset, but it is written against the newer ``openenv``
distribution's client; with ``openenv-core`` 0.3 its client lacks what that taskset reads, so
this adapter drives ``openenv-core``'s own ``GenericEnvClient`` directly.)
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

from pydantic import Field

from atroposlib.adapters.common import spec_env_class
from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig
from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

#: Seconds to wait for a started OpenEnv server to answer ``/health``.
START_TIMEOUT_S = 60.0
#: Observation keys that are bookkeeping, not what the model should see.
_HIDDEN_KEYS = ("done", "reward", "metadata")

class LocalServer:
    """An ASGI app (``module:app``) served by uvicorn in a child process on ``127.0.0.1``.

    The child runs in its own process group, which :meth:`stop` (also run at interpreter
    exit) ends.
    """

    def __init__(self, app: str):
        self.app = app
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> str:
        """Start the server and wait until ``/health`` answers; return its base URL.

        Raises:
            ConfigError: the server exited or did not answer in ``timeout`` seconds (with the
                tail of its output).
        """
        import httpx

        from atroposlib.adapters.common import _bound_socket

        sock = _bound_socket()
        port = sock.getsockname()[1]
        sock.close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port",
             str(port), "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(),
                                                                            os.environ.get("PYTHONPATH")]))},
        )
        atexit.register(self.stop)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.process.stdout.read().decode(errors="replace") if self.process.stdout else ""
                raise ConfigError(f"openenv:{self.app}: the server exited "
                                  f"({self.process.returncode}): {output[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ConfigError(f"openenv:{self.app}: no answer on {self.url}/health in {timeout:g} s")

    def stop(self) -> None:
        """End the server's process group (idempotent)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


class OpenEnvConfig(MultiTurnEnvConfig):
    """Settings of an OpenEnv environment run by Atropos."""

    max_tokens: int = Field(default=256, ge=1, description="Tokens per model turn at most.")
    resets: list[dict[str, Any]] | None = Field(
        default=None,
        description='reset() arguments of the training items, cycled, e.g. [{"seed": 0}]; '
        'default: {"seed": seed + k} for item k.',
    )
    seed: int = Field(default=0, description="First training seed (when resets is unset).")
    eval_episodes: int = Field(default=16, ge=1, description="Greedy episodes in evaluate.")
    invalid_action_penalty: float = Field(
        default=0.0, le=0,
        description="Added to the score for each reply that is no valid action.",
    )
    instructions: str | None = Field(
        default=None, description="The system prompt (default: names the action's JSON schema).",
    )


def parse_action(reply: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The model's reply as an OpenEnv action: a JSON object (fenced or not), or the raw text.

    Raw text becomes ``{field: text}`` when the action schema has exactly one required field.

    Raises:
        ValueError: the reply is not a JSON object and the schema needs several fields.
    """
    text = reply.strip()
    if text.startswith("```") and text.endswith("```"):
        text = "\n".join(text.splitlines()[1:-1]).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value
    required = schema.get("required") or []
    if len(required) != 1:
        raise ValueError(f"reply with a JSON object with the fields {required}")
    return {required[0]: text}


class OpenEnvEnv(MultiTurnEnv):
    """An OpenEnv environment as an Atropos env (see :mod:`atroposlib.adapters.openenv`)."""

    env_config_cls = OpenEnvConfig
    config_defaults = {"max_turns": 8}
    #: ``module:app`` or a base URL (set by :func:`openenv_env_class`).
    openenv_spec: str = ""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._server: LocalServer | None = None
        self.base_url: str | None = None
        self.action_schema: dict[str, Any] = {}

    async def setup(self) -> None:
        """Start the server (``module:app``), read the action schema, pick the eval seeds."""
        import asyncio

        import httpx

        spec = self.openenv_spec
        if spec.startswith(("http://", "https://")):
            self.base_url = spec.rstrip("/")
        else:
            self._server = LocalServer(spec)
            self.base_url = await asyncio.to_thread(self._server.start)
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.get(f"{self.base_url}/schema")
            if response.status_code != 200:
                raise ConfigError(f"openenv:{spec}: GET /schema answered {response.status_code}; "
                                  "is this an OpenEnv server?")
        self.action_schema = response.json().get("action") or {}
        self.eval_items = [{"seed": 10_000_000 + self.config.seed + k}
                           for k in range(self.config.eval_episodes)]

    def train_item(self, index: int) -> dict[str, Any]:
        """``resets[index % len]``, else ``{"seed": seed + index}``."""
        if self.config.resets:
            return dict(self.config.resets[index % len(self.config.resets)])
        return {"seed": self.config.seed + index}

    def intro(self) -> str:
        """``--env.instructions``, else a prompt giving the action's JSON schema."""
        if self.config.instructions:
            return self.config.instructions
        required = self.action_schema.get("required") or []
        how = (f"reply with the value of {required[0]!r} as plain text, or" if len(required) == 1
               else "reply with")
        return ("You act in an environment. Each user message is an observation (JSON). "
                f"Each turn, {how} a JSON object matching this action schema: "
                f"{json.dumps(self.action_schema, separators=(',', ':'))}")

    @staticmethod
    def describe(observation: dict[str, Any]) -> str:
        """The observation as the model sees it (JSON, bookkeeping keys left out)."""
        shown = {k: v for k, v in (observation or {}).items() if k not in _HIDDEN_KEYS}
        return json.dumps(shown, ensure_ascii=False)

    async def play_episode(self, item: Any, *, temperature: float, split: str) -> Any:
        """One OpenEnv episode from ``reset(**item)``; ``(Episode, score, details)``."""
        from openenv import GenericEnvClient

        state = {"return": 0.0, "invalid": 0, "done": False, "steps": 0}
        async with GenericEnvClient(base_url=self.base_url) as client:
            result = await client.reset(**item)

            async def on_reply(text: str, _turn: int) -> list[dict[str, str]] | None:
                try:
                    step = await client.step(parse_action(text, self.action_schema))
                except Exception as exc:  # noqa: BLE001 - an unusable action is play, not a crash
                    state["invalid"] += 1
                    state["return"] += self.config.invalid_action_penalty
                    return [{"role": "user", "content": f"Invalid action ({exc}). {self.intro()}"}]
                state["steps"] += 1
                state["return"] += float(step.reward or 0.0)
                if step.done:
                    state["done"] = True
                    return None
                return [{"role": "user", "content": self.describe(step.observation)}]

            messages = [{"role": "system", "content": self.intro()},
                        {"role": "user", "content": self.describe(result.observation)}]
            episode = await self.converse(messages, on_reply, temperature=temperature, split=split)
        details = {"return": state["return"], "invalid": float(state["invalid"]),
                   "finished": float(state["done"]), "steps": float(state["steps"]),
                   "out_of_context": float(episode.out_of_context)}
        return episode, state["return"], details

    def details_metrics(self, details: list[dict[str, float]], prefix: str) -> dict[str, float]:
        """Mean return, finished rate, invalid replies per episode, steps."""
        if not details:
            return {}
        n = len(details)
        return {f"{prefix}/{key}": sum(d[key] for d in details) / n
                for key in ("return", "finished", "invalid", "steps", "out_of_context")}

    def close_server(self) -> None:
        """Stop the OpenEnv server this env started (also done at interpreter exit)."""
        if self._server is not None:
            self._server.stop()
            self._server = None


def openenv_env_class(spec: str) -> type[OpenEnvEnv]:
    """The env class playing the OpenEnv server ``spec`` (see module docstring).

    Raises:
        ConfigError: openenv-core is missing, or ``spec`` is neither a URL nor ``module:app``.
    """
    try:
        import openenv  # noqa: F401
    except ImportError as exc:
        raise ConfigError("OpenEnv environments need openenv-core: "
                          "pip install 'atroposlib[openenv]'") from exc
    if not spec.startswith(("http://", "https://")) and ":" not in spec:
        raise ConfigError(f"openenv:{spec}: give the server app as module:app (it is started "
                          "here) or the URL of a running OpenEnv server")
    short = spec.split("://", 1)[-1].split(":", 1)[0].rsplit(".", 1)[-1] or "env"
    if spec.endswith(":app") and short in ("app", "server"):
        short = spec.split(":", 1)[0].split(".")[-2] if spec.count(".") else short
    return spec_env_class(OpenEnvEnv, spec, f"openenv-{short}",
                          f"The OpenEnv environment {spec!r} run by Atropos.", openenv_spec=spec)


__all__ = ["LocalServer", "OpenEnvConfig", "OpenEnvEnv", "openenv_env_class", "parse_action"]
