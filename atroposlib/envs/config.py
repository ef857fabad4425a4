"""``BaseEnvConfig``: the pydantic settings every environment shares."""

from __future__ import annotations

import sys
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from atroposlib.defaults import (
    DEFAULT_API_URL,
    DEFAULT_INFERENCE_MODEL,
    DEFAULT_INFERENCE_URL,
    DEFAULT_ROLLOUT_TIMEOUT_S,
)
from atroposlib.envs.item_filter import LEGACY_KEYS, ItemFilterConfig, move_legacy_keys
from atroposlib.errors import AtroposWarning, ConfigError
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.inference.clients.config import APIServerConfig


class UnknownConfigFieldWarning(AtroposWarning):
    """An env config was given keyword fields its class does not declare.

    Raised (as a warning) when Python code builds a config with extra keywords, e.g.
    ``BaseEnvConfig(score_buffer_size=5)``: the values are kept as attributes so existing
    environments run unmodified, but they are not validated and have no ``--env.*`` flag.
    """


class FrozenConfigError(ConfigError, AttributeError):
    """A field of an env config was assigned after a runner started (the config is read-only)."""


class EvalHandlingEnum(StrEnum):
    """What training rollouts do while an evaluation runs in serve mode."""

    STOP_TRAIN = "STOP_TRAIN"
    LIMIT_TRAIN = "LIMIT_TRAIN"
    NONE = "NONE"


class BaseEnvConfig(BaseModel):
    """Settings shared by every environment. Subclass it to add env-specific fields.

    Every field appears on the CLI as ``--env.<field>`` and in YAML under ``env:``.

    Unknown keys depend on who wrote them. On the command line and in YAML a person typed
    them, so the env CLI rejects them with a did-you-mean suggestion. Keyword fields set in
    Python code (an environment's ``config_init`` passing ``dataset_path=...`` to the base
    class, as many existing environments do) are accepted and kept as attributes
    (``config.dataset_path``), with one :class:`UnknownConfigFieldWarning` naming them all;
    declare them on a subclass to get validation and a ``--env.*`` flag.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, use_enum_values=False)

    #: Earlier flat keys still accepted (in Python, YAML and as hidden ``--env.*`` flags) and
    #: the nested field each one sets (``difficulty_filter_floor`` -> ``item_filter.floor``).
    legacy_keys: ClassVar[dict[str, str]] = {old: f"item_filter.{new}" for old, new in LEGACY_KEYS.items()}

    group_size: int = Field(default=4, ge=1, description="Rollouts (responses) per group.")
    max_num_workers: int = Field(
        default=-1,
        description="Rollout groups in flight at once (a hard cap); -1 = automatic: "
        "max_num_workers_per_node x number of inference servers, raised in serve mode to what "
        "keeps the trainer fed (within the off-policy window).",
    )
    max_eval_workers: int = Field(default=16, description="Concurrent evaluation tasks.")
    max_num_workers_per_node: int = Field(
        default=8, description="Groups in flight per inference server when max_num_workers=-1."
    )
    steps_per_eval: int = Field(
        default=100, description="Run evaluate() every this many trainer steps (serve mode)."
    )
    max_token_length: int = Field(
        default=2048, description="Longest sequence (prompt + completion), in tokens; max_seq_len."
    )
    eval_handling: EvalHandlingEnum = Field(
        default=EvalHandlingEnum.STOP_TRAIN,
        description="While evaluating: STOP_TRAIN pauses rollouts, LIMIT_TRAIN caps them at "
        "eval_limit_ratio, NONE keeps going.",
    )
    eval_limit_ratio: float = Field(
        default=0.5, description="Fraction of workers kept during eval under LIMIT_TRAIN."
    )
    inference_weight: float = Field(
        default=1.0,
        description="Sampling weight sent to the API at registration (scales this env's "
        "share of inference concurrency).",
    )
    batch_size: int = Field(
        default=-1, description="Trainer batch size in sequences; -1 = read from the API /info."
    )
    max_batches_offpolicy: int = Field(
        default=3,
        description="Stop spawning rollouts while the API queue, unsent groups and rollouts "
        "in flight make this many batches (bounds off-policy lag); rollouts in flight count as "
        "the share of recent rollouts that gave a usable group, so groups dropped for equal "
        "scores do not hold places. Serve mode narrows it to run-api's max_staleness minus the "
        "steps a rollout takes; <= 0 disables (the staleness limit still applies).",
    )
    follow_trainer_pace: bool = Field(
        default=True,
        description="Serve mode: narrow max_batches_offpolicy to run-api's max_staleness minus "
        "the trainer steps one rollout takes, and (max_num_workers=-1) raise the rollout cap to "
        "what keeps the trainer fed. false: max_batches_offpolicy and the per-server cap as set.",
    )
    item_filter: ItemFilterConfig = Field(
        default_factory=ItemFilterConfig,
        description="The item filter (atroposlib.envs.item_filter): skip, before sampling, items "
        "whose recent groups all scored the same. --env.item_filter.<field>; the earlier flat "
        "keys difficulty_filter, difficulty_filter_<field> and zero_variance_keep are accepted.",
    )
    tokenizer_name: str | None = Field(
        default=None,
        validate_default=True,
        description="HF tokenizer name or local directory (loaded offline when "
        "HF_HUB_OFFLINE=1). null (the default): the bundled SmolLM2-135M-Instruct directory "
        "(bundled/SmolLM2-135M-Instruct under $ATROPOS_CACHE_DIR, $XDG_CACHE_HOME/atroposlib "
        "or ~/.cache/atroposlib; "
        "`atropos-bundled-model` prepares it). Set it to the tokenizer of the model your "
        "inference server serves.",
    )
    use_wandb: bool = Field(default=True, description="Log metrics to Weights & Biases.")
    rollout_server_url: str = Field(
        default=DEFAULT_API_URL, description="Trajectory API (run-api) base URL."
    )
    total_steps: int = Field(
        default=1000,
        description="serve: stop after this trainer step (-1 = the trainer's num_steps); "
        "process: number of groups to generate (<= 0: until get_next_item returns None).",
    )
    wandb_name: str | None = Field(
        default=None, description="Run name; defaults to the env's `name` when registering."
    )
    num_rollouts_to_keep: int = Field(
        default=32, description="Rollouts kept for the W&B rollout table."
    )
    num_rollouts_per_group_for_logging: int = Field(
        default=1, description="Rollouts per group added to the W&B table (-1 = all)."
    )
    ensure_scores_are_not_same: bool = Field(
        default=True,
        description="Drop groups whose scores are all identical (they carry no GRPO signal).",
    )
    data_path_to_save_groups: str | None = Field(
        default=None,
        description="Also write every group to this JSONL file (an existing file gets _1, _2 "
        "... appended); process mode writes a sibling .html too.",
    )
    data_dir_to_save_evals: str | None = Field(
        default=None,
        description="Directory for evaluation metrics.json / samples.jsonl (evaluate mode "
        "default: evals/<name>-<timestamp>/).",
    )
    min_items_sent_before_logging: int = Field(
        default=2, description="Groups sent in a step before wandb_log is called."
    )
    include_messages: bool = Field(
        default=False, description="Attach chat messages to each group (for viewing)."
    )
    record_items: bool = Field(
        default=True,
        description="Send each group's dataset item with it (the wire's optional `item` field, "
        "JSON of at most 64 KiB; stock Atropos servers ignore it), so `atropos-replay rescore` "
        "can score the recorded completions again. An item that is not JSON or is larger is "
        "left off its group (logged once; the env's stats count items_not_recorded).",
    )
    min_batch_allocation: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Minimum fraction of every batch reserved for this env (null = none).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve mode: expose Prometheus metrics (rollouts in flight, groups sent and "
        "dropped by reason) at http://<metrics_host>:PORT/metrics; 0 picks a free port; unset: off.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Interface for metrics_port (the endpoint has no authentication).",
    )
    worker_timeout: float = Field(
        default=600,
        description="Seconds before a rollout group is cancelled (its item is re-queued); "
        "<= 0 disables.",
    )
    rollout_timeout: float = Field(
        default=DEFAULT_ROLLOUT_TIMEOUT_S, gt=0,
        description="Seconds one rollout of a group (its inference and scoring) may take; past "
        "it the member fails with kind 'timeout' and the group goes on without it "
        "(failed_rollout_policy). Applies to the rollouts atroposlib runs (collect_trajectory, "
        "MultiTurnEnv and SingleTurnEnv episodes).",
    )
    failed_rollout_policy: Literal["retry", "shrink", "drop"] = Field(
        default="retry",
        description="What a group with failed members becomes: 'retry' rolls the failed members "
        "out again (max_rollout_retries times) and drops the group if one still fails, so only "
        "whole groups are sent; 'shrink' sends the completed members when at least "
        "min_completed_rollouts completed (a shrunk group packs into run-api's exact-size batches "
        "only beside groups that complete its size: see the Rollout outcomes guide); 'drop' drops "
        "the group at the first failure. Failed members travel in the group's 'excluded' list "
        "and are never trained on.",
    )
    min_completed_rollouts: int = Field(
        default=2, ge=1,
        description="failed_rollout_policy 'shrink': fewest completed members a group with "
        "failures may be sent with (a group of one has no baseline: the trainer then uses its raw "
        "score as its advantage, as Atropos 0.4 does for single-sequence groups).",
    )
    max_rollout_retries: int = Field(
        default=2, ge=0, le=10,
        description="failed_rollout_policy 'retry': times each failed member is rolled out again.",
    )
    max_consecutive_failures: int = Field(
        default=200,
        description="process mode: stop with an error after this many items in a row produced no "
        "usable group (every rollout failing, e.g. a wrong model name); <= 0 never stops.",
    )
    thinking_mode: bool = Field(default=False, description="Enable reasoning/thinking output.")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        default=None, description="Reasoning effort sent to reasoning-capable servers."
    )
    max_reasoning_tokens: int | None = Field(
        default=None, ge=1024, le=32000, description="Reasoning token budget."
    )
    custom_thinking_prompt: str | None = Field(
        default=None, description="System prompt used for thinking mode instead of the default."
    )

    _frozen: bool = PrivateAttr(default=False)

    @property
    def max_seq_len(self) -> int:
        """The env's longest sequence (prompt + completion) in tokens: ``max_token_length``.

        ``max_seq_len`` is the library's one name for a sequence-length limit; the config key
        and flag keep Atropos 0.4's spelling (``max_token_length``, ``--env.max_token_length``).
        """
        return self.max_token_length

    def freeze(self) -> None:
        """Make the config read-only; runners call this when they start.

        The env and its ``config_init``/``__init__`` may adjust fields until then. A frozen
        config is shared by the env and its runner, so a later change would be seen by some
        parts of the run and not others; ``model_copy(update=...)`` gives a new, unfrozen one.
        """
        self._frozen = True

    @property
    def frozen(self) -> bool:
        """True once a runner has started with this config (assignments then raise)."""
        return self._frozen

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and self.__pydantic_private__ and self.__pydantic_private__.get("_frozen"):
            raise FrozenConfigError(
                f"cannot set {type(self).__name__}.{name}: the env config is read-only once a "
                "runner has started. Set it before (in config_init, the env's __init__ or with "
                f"--env.{name}); trainer-given values (batch_size, max_seq_len, total_steps) "
                "are in env.run_state"
            )
        super().__setattr__(name, value)

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Any:
        """A copy (with ``update`` applied) that is not frozen."""
        copy = super().model_copy(update=update, deep=deep)
        copy._frozen = False
        return copy

    @model_validator(mode="before")
    @classmethod
    def _move_legacy_item_filter_keys(cls, data: Any) -> Any:
        # difficulty_filter*, zero_variance_keep -> item_filter (logged once per key)
        return move_legacy_keys(data, cls.model_fields) if isinstance(data, dict) else data

    @field_validator("tokenizer_name", mode="after")
    @classmethod
    def _default_tokenizer(cls, value: str | None) -> str:
        # Offline-first: no hub id as default; the bundled model's tokenizer is always local.
        return str(bundled_model_dir()) if value is None else value

    @model_validator(mode="after")
    def _check_consistency(self) -> BaseEnvConfig:
        # group_size vs batch_size is checked in serve mode once the trainer's /info batch
        # size is known: a config_init batch_size is only a placeholder that /info overrides.
        if self.max_num_workers == 0 or self.max_num_workers < -1:
            raise ValueError(
                f"max_num_workers must be -1 (automatic) or >= 1, got {self.max_num_workers}"
            )
        return self

    def model_post_init(self, context: Any, /) -> None:
        """Warn once per construction about keyword fields the class does not declare."""
        super().model_post_init(context)
        if self.model_extra:
            names = ", ".join(sorted(self.model_extra))
            warnings.warn(
                f"{type(self).__name__} got field(s) it does not declare: {names}. They are kept "
                "as attributes but not validated and have no --env.* flag; declare them on a "
                f"{type(self).__name__} subclass to fix this.",
                UnknownConfigFieldWarning,
                stacklevel=_caller_stacklevel(),
            )



#: The shared development vLLM (model ``smollm2``) that the defaults point at.
DEFAULT_BASE_URL = DEFAULT_INFERENCE_URL


def default_server(**overrides: Any) -> APIServerConfig:
    """A stock-vLLM server config for the bundled model at :data:`DEFAULT_BASE_URL`.

    ``server_type="vllm"`` because the envs use ``managed_server`` (exact tokens and
    log-probs). Override on the command line: ``--openai.base_url``, ``--openai.model_name``.
    """
    values: dict[str, Any] = {
        "model_name": DEFAULT_INFERENCE_MODEL,
        "base_url": DEFAULT_BASE_URL,
        "api_key": "x",
        "server_type": "vllm",
        "num_requests_for_eval": 64,
    }
    values.update(overrides)
    return APIServerConfig(**values)

def _caller_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel of the first frame outside pydantic and this module."""
    import pydantic

    skip = (str(Path(pydantic.__file__).parent), __file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame, level = frame.f_back, level + 1
    return level


__all__ = ["DEFAULT_BASE_URL", "BaseEnvConfig", "EvalHandlingEnum", "FrozenConfigError",
           "UnknownConfigFieldWarning", "default_server"]
