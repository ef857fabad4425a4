"""``BaseEnv``: the environment contract (the hooks an env implements and what it may read).

Import surface (Atropos 0.4 compatible)::

    from atroposlib.envs.base import (BaseEnv, BaseEnvConfig, ScoredDataGroup, ScoredDataItem,
        APIServerConfig, ServerBaseline, EvalHandlingEnum, OpenaiConfig)

The code that drives an env (serve loop, process/evaluate runners, the CLI) imports this
contract, never the reverse: ``cli()``, ``env_manager()`` and ``process_manager()`` hand over
to the runner registered for their mode (:mod:`atroposlib.envs.runners`). The W&B, checkpoint
and evaluation-file hooks, the group check and self-sending path, and the runner entry points
are inherited from mixins that live beside their bodies:
:class:`~atroposlib.envs.sending.GroupSendingMixin`,
:class:`~atroposlib.envs.runners.RunnerEntryMixin`,
:class:`~atroposlib.envs.wandb_logging.WandbLoggingMixin`,
:class:`~atroposlib.envs.checkpoints.CheckpointMixin` and
:class:`~atroposlib.envs.eval.EvalLogMixin`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

from atroposlib.api.models import MASKED_LOGPROB
from atroposlib.envs.checkpoints import CheckpointMixin
from atroposlib.envs.config import BaseEnvConfig, EvalHandlingEnum, FrozenConfigError
from atroposlib.envs.eval import EvalLogMixin
from atroposlib.envs.groups import (
    ScoredDataGroup,
    ScoredDataItem,
    aggregate_items,
    gather_rollouts,
)
from atroposlib.envs.outcomes import Member, attach_outcomes, keep_group, run_members
from atroposlib.envs.rescoring import RescoreMixin
from atroposlib.envs.run_state import (
    ROLLOUT_POLICY_VERSION,
    RunState,
    RunStateView,
    batch_share,
    state_property,
)
from atroposlib.envs.runners import RunnerEntryMixin
from atroposlib.envs.sending import GroupSendingMixin
from atroposlib.envs.wandb_logging import WandbLoggingMixin
from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import (
    APIServerConfig,
    OpenaiConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.inference.clients.manager import ServerManager, ServerManagerConfig
from atroposlib.type_definitions import Item
from atroposlib.utils.hf_tokenizer import load_tokenizer


class BaseEnv(GroupSendingMixin, RunnerEntryMixin, WandbLoggingMixin, CheckpointMixin, EvalLogMixin,
              RescoreMixin):
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
        * ``item_id(item)``: the item's identity for the item filter (``--env.item_filter.*``).
        * ``rescore_group(item, group)``: score a recorded group again for ``atropos-replay
          rescore`` (default: ``score(rollout_group_data)`` on member dicts rebuilt from the
          record; :mod:`atroposlib.envs.rescoring`).

    Class attributes: ``name`` (used for wandb/registration names and default file names),
    ``env_config_cls`` (your ``BaseEnvConfig`` subclass), ``server_cls`` (``InferenceClient`` =
    choose by ``server_type``) and ``server_namespaces`` (extra CLI server namespaces, e.g.
    ``{"teacher": "teacher_server_configs"}`` gives ``--teacher.*`` flags whose configs reach
    the constructor as that keyword; see :mod:`atroposlib.env_runtime.command_line`).

    Available inside hooks: ``self.config``, ``self.tokenizer`` (HF tokenizer of
    ``config.tokenizer_name``, loaded lazily), ``self.server`` (a ``ServerManager``; use
    ``self.server.chat_completion(...)`` or ``self.server.managed_server(tokenizer=...)``),
    ``self.run_state`` (read-only view of the runner's :class:`RunState`: ``curr_step``,
    ``env_id``, ``status``, trainer limits, ``stats``), also readable as the Atropos attributes
    ``self.curr_step``, ``self.max_token_len`` (the trainer's ``max_seq_len``), ``self.env_id``,
    ``self.stats`` ... The config
    is read-only once a runner starts (assigning a field raises ``FrozenConfigError``).

    Returning None, raising inside ``collect_trajectories``, or (while
    ``ensure_scores_are_not_same``) returning identical scores drops the group; drops are
    logged and counted in ``self.stats``, never turned into reward 0. A ``collect_trajectory``
    that raises or passes ``config.rollout_timeout`` fails only its own rollout: it is sent in
    the group's ``excluded`` list, without a score, and ``config.failed_rollout_policy``
    decides whether the rest of the group is sent (see :mod:`atroposlib.envs.outcomes`).
    """

    name: str | None = None
    env_config_cls: type[BaseEnvConfig] = BaseEnvConfig
    server_cls: type[InferenceClient] = InferenceClient
    server_namespaces: dict[str, str] = {}

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: list[APIServerConfig | InferenceClient] | APIServerConfig | ServerBaseline | InferenceClient,
        slurm: bool = False,
        testing: bool = False,
    ):
        """Build the env (no network I/O; the tokenizer loads on first use).

        Args:
            config: an instance of ``env_config_cls``.
            server_configs: inference servers: configs and/or ready ``InferenceClient`` instances
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
        self.reasoning_config = ReasoningConfig.from_env_config(config)
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

    # ------------------------------------------------------------------ construction helpers
    curr_step = state_property("curr_step")
    max_token_len = state_property("max_seq_len")  # Atropos 0.4's name
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

        The default runs ``collect_trajectory(item)`` ``group_size`` times concurrently, each
        bounded by ``config.rollout_timeout``, and aggregates the completed items into one
        group: ``tokens``/``masks``/``scores`` always, each optional per-sequence field
        (``inference_logprobs``, ``advantages``, ``messages`` ...) when every item has it (None
        when no item has it), merged ``group_overrides``, and the rollout outcomes
        (``rollout_ids``, ``attempts``, failed members in ``excluded``; see
        :mod:`atroposlib.envs.outcomes`). A rollout that raised or timed out fails alone;
        ``config.failed_rollout_policy`` decides what becomes of its group.

        Returns:
            ``(group or None, backlog_items)``: None when any rollout returned None, or when
            fewer than ``min_completed_rollouts`` rollouts completed.

        Raises:
            Exception: every rollout failed, or one failed under policy ``drop``: the first
                rollout's exception, so the runner classifies it as before.

        Raises:
            RolloutError: an item is not a dict, or items disagree on an optional field.
        """
        members = await self.run_rollouts(lambda _i: self.collect_trajectory(item),
                                          self.config.group_size)
        if members is None:
            return None, []
        items, backlog = gather_rollouts([m.value for m in members if m.completed])
        if items is None:
            self.stats["rollouts_returned_none"] += 1
            return None, backlog
        group = aggregate_items(items)
        attach_outcomes(group, members, timeout=self.config.rollout_timeout, stats=self.stats)
        return group, backlog

    async def run_rollouts(
        self, roll: Callable[[int], Awaitable[Any]], n: int, ids: list[str] | None = None
    ) -> list[Member] | None:
        """Run a group's ``n`` rollouts, ``roll(i)``, under the config's outcome settings.

        Each attempt is bounded by ``config.rollout_timeout``; failed members are rolled out
        again ``config.max_rollout_retries`` times under policy ``retry``. Pass the result to
        :func:`~atroposlib.envs.outcomes.attach_outcomes` once the group is built from the
        completed members' values. ``ids``: the members' rollout ids (default: fresh ones).

        Returns:
            The members (:class:`~atroposlib.envs.outcomes.Member`), or None when the group
            is dropped for having fewer than ``config.min_completed_rollouts`` completed members
            (counted as ``groups_dropped_too_few_completed``).

        Raises:
            Exception: every member failed, or one failed under policy ``drop`` (the first
                member's exception, raised again).
        """
        config = self.config
        members = await run_members(
            roll, n, timeout=config.rollout_timeout, ids=ids,
            retries=config.max_rollout_retries if config.failed_rollout_policy == "retry" else 0)
        try:
            kept = keep_group(members, config.failed_rollout_policy, config.min_completed_rollouts)
        except Exception:
            self._run_state.drops.add_members(members, "failed_members")  # for run-api's ledger
            raise
        if not kept:
            self.stats["groups_dropped_too_few_completed"] += 1
            self._run_state.drops.add_members(members, "too_few_completed")
            return None
        return members

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

    def item_id(self, item: Item) -> Hashable | None:
        """A stable identity of a training item, for the item filter (``--env.item_filter.*``).

        Items with the same id share one record of how their groups scored. Default: the
        item's JSON (sorted keys; values JSON cannot hold written with ``str``;
        :func:`~atroposlib.envs.item_filter.item_key`). Override it to return a dataset index
        or key, or None for items that should never be filtered.
        """
        from atroposlib.envs.item_filter import item_key

        return item_key(item)

    def item_features(self, item: Item) -> Mapping[str, float] | None:
        """Numeric features of a training item, for the item filter's free screen.

        With ``--env.item_filter.screen_signal features`` a logistic model learns from these
        which items' groups come back all solved or all failed, and the screen skips them
        before sampling (:mod:`atroposlib.envs.item_features`). Default:
        :func:`~atroposlib.envs.item_features.text_features` of the item's text (a string item
        itself, else its JSON). Override it with what makes an item hard (an arithmetic
        problem's digit counts and carries); return None for an item that should not be
        screened. Values must be finite numbers.
        """
        from atroposlib.envs.item_features import item_text, text_features

        return text_features(item_text(item))


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
