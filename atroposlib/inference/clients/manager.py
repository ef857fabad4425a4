"""``ServerManager``: spreads an env's inference requests over one or more ``InferenceClient`` backends.

Routing:

* a single ``APIServerConfig`` is honoured as given (wrapped in a list), never replaced by
  localhost:9004-9007; only a bare ``ServerBaseline`` (no URL at all) synthesises URLs, from
  SLURM variables or localhost:9004-9007;
* requests go to the healthy server with the most free slots (least busy; see
  :mod:`~atroposlib.inference.clients.routing`), waiting on that server's semaphore; per-server concurrency is ``num_max_requests_at_once`` (train) and
  ``num_requests_for_eval`` (eval), scaled by the API's ``env_weight``;
* ``n > max_n_completions`` is split into chunks whose choices are merged;
* retries live in ``InferenceClient`` (3 attempts per request, not stacked).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.inference.clients.base import InferenceClient, merge_choices
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.clients.routing import LAGGING_PROBE_S, ServerPicker  # noqa: F401 - importable from here as before

logger = logging.getLogger(__name__)

#: Ports used for a bare ServerBaseline outside SLURM (Atropos 0.4 convention).
DEFAULT_LOCAL_PORTS = (9004, 9005, 9006, 9007)


class ServerManagerConfig(BaseModel):
    """Settings of the server manager; CLI flags are unprefixed (``--slurm``)."""

    model_config = ConfigDict(extra="forbid")

    slurm: bool = Field(
        default=False,
        description="Derive inference URLs from SLURM_JOB_NODELIST (nodes after "
        "NUM_TRAINING_NODES, ports 9000+i for i < 8 // INFER_TP).",
    )
    testing: bool = Field(
        default=False,
        description="Use an in-process FakeServer instead of real inference servers.",
    )
    max_n_completions: int = Field(
        default=8, ge=1, description="Largest `n` sent in one request; bigger n is split."
    )
    proxy_url: str | None = Field(
        default=None,
        description="ManagedServer proxy URL (also read from ATROPOS_PROXY_URL); when set, "
        "managed_server() opens a session on that proxy (managed_server_proxy).",
    )


def server_class_for(server_type: str) -> type[InferenceClient]:
    """Return the backend class for a ``server_type``.

    Raises:
        ValueError: unknown ``server_type``.
        ImportError: the backend module is not available in this installation.
    """
    backends = {
        "openai": ("openai_client", "OpenAIClient"),
        "vllm": ("vllm_client", "VLLMClient"),
        "sglang": ("sglang_client", "SGLangClient"),
        "trl": ("trl_vllm_client", "TrlVllmClient"),
    }
    if server_type not in backends:
        raise ValueError(
            f"unknown server_type {server_type!r}; use one of {', '.join(backends)}"
        )
    import importlib

    module_name, class_name = backends[server_type]
    try:
        module = importlib.import_module(f"atroposlib.inference.clients.{module_name}")
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"server_type {server_type!r} needs atroposlib.inference.clients.{module_name}, "
            f"which is not available in this installation ({exc}); use server_type 'openai' "
            "or 'vllm'"
        ) from exc
    return getattr(module, class_name)


def _slurm_urls() -> list[str]:
    """URLs of inference nodes from SLURM variables (empty when fewer than 2 nodes)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return []
    try:
        import subprocess

        nodes = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        nodes = [n for n in nodelist.split(",") if n]
    if len(nodes) < 2:
        return []
    num_training = int(os.environ.get("NUM_TRAINING_NODES", "1"))
    infer_tp = int(os.environ.get("INFER_TP", "1"))
    per_node = max(1, 8 // infer_tp)
    return [
        f"http://{node}:{9000 + i}/v1" for node in nodes[num_training:] for i in range(per_node)
    ]


def _baseline_configs(baseline: ServerBaseline) -> list[APIServerConfig]:
    """One config per URL of SLURM, else localhost:9004-9007, for a bare ``ServerBaseline``."""
    urls = _slurm_urls() or [f"http://localhost:{port}/v1" for port in DEFAULT_LOCAL_PORTS]
    logger.info(
        "config_init returned a bare ServerBaseline: using inference servers %s "
        "(return an APIServerConfig, or pass --openai.base_url, to choose one)",
        urls,
    )
    return [
        APIServerConfig(**{**baseline.model_dump(), "base_url": url, "api_key": "x"})
        for url in urls
    ]


class ServerManager:
    """Load-balances inference requests over several :class:`InferenceClient` instances.

    Methods mirror ``InferenceClient``: ``chat_completion``, ``completion``,
    ``tokens_and_logprobs_completion``, ``get_logprobs`` (all accept ``split="train"|"eval"``),
    plus ``managed_server()``, ``dedicated_server()``, ``update_weight()`` and
    ``wandb_metrics()``.
    """

    # Defaults for managers assembled without __init__ (test doubles built with
    # object.__new__ that set only servers / max_n_completions / reasoning_config).
    proxy_url: str | None = None
    use_proxy: bool = False
    tool_parser: Any = None

    def __init__(
        self,
        configs: APIServerConfig | ServerBaseline | Sequence[APIServerConfig | InferenceClient] | InferenceClient,
        server_class: type[InferenceClient] = InferenceClient,
        slurm: bool = False,
        testing: bool = False,
        max_n_completions: int = 8,
        reasoning_config: ReasoningConfig | None = None,
        proxy_url: str | None = None,
        use_proxy: bool = False,
        tool_parser: Any = None,
    ):
        """Build the server list.

        Args:
            configs: one config (honoured as given), a list of configs and/or ready
                ``InferenceClient`` instances (used as is, e.g. a ``FakeServer``), or a bare
                ``ServerBaseline`` (URLs synthesised from SLURM or localhost:9004-9007).
            server_class: a concrete backend class, or the abstract ``InferenceClient`` to choose
                from each config's ``server_type``.
            slurm: derive URLs from SLURM variables using the first config as template.
            testing: use one in-process ``FakeServer`` (no network).
            max_n_completions: requests with larger ``n`` are split into chunks of this size.
            reasoning_config: reasoning options injected into chat completions.
            proxy_url: ManagedServer proxy root (default: env ``ATROPOS_PROXY_URL``); when set,
                ``managed_server()`` yields a ``ProxyManagedServer`` session on it.
            use_proxy: accepted for Atropos 0.4 compatibility (the proxy is used iff
                ``proxy_url`` is set).
            tool_parser: passed to ``ManagedServer``.

        Raises:
            ValueError: no configs, or an unknown ``server_type``.
        """
        self.max_n_completions = max_n_completions
        self.reasoning_config = reasoning_config
        self.proxy_url = proxy_url or os.environ.get("ATROPOS_PROXY_URL")
        self.use_proxy = use_proxy
        self.tool_parser = tool_parser
        if testing:
            # The ``--testing`` mode of the env CLI (and Atropos 0.4's ``testing=True``): one
            # scripted server that answers any prompt. Code that wants a test double passes the
            # server instance itself in ``configs``; this flag is the only place production code
            # reaches the test package, and only when asked to.
            from atroposlib.testing.fake_server import FakeServer

            self.servers: list[InferenceClient] = [FakeServer()]
            return
        if isinstance(configs, InferenceClient):
            configs = [configs]
        if isinstance(configs, APIServerConfig):
            configs = [configs]
        elif isinstance(configs, ServerBaseline):
            configs = _baseline_configs(configs)
        configs = list(configs)
        if not configs:
            raise ValueError("ServerManager needs at least one server config")
        if slurm:
            template = next((c for c in configs if isinstance(c, ServerBaseline)), None)
            urls = _slurm_urls()
            if template is not None and urls:
                configs = [
                    APIServerConfig(**{**template.model_dump(), "base_url": url, "api_key": "x"})
                    for url in urls
                ]
        self.servers = [self._make(c, server_class) for c in configs]

    def _make(self, config: APIServerConfig | InferenceClient, server_class: type[InferenceClient]) -> InferenceClient:
        if isinstance(config, InferenceClient):
            return config
        if not isinstance(config, ServerBaseline):
            raise TypeError(
                f"server configs must be APIServerConfig or InferenceClient instances, got "
                f"{type(config).__name__}"
            )
        cls = server_class
        if inspect.isabstract(cls):
            cls = server_class_for(config.server_type)
        if not isinstance(config, APIServerConfig):
            config = APIServerConfig(**config.model_dump())
        return cls(config, reasoning_config=self.reasoning_config)

    # ------------------------------------------------------------------ routing
    @functools.cached_property
    def _picker(self) -> ServerPicker:
        # cached_property: managers built with object.__new__ (test doubles) get one too
        return ServerPicker()

    def _pick(self, split: str = "train", servers: list[InferenceClient] | None = None) -> InferenceClient:
        """The server a request goes to (see :meth:`ServerPicker.pick`), among ``servers`` or all."""
        return self._picker.pick(servers or self.servers, split)

    def _current(self, servers: list[InferenceClient]) -> list[InferenceClient]:
        """The servers not behind the newest policy version (see :meth:`ServerPicker.current`)."""
        return self._picker.current(servers)

    async def _route(self, method: str, kwargs: dict[str, Any]) -> Any:
        split = kwargs.get("split", "train")
        server = self._pick(split)
        return await getattr(server, method)(**kwargs)

    async def _split_n(self, method: str, kwargs: dict[str, Any]) -> list[Any]:
        n = int(kwargs.get("n", 1) or 1)
        chunks = []
        while n > 0:
            size = min(n, self.max_n_completions)
            chunks.append({**kwargs, "n": size})
            n -= size
        return await asyncio.gather(*(self._route(method, c) for c in chunks))

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Chat completion on the least busy healthy server; ``n`` may exceed max_n_completions.

        Args:
            **kwargs: OpenAI chat parameters plus ``split="train"|"eval"``.

        Returns:
            An OpenAI ``ChatCompletion`` with ``n`` choices.
        """
        results = await self._split_n("chat_completion", kwargs)
        return merge_choices(results)

    async def completion(self, **kwargs: Any) -> Any:
        """Text completion on the least busy healthy server; ``n`` may exceed max_n_completions."""
        results = await self._split_n("completion", kwargs)
        return merge_choices(results)

    async def tokens_and_logprobs_completion(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        """Token-level generation (see ``InferenceClient.tokens_and_logprobs_completion``).

        Returns:
            ``(prompt_tokens [P], output_tokens [n][T_k], output_logprobs [n][T_k],
            finish_reasons [n])``; chunks are concatenated in order.
        """
        results = await self._split_n("tokens_and_logprobs_completion", kwargs)
        prompt_tokens = results[0][0]
        outputs, logprobs, reasons = [], [], []
        for _, out, lps, fr in results:
            outputs.extend(out)
            logprobs.extend(lps)
            reasons.extend(fr)
        return prompt_tokens, outputs, logprobs, reasons

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt top-k log-probs from the least busy healthy server (not split)."""
        return await self._route("get_logprobs", kwargs)

    # ------------------------------------------------------------------ helpers
    def update_weight(self, weight: float) -> None:
        """Scale every server's concurrency by the API's ``env_weight``."""
        for server in self.servers:
            server.update_weight(weight)

    def wandb_metrics(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Request metrics of EVERY server (upstream kept only the last one)."""
        metrics = {} if metrics is None else metrics
        for index, server in enumerate(self.servers):
            server.wandb_metrics(metrics, server_name=f"server_{index}")
        return metrics

    async def aclose(self) -> None:
        """Stop health checks and close clients of every server."""
        for server in self.servers:
            await server.aclose()

    @asynccontextmanager
    async def dedicated_server(self, split: str = "train") -> AsyncIterator[InferenceClient]:
        """Hold one slot of the least busy server for the duration of the block."""
        server = self._pick(split)
        sem = server.sem if split == "train" else server.eval_sem
        async with sem:
            yield server

    @asynccontextmanager
    async def managed_server(
        self,
        tokenizer: Any = None,
        base_url: str | None = None,
        preserve_think_blocks: bool = False,
        track_tree: bool = False,
        tool_parser: Any = None,
    ) -> AsyncIterator[Any]:
        """Yield a :class:`ManagedServer` bound to the least busy server (state reset on exit).

        Args:
            tokenizer: the model's tokenizer (required for token tracking).
            base_url: pin a specific server by its base URL.
            preserve_think_blocks: see ``ManagedServer``.
            track_tree: see ``ManagedServer``.
            tool_parser: see ``ManagedServer`` (default: the manager's ``tool_parser``).

        With ``proxy_url`` set, the session lives on the ManagedServer proxy instead (same
        ``chat_completion`` / ``get_state()`` interface; deleted on exit).

        Raises:
            ValueError: ``base_url`` matches no server.
            NotImplementedError: the chosen backend cannot return token log-probs (an
                ``openai`` server), unless ``ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1``.
        """
        from atroposlib.inference.clients.managed import (
            DummyManagedServer,
            ManagedServer,
        )
        from atroposlib.inference.clients.openai_client import OpenAIClient

        if self.proxy_url:
            from atroposlib.inference.clients.proxy_session import create_proxy_session

            parser = tool_parser if tool_parser is not None else self.tool_parser
            proxy = await create_proxy_session(
                self.proxy_url,
                tool_parser=parser if isinstance(parser, str) else None,
                track_tree=track_tree,
                base_url=base_url,
                preserve_think_blocks=preserve_think_blocks,
            )
            try:
                yield proxy
            finally:
                await proxy.aclose()
            return

        pool = self.servers
        if base_url is not None:
            pool = [s for s in self.servers if getattr(s.config, "base_url", None) == base_url]
            if not pool:
                raise ValueError(
                    f"no server with base_url {base_url!r}; known: "
                    f"{[getattr(s.config, 'base_url', None) for s in self.servers]}"
                )
        server = self._pick("train", pool)
        if type(server) is OpenAIClient:
            allow = os.environ.get("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "").lower()
            if allow not in ("1", "true", "yes"):
                raise NotImplementedError(
                    "managed_server needs exact token ids and log-probs, which server_type "
                    "'openai' cannot provide; use server_type 'vllm' (stock vLLM) or 'sglang', "
                    "or set ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1 for placeholder tokens"
                )
            managed: ManagedServer = DummyManagedServer(server, tokenizer)
        else:
            managed = ManagedServer(
                server,
                tokenizer,
                track_tree=track_tree,
                tool_parser=tool_parser if tool_parser is not None else self.tool_parser,
                preserve_think_blocks=preserve_think_blocks,
            )
        try:
            yield managed
        finally:
            managed.reset()


__all__ = ["ServerManager", "ServerManagerConfig", "server_class_for"]
