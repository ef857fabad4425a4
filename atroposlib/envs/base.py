"""``BaseEnv``: the environment contract (the hooks an env implements and what it may read).

Import surface (Atropos 0.4 compatible)::

    from atroposlib.envs.base import (BaseEnv, BaseEnvConfig, ScoredDataGroup, ScoredDataItem,
        APIServerConfig, ServerBaseline, EvalHandlingEnum, OpenaiConfig)

The code that drives an env (serve loop, process/evaluate runners, the CLI) imports this
contract, never the reverse: ``cli()``, ``env_manager()`` and ``process_manager()`` hand over
to the runner registered for their mode (:mod:`atroposlib.envs.runners`). The bodies of the
W&B and checkpoint helpers live in :mod:`atroposlib.envs.wandb_logging` and
:mod:`atroposlib.envs.checkpoints`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path
from typing import Any

from atroposlib.api.models import MASKED_LOGPROB
from atroposlib.envs.checkpoints import (
    checkpoint_path,
    newest_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from atroposlib.envs.config import BaseEnvConfig, EvalHandlingEnum, FrozenConfigError
from atroposlib.envs.eval import eval_dir, evaluate_log
from atroposlib.envs.groups import (
    ScoredDataGroup,
    ScoredDataItem,
    aggregate_items,
    completion_lengths,
    gather_rollouts,
    normalise_group,
    valid_groups,
)
from atroposlib.envs.run_state import (
    ROLLOUT_POLICY_VERSION,
    RunState,
    RunStateView,
    batch_share,
    deliver,
    state_property,
)
from atroposlib.envs.runners import get_runner
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    OpenaiConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.envs.server_handling.server_manager import ServerManager, ServerManagerConfig
from atroposlib.envs.wandb_logging import env_metrics, perf_stats, rollout_rows, rollout_table
from atroposlib.type_definitions import Item
from atroposlib.utils.hf_tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


class BaseEnv:
    """Base class of every environment: subclass it, implement the hooks, call ``cli()``.

    Must implement:
        * ``get_next_item() -> Item | None``: the next prompt/task (None = nothing right now).
        * ``collect_trajectories(item) -> (ScoredDataGroup | list[ScoredDataGroup] | None,
          backlog_items)``: sample and score ``group_size`` rollouts. Alternatively implement
          ``collect_trajectory(item) -> (ScoredDataItem | None, backlog_items)``; the default
          ``collect_trajectories`` runs it ``group_size`` times concurrently and aggregates
          (including ``inference_logprobs``).
        * ``evaluate(*args, **kwargs) -> dict[str, float] | None``: evaluation metrics (also
          call ``self.evaluate_log(...)`` to write them).

    Optional hooks:
        * ``config_init()`` (classmethod) -> ``(env_config, server_configs)``: defaults.
        * ``setup()``: load datasets etc. (runs once, before anything else).
        * ``postprocess_histories(trajectories)``: last edit of a group before sending.
        * ``wandb_log(metrics)``: add metrics, then ``await super().wandb_log(metrics)``.
        * ``add_rollouts_for_wandb(group, item)`` / ``create_rollout_table(metrics)``: customise
          the W&B rollout table.
        * ``save_checkpoint(step, data)`` / ``load_checkpoint()``: env state across restarts.
        * ``cleanup()``: runs after every item.

    Class attributes: ``name`` (used for wandb/registration names and default file names),
    ``env_config_cls`` (your ``BaseEnvConfig`` subclass), ``server_cls`` (``APIServer`` =
    choose by ``server_type``) and ``server_namespaces`` (extra CLI server namespaces, e.g.
    ``{"teacher": "teacher_server_configs"}`` gives ``--teacher.*`` flags whose configs reach
    the constructor as that keyword; see :mod:`atroposlib.envs.cli`).

    Available inside hooks: ``self.config``, ``self.tokenizer`` (HF tokenizer of
    ``config.tokenizer_name``, loaded lazily), ``self.server`` (a ``ServerManager``; use
    ``self.server.chat_completion(...)`` or ``self.server.managed_server(tokenizer=...)``),
    ``self.run_state`` (read-only view of the runner's :class:`RunState`: ``curr_step``,
    ``env_id``, ``status``, trainer limits, ``stats``), also readable as the Atropos attributes
    ``self.curr_step``, ``self.max_token_len``, ``self.env_id``, ``self.stats`` ... The config
    is read-only once a runner starts (assigning a field raises ``FrozenConfigError``).

    Returning None, raising inside ``collect_trajectories``/``collect_trajectory``, or (while
    ``ensure_scores_are_not_same``) returning identical scores drops the group; drops are
    logged and counted in ``self.stats``, never turned into reward 0.
    """

    name: str | None = None
    env_config_cls: type[BaseEnvConfig] = BaseEnvConfig
    server_cls: type[APIServer] = APIServer
    server_namespaces: dict[str, str] = {}

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: list[APIServerConfig | APIServer] | APIServerConfig | ServerBaseline | APIServer,
        slurm: bool = False,
        testing: bool = False,
    ):
        """Build the env (no network I/O; the tokenizer loads on first use).

        Args:
            config: an instance of ``env_config_cls``.
            server_configs: inference servers: configs and/or ready ``APIServer`` instances
                (e.g. ``FakeServer``); a single config is honoured as given.
            slurm: derive inference URLs from SLURM variables.
            testing: use an in-process ``FakeServer`` instead of real inference.

        Raises:
            TypeError: ``config`` is not a ``BaseEnvConfig``.
        """
        if not isinstance(config, BaseEnvConfig):
            raise TypeError(
                f"config must be a {self.env_config_cls.__name__} instance, got "
                f"{type(config).__name__}"
            )
        self.config = config
        self.server_configs = server_configs
        self.reasoning_config = ReasoningConfig(
            enabled=config.thinking_mode,
            effort=config.reasoning_effort,
            max_tokens=config.max_reasoning_tokens,
        )
        self.server = ServerManager(
            server_configs,
            server_class=self.server_cls,
            slurm=slurm,
            testing=testing,
            reasoning_config=self.reasoning_config if self.reasoning_config.enabled else None,
        )
        for server in self.server.servers:
            if hasattr(server, "set_tokenizer_factory"):
                server.set_tokenizer_factory(lambda: self.tokenizer)
        self._tokenizer: Any = None
        self.max_num_workers = self._compute_max_num_workers()
        self.rollouts_for_wandb: deque[list[tuple[str, float]]] = deque(
            maxlen=max(1, config.num_rollouts_to_keep)
        )
        self._run_state = RunState.for_config(config)
        self._eval_metrics_path: Path | None = None
        self._eval_dir: Path | None = None

    # ------------------------------------------------------------------ construction helpers
    curr_step = state_property("curr_step")
    max_token_len = state_property("max_token_len")
    env_id = state_property("env_id")
    status_dict = state_property("status")
    wandb_prepend = state_property("wandb_prepend")
    checkpoint_dir = state_property("checkpoint_dir")
    checkpoint_interval = state_property("checkpoint_interval")
    items_sent_this_step = state_property("items_sent_this_step")
    stats = state_property("stats")
    completion_lengths = state_property("completion_lengths")
    task_durations = state_property("task_durations")

    @property
    def run_state(self) -> RunStateView:
        """Read-only view of the run state the runner owns (see :class:`RunState`)."""
        return RunStateView(self._run_state)

    def bind_run_state(self, state: RunState) -> None:
        """Runners call this when they start: ``state`` becomes the one the env reads."""
        self._run_state = state

    @classmethod
    def config_init(
        cls,
    ) -> tuple[BaseEnvConfig, list[APIServerConfig] | APIServerConfig | ServerBaseline]:
        """Return default ``(env_config, server_configs)``; override in subclasses."""
        return cls.env_config_cls(), ServerBaseline()

    def _compute_max_num_workers(self) -> int:
        if self.config.max_num_workers > 0:
            return self.config.max_num_workers
        return self.config.max_num_workers_per_node * max(1, len(self.server.servers))

    @property
    def derived_batch_size(self) -> int:
        """This env's share of a batch in sequences.

        The trainer's batch size (``config.batch_size`` until known) until a status is known
        (or when it is -1), else
        ``int(batch_size * (unallocated_fraction + (min_batch_allocation or 0)))``.
        """
        batch_size = self._run_state.batch_size
        if batch_size == -1 or not self.status_dict:
            return batch_size
        return batch_share(batch_size, self.status_dict, self.config.min_batch_allocation)

    @property
    def tokenizer(self) -> Any:
        """HF tokenizer of ``config.tokenizer_name`` (loaded once, on first use).

        Raises:
            OSError: the tokenizer is neither a local directory nor in the HF cache (offline).
        """
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(
                self.config.tokenizer_name, "tokenizer (--env.tokenizer_name)"
            )
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    # ------------------------------------------------------------------ hooks
    async def setup(self) -> None:
        """Load datasets and state; runs once before anything else. Default: nothing."""

    async def get_next_item(self) -> Item | None:
        """Return the next item to roll out, or None when there is nothing to do now.

        Raises:
            NotImplementedError: the subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement get_next_item()")

    async def collect_trajectory(self, item: Item) -> tuple[ScoredDataItem | None, list[Item]]:
        """Roll out and score ONE trajectory (alternative to ``collect_trajectories``).

        Raises:
            NotImplementedError: neither collect_trajectory nor collect_trajectories exists.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement collect_trajectories(item) or "
            "collect_trajectory(item)"
        )

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup] | None, list[Item]]:
        """Roll out and score one group; default: ``collect_trajectory`` x ``group_size``.

        The default runs ``collect_trajectory(item)`` ``group_size`` times concurrently and
        aggregates the items into one group: ``tokens``/``masks``/``scores`` always, each
        optional per-sequence field (``inference_logprobs``, ``advantages``, ``messages`` ...)
        when every item has it (None when no item has it), and merged ``group_overrides``.

        Returns:
            ``(group or None, backlog_items)``: None when any rollout returned None.

        Raises:
            RolloutError: an item is not a dict, or items disagree on an optional field.
        """
        results = await asyncio.gather(
            *(self.collect_trajectory(item) for _ in range(self.config.group_size))
        )
        items, backlog = gather_rollouts(results)
        if items is None:
            self.stats["rollouts_returned_none"] += 1
            return None, backlog
        return aggregate_items(items), backlog

    async def postprocess_histories(
        self, trajectories: ScoredDataGroup | list[ScoredDataGroup]
    ) -> ScoredDataGroup | list[ScoredDataGroup]:
        """Last edit of a group before validation and sending; identity by default."""
        return trajectories

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float] | None:
        """Evaluate the current policy; return metrics (and/or call ``evaluate_log``).

        Raises:
            NotImplementedError: the subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement evaluate()")

    async def cleanup(self) -> None:
        """Runs after every item (serve and process modes); default: nothing."""

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_path(self, step: int) -> Path | None:
        name = self.wandb_prepend or self.name or "env"
        return checkpoint_path(self.checkpoint_dir, name, step)

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Write ``data`` as JSON to ``{checkpoint_dir}/env_checkpoints/{name}/step-{step}.json``.

        Subclasses call ``super().save_checkpoint(step, {"iter": self.iter})``. Nothing is
        written when ``data`` is None or no checkpoint dir is known.
        """
        path = self._checkpoint_path(step)
        if data is not None and path is not None:
            write_checkpoint(path, data)

    def load_checkpoint(self) -> None:
        """Restore attributes from the newest checkpoint at or before ``curr_step``."""
        path = self._checkpoint_path(self.curr_step)
        found = None if path is None else newest_checkpoint(path.parent, self.curr_step)
        if found is None:
            return
        step, best = found
        for key, value in read_checkpoint(best).items():
            setattr(self, key, value)
        logger.info("loaded env checkpoint %s (step %d)", best, step)

    # ------------------------------------------------------------------ group validation & sinks
    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def add_rollouts_for_wandb(self, scored_data: ScoredDataGroup, item: Item = None) -> None:
        """Keep some rollouts of an accepted group for the W&B ``train/rollouts`` table.

        Override to log other columns (then also override ``create_rollout_table``). Default:
        ``num_rollouts_per_group_for_logging`` rows of ``(text, score)``; the last
        ``num_rollouts_to_keep`` groups are kept.
        """
        keep = self.config.num_rollouts_per_group_for_logging
        rows = rollout_rows(scored_data, keep, self._decode)
        if rows:
            self.rollouts_for_wandb.append(rows)

    def create_rollout_table(self, wandb_metrics: dict[str, Any]) -> dict[str, Any]:
        """Add the ``train/rollouts`` W&B table built from ``rollouts_for_wandb``; return the dict."""
        if not self.rollouts_for_wandb:
            return wandb_metrics
        prefix = f"{self.wandb_prepend}_" if self.wandb_prepend else ""
        wandb_metrics[f"{prefix}train/rollouts"] = rollout_table(self.rollouts_for_wandb)
        self.rollouts_for_wandb.clear()
        return wandb_metrics

    def _accept_groups(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup | None] | None,
        abort_on_any_max_length_exceeded: bool = True,
        item: Item = None,
    ) -> list[ScoredDataGroup]:
        """Drop (log + count) invalid groups; normalise and record the rest (lengths, counters).

        ``abort_on_any_max_length_exceeded`` drops groups with a sequence of
        ``>= max_token_len`` tokens (once the API told us ``max_token_len``). Returns the
        accepted groups, with every optional key present (None when absent).
        """
        accepted = valid_groups(
            scored_data, self.config.group_size, self.config.ensure_scores_are_not_same,
            self.max_token_len if abort_on_any_max_length_exceeded else -1, self.stats,
        )
        lengths = self._run_state.completion_lengths
        for group in accepted:
            normalise_group(group, self.config.include_messages, self._decode)
            lengths.extend(completion_lengths(group))
            self.stats["groups_accepted"] += 1
        del lengths[: max(0, len(lengths) - 10_000)]
        return accepted

    async def handle_send_to_api(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup | None] | None,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> list[ScoredDataGroup]:
        """Validate and record groups; write them to the run's sinks and the API outbox.

        Accepted groups go to every sink of the run (JSONL, W&B) and, with ``do_send_to_api``
        (serve mode), to the outbox the serve loop drains, so a finished group is never lost
        to an API outage. Each sent group gets ``policy_version``: the trainer step when its
        rollout started (else ``curr_step``), unless it already has one. Returns the accepted
        groups.

        Raises:
            RuntimeError: ``do_send_to_api`` outside the serve loop (there is no outbox).
        """
        accepted = self._accept_groups(scored_data, abort_on_any_max_length_exceeded, item)
        await deliver(self._run_state, accepted, item, do_send_to_api)
        return accepted

    async def process_manager(self, show_progress: bool = True) -> Path | None:
        """Process mode: write ``config.total_steps`` groups to JSONL + HTML without an API.

        Returns the JSONL path, or None when nothing was written.
        """
        return await get_runner("process")(self, show_progress)

    # ------------------------------------------------------------------ evaluation
    def _eval_dir_path(self) -> Path:
        if self._eval_dir is None:
            self._eval_dir = eval_dir(self.config.data_dir_to_save_evals, self.name or "env")
        return self._eval_dir

    def evaluate_log(
        self,
        metrics: dict[str, float],
        task_name: str | None = None,
        model_name: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        generation_parameters: dict[str, Any] | None = None,
        samples: list[dict[str, Any]] | None = None,
        verbose: bool = True,
    ) -> Path | None:
        """Write ``metrics.json`` (and the samples) to the eval directory and log them.

        Files are written when ``data_dir_to_save_evals`` is set, and always in ``evaluate``
        mode (default directory ``evals/<name>-<timestamp>/``); otherwise (e.g. periodic evals
        in serve mode) the metrics are only printed. Arguments and file layout are those of
        :func:`atroposlib.envs.eval.evaluate_log`; ``task_name`` defaults to the env name,
        ``model_name`` to the first server's model, and ``max_new_tokens`` is added to the
        generation parameters. Returns the path of ``metrics.json``, or None.
        """
        writes = bool(self.config.data_dir_to_save_evals or self._run_state.eval_mode)
        path = evaluate_log(
            metrics,
            eval_dir=self._eval_dir_path() if writes else None,
            task_name=task_name or self.name or "env",
            model_name=model_name or self.server.servers[0].config.model_name,
            start_time=start_time,
            end_time=end_time,
            generation_parameters={
                **(generation_parameters or {}),
                "max_new_tokens": self.config.max_token_length,
            },
            samples=samples,
            verbose=verbose,
        )
        if path is None:
            return None
        self._eval_metrics_path = path
        return path

    async def _evaluate_and_save(self) -> Path:
        """Evaluate mode: run ``evaluate`` once and write its files; returns ``metrics.json``."""
        return await get_runner("evaluate")(self)

    def perf_stats(self) -> dict[str, float]:
        """Mean/std/max/min of recent rollout-group durations (seconds)."""
        return perf_stats(self.task_durations)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Log the usual metrics (plus ``metrics``) to W&B when ``use_wandb``.

        Subclasses add their own keys and call ``await super().wandb_log(metrics)`` last.
        Logged: ``train/completion_lengths`` (+ ``_std``, ``_max``, ``_min``,
        ``_frac_over_95pct_max``), the ``train/rollouts`` table, ``train_perf/*``,
        ``train/groups_*`` counters and every server's request metrics.
        """
        if not self.config.use_wandb:
            self.completion_lengths.clear()
            return
        limit = self.max_token_len if self.max_token_len > 0 else self.config.max_token_length
        prefix = f"{self.wandb_prepend}_" if self.wandb_prepend else ""
        metrics = env_metrics(metrics or {}, self.completion_lengths, limit, self.perf_stats(),
                              self.stats, prefix)
        self.completion_lengths.clear()
        metrics.update(self.server.wandb_metrics())
        import wandb

        if wandb.run is None:
            return
        metrics = self.create_rollout_table(metrics)
        wandb.log(metrics, step=self.curr_step if self.curr_step > 0 else None)

    # ------------------------------------------------------------------ serve mode
    async def env_manager(self) -> None:
        """Serve mode: register with the API and keep it fed with groups until told to stop."""
        await get_runner("serve")(self)

    # ------------------------------------------------------------------ CLI
    @classmethod
    def cli(cls, argv: list[str] | None = None) -> None:
        """Run the command line: ``python my_env.py serve|process|evaluate [--env.* ...]``."""
        get_runner("cli")(cls, argv)


__all__ = [
    "APIServerConfig",
    "BaseEnv",
    "BaseEnvConfig",
    "EvalHandlingEnum",
    "FrozenConfigError",
    "MASKED_LOGPROB",
    "OpenaiConfig",
    "ROLLOUT_POLICY_VERSION",
    "ReasoningConfig",
    "RunState",
    "ScoredDataGroup",
    "ScoredDataItem",
    "ServerBaseline",
    "ServerManagerConfig",
]
