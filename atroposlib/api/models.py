"""Wire types of the trajectory API: one place for every request and response body.

Imported by the server routes, the environment sender and the trainer client. Field names and
shapes are those of Atropos 0.4's request models and ``ScoredDataGroup``, so stock Atropos
environments and trainers work unchanged. Numbers are bounded (see ``whole_number``, ``Finite``
and ``free_json_error``) so that nothing accepted can fail later when stored or served.

Shape notation: ``G`` = sequences in a group (group size), ``T_i`` = length in tokens of
sequence ``i``, ``K`` = top-k width of distillation arrays.

Wire conventions (Atropos 0.4, kept verbatim):

* ``tokens[i]`` is the full sequence, prompt plus completion.
* ``masks[i]`` has the same length and holds *labels*, not a 0/1 mask: the token id itself at
  trained positions, ``-100`` (the ignore index, :data:`IGNORE_INDEX`) at untrained ones.
* ``inference_logprobs[i]`` has the same length; ``1.0`` at masked positions (an impossible
  log-probability used as a placeholder) and the sampler's log-prob at generated positions.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    WithJsonSchema,
    field_validator,
    model_validator,
)

# the wire's label conventions, defined with the shared types below every package
from atroposlib.api.shapes import PER_TOKEN_FIELDS, group_shape_error, outcome_shape_error
from atroposlib.type_definitions import IGNORE_INDEX, MASKED_LOGPROB  # noqa: F401 - re-exported

#: Largest absolute score run-api accepts. Rewards are small numbers (GRPO normalises them per
#: group); a score past this bound is a broken reward function, and squared in a group's variance
#: it overflows float32 (1e308 does even in float64), so it is refused with the reason
#: ``score_out_of_bounds`` (see :mod:`atroposlib.api.checks`).
MAX_ABS_SCORE = 1e6
#: Largest size, step or count the API accepts (sizes, lengths, steps, env ids, weights).
MAX_SIZE = 2**31
#: Free-form JSON (messages, generation_params, overrides, images, item) may hold integers in this
#: range only: the server stores and serves them as signed 64-bit integers.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Largest ``item`` (the dataset item of a group) run-api accepts, in bytes of compact JSON.
MAX_ITEM_BYTES = 64 * 1024


def whole_number(low: int, high: int) -> Any:
    """A JSON integer in ``[low, high]``: the type of every scalar integer field of the wire.

    Accepts what JSON Schema calls an integer (``5`` and ``5.0``); refuses ``true``, ``"5"``,
    fractions, NaN, Infinity and values out of range, with one message saying what is allowed.
    """

    def check(value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"must be a whole number from {low} to {high}; got {value!r}")
        return value

    return Annotated[int, PlainValidator(check, json_schema_input_type=int),
                     WithJsonSchema({"type": "integer", "minimum": low, "maximum": high})]


#: A positive size (sequences, tokens): 1 .. 2**31.
Size = whole_number(1, MAX_SIZE)
#: A step or an id: 0 .. 2**31.
Index = whole_number(0, MAX_SIZE)
#: A count the server only echoes, where -1 or 0 may mean "none": -1 .. 2**31.
EchoedCount = whole_number(-1, MAX_SIZE)
# Per-token integers are strict JSON integers (``5``, not ``5.0``, ``true`` or ``"5"``): they are
# most of a group's numbers, and a strict check is the fast one.
#: A token id: 0 .. 2**31 - 1.
TokenId = Annotated[int, Strict(), Field(ge=0, lt=MAX_SIZE)]
#: A label in ``masks`` (``IGNORE_INDEX`` or a token id): a signed 32-bit integer.
Label = Annotated[int, Strict(), Field(ge=-MAX_SIZE, lt=MAX_SIZE)]
#: A finite float (JSON integers accepted; never ``true``, ``"5"``, NaN or +-Infinity, which
#: JSON cannot carry back: they would be served as null and poison a trainer's loss).
Finite = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class Registration(BaseModel):
    """``POST /register`` body: a trainer announces itself and the run's settings."""

    wandb_group: str = Field(description="W&B group shared by the trainer and the envs.")
    wandb_project: str = Field(description="W&B project shared by the trainer and the envs.")
    batch_size: Size = Field(description="Sequences per batch served by GET /batch.")
    max_token_len: Size = Field(
        description="Longest sequence the trainer accepts, in tokens; run-api refuses longer ones.")
    checkpoint_dir: str = Field(description="Where the trainer saves checkpoints; echoed to envs.")
    save_checkpoint_interval: EchoedCount = Field(
        description="Trainer checkpoint interval, in steps (echoed to envs; -1 or 0: none).")
    starting_step: Index = Field(description="Step counter value to start from (resume).")
    num_steps: EchoedCount = Field(
        description="Total training steps the trainer will run (echoed to envs; -1: unknown).")
    # atroposlib extension (stock Atropos servers ignore unknown keys): overrides run-api's
    # --max-staleness for this run when given.
    max_staleness: Index | None = Field(
        default=None,
        description="Drop queued groups more than this many policy versions (trainer steps) older "
        "than the current step instead of serving them (null: use run-api's --max-staleness).",
    )
    # atroposlib extension: Atropos 0.4 trainers omit it, and the vocabulary checks are skipped.
    vocab_size: Size | None = Field(
        default=None,
        description="Size of the trainer's token vocabulary (the model's embedding rows): run-api "
        "refuses groups with token ids or labels outside [0, vocab_size), the mark of an env "
        "whose tokenizer differs from the trainer's (null: not checked).",
    )


class RegistrationResponse(BaseModel):
    """``POST /register`` response."""

    uuid: int = Field(description="A fresh 128-bit integer identifying this registration.")
    # atroposlib extensions (Atropos 0.4 trainers read only uuid)
    current_step: int | None = Field(
        default=None, description="The server's step after this registration: starting_step, "
        "or the server's own step when the trainer resumes at or before it.")
    oldest_replayable_step: int | None = Field(
        default=None, description="Oldest step whose batch GET /batch?step=N answers again "
        "(null: none kept). A resuming trainer fetches steps starting_step+1..current_step.")


class RegisterEnv(BaseModel):
    """``POST /register-env`` body: an environment announces itself."""

    max_token_length: Size = Field(description="The env's max sequence length in tokens.")
    desired_name: str = Field(description="Base name; the server appends `_k` to make it unique.")
    weight: Finite = Field(
        ge=0, le=MAX_SIZE, description="Sampling weight; feeds `env_weight` in /status-env.")
    group_size: Size = Field(description="Sequences per group this env sends.")
    min_batch_allocation: Finite | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Minimum fraction of every batch reserved for this env (null: none).",
    )


class RegisterEnvResponse(BaseModel):
    """``POST /register-env`` success response (else ``{"status": "wait for trainer to start"}``)."""

    status: str = Field(description='"success", or "wait for trainer to start".')
    env_id: int | None = Field(default=None, description="Id to put in every scored group.")
    wandb_name: str | None = Field(default=None, description="Unique name `<desired>_<k>`.")
    checkpoint_dir: str | None = Field(default=None, description="The trainer's checkpoint dir.")
    starting_step: int | None = Field(default=None, description="The server's current step.")
    checkpoint_interval: int | None = Field(
        default=None, description="The trainer's save_checkpoint_interval, in steps."
    )
    num_steps: int | None = Field(default=None, description="Total steps the trainer will run.")


class EnvIdentifier(BaseModel):
    """Body of ``/disconnect-env`` and ``GET /status-env`` (the latter also takes ``?env_id=``)."""

    env_id: Index = Field(description="The id returned by /register-env.")


#: Why a masked member is kept out of training: cut off at the token budget, a reply in the wrong
#: format, or the env's own reason.
MaskReason = Literal["truncated", "format", "env"]
#: Why a failed member has no score: the inference call failed, it ran past its timeout, the
#: env's code (scorer, tool, parser) raised, or the sandbox running it failed.
FailureKind = Literal["inference", "timeout", "env_error", "sandbox"]
#: Longest rollout id, and longest failure message kept, in characters.
MAX_ROLLOUT_ID_CHARS = 200
MAX_OUTCOME_MESSAGE_CHARS = 4000
#: A stable rollout id: 1 .. 200 characters.
RolloutId = Annotated[str, Field(min_length=1, max_length=MAX_ROLLOUT_ID_CHARS)]


class ExcludedMember(BaseModel):
    """One member of a group that is not trained on: masked (kept for inspection) or failed.

    An atroposlib extension carried in :attr:`ScoredData.excluded`. Stock Atropos servers and
    trainers ignore it, so an excluded member can never be trained as a real sample: it is not
    in the group's ``tokens``/``masks``/``scores`` lists and counts in no group statistic.
    A failed member has no score and never gets one; a masked member may carry the score the
    env gave it and its sequence (``tokens``/``masks``, ``[T]``) for inspection.
    """

    model_config = ConfigDict(extra="ignore")

    rollout_id: RolloutId = Field(description="Stable id of the rollout (unique in its group).")
    attempt: Index = Field(default=0, description="0 for the first try, k for the k-th retry.")
    outcome: Literal["masked", "failed"] = Field(
        description="masked: rolled out but weighted 0 (see reason); failed: no usable rollout "
        "(see kind).")
    reason: MaskReason | None = Field(
        default=None, description="Why a masked member is masked (required when masked).")
    kind: FailureKind | None = Field(
        default=None, description="What failed for a failed member (required when failed).")
    message: str | None = Field(
        default=None, max_length=MAX_OUTCOME_MESSAGE_CHARS,
        description="Human-readable detail (the exception, the env's note).")
    score: Finite | None = Field(
        default=None, description="The env's score of a masked member (never set when failed).")
    tokens: list[TokenId] | None = Field(
        default=None, description="[T] a masked member's sequence, for inspection only.")
    masks: list[Label] | None = Field(
        default=None, description="[T] a masked member's labels, for inspection only.")

    @model_validator(mode="after")
    def _outcome_agrees(self) -> ExcludedMember:
        who = f"excluded member {self.rollout_id!r}"
        if self.outcome == "masked":
            if self.reason is None:
                raise ValueError(f"{who} is masked but has no reason; set reason to one of "
                                 "'truncated', 'format' or 'env'")
            if self.kind is not None:
                raise ValueError(f"{who} is masked but has a failure kind; kind is for failed "
                                 "members only")
        else:
            if self.kind is None:
                raise ValueError(f"{who} failed but has no kind; set kind to one of "
                                 "'inference', 'timeout', 'env_error' or 'sandbox'")
            if self.reason is not None:
                raise ValueError(f"{who} failed but has a mask reason; reason is for masked "
                                 "members only")
            if self.score is not None:
                raise ValueError(f"{who} failed but has a score: a failed member has no score "
                                 "(send outcome 'masked' to keep a scored sequence out of training)")
            if self.tokens is not None or self.masks is not None:
                raise ValueError(f"{who} failed but carries tokens/masks; only masked members "
                                 "keep their sequence")
        if (self.tokens is None) != (self.masks is None):
            raise ValueError(f"{who}: send tokens and masks together, or neither")
        if self.tokens is not None and len(self.tokens) != len(self.masks or ()):
            raise ValueError(f"{who}: masks has {len(self.masks or ())} entries but tokens has "
                             f"{len(self.tokens)}")
        return self


class EnvDrops(BaseModel):
    """Groups an env sampled and then dropped itself (its filters), since the last group it sent.

    An atroposlib extension carried by a group (:attr:`ScoredData.env_drops`) for run-api's
    ledger (``docs/guides/ledger.md``); it rides on the group's POST (a retry counts it once),
    is never served back, and stock servers ignore it. Tokens are completion tokens.
    """

    model_config = ConfigDict(extra="ignore")

    groups: Index = Field(description="Groups dropped.")
    completed: Index = Field(default=0, description="Their completed rollouts.")
    masked: Index = Field(default=0, description="Their masked rollouts.")
    failed: Index = Field(default=0, description="Their failed rollouts (retries included).")
    tokens: Index = Field(default=0, description="Completion tokens of their kept members.")
    masked_tokens: Index = Field(default=0, description="Those of their masked members.")
    groups_by_reason: dict[str, Index] = Field(default_factory=dict, description="Groups by reason.")
    tokens_by_reason: dict[str, Index] = Field(default_factory=dict, description="Tokens by reason.")

    @model_validator(mode="after")
    def _reasons_add_up(self) -> EnvDrops:
        for name, total in (("groups", self.groups), ("tokens", self.tokens)):
            parts = getattr(self, f"{name}_by_reason")
            if parts and sum(parts.values()) != total:
                raise ValueError(f"env_drops.{name}_by_reason sums to {sum(parts.values())} "
                                 f"but {name} is {total}")
        return self


class ScoredData(BaseModel):
    """One scored rollout group: ``POST /scored_data`` body, and each element of a ``/batch``.

    Unknown top-level keys are ignored (Atropos tolerance). Messages pass through verbatim; each
    message must have ``role`` and ``content``. Rows must agree: ``len(tokens) == len(masks) ==
    len(scores)`` and every per-token field has ``T_i`` entries in row ``i``, except that an
    ``advantages`` row may be longer (Atropos 0.4 accepted that, e.g. from an env that dropped a
    cut-off final token after computing advantages): its entries past ``T_i`` belong to no
    token and are cut off here.
    """

    model_config = ConfigDict(extra="ignore")

    tokens: list[list[TokenId]] = Field(
        # documented, not enforced here: group_shape_error says "tokens is empty" more clearly
        json_schema_extra={"minItems": 1},
        description="[G][T_i] token ids, prompt + completion.")
    masks: list[list[Label]] = Field(
        description="[G][T_i] labels (the wire name is masks): the token id at trained positions, "
        "-100 (the ignore index) at untrained ones.")
    scores: list[Finite] = Field(description="[G] scalar reward per sequence.")
    advantages: list[list[Finite]] | None = Field(
        default=None, description="[G][T_i] optional per-token advantages (used when given)."
    )
    ref_logprobs: list[list[Finite]] | None = Field(
        default=None, description="[G][T_i] optional reference-policy log-probs."
    )
    messages: list[list[dict[str, Any]]] | None = Field(
        default=None, description="[G][turns] optional chat messages ({role, content, ...})."
    )
    generation_params: dict[str, Any] | None = Field(
        default=None, description="Sampling parameters used (e.g. temperature)."
    )
    inference_logprobs: list[list[Finite]] | None = Field(
        default=None, description="[G][T_i] sampler log-probs; 1.0 at masked positions."
    )
    overrides: list[dict[str, Any]] | None = Field(
        default=None, description="[G] per-sequence overrides (set_advantage_to_zero, temperature)."
    )
    group_overrides: dict[str, Any] | None = Field(
        default=None, description="Per-group overrides (group_size, temperature, sft, ...)."
    )
    images: Any | None = Field(default=None, description="Optional images (base64 / data URIs).")
    env_id: Index | None = Field(default=None, description="Sender's env id, if registered.")
    distill_token_ids: list[list[list[TokenId]]] | None = Field(
        default=None, description="[G][T_i][K] teacher top-k token ids."
    )
    distill_logprobs: list[list[list[Finite]]] | None = Field(
        default=None, description="[G][T_i][K] teacher top-k log-probs."
    )
    # atroposlib extension: stock Atropos servers ignore this key (unknown keys are dropped) and
    # stock envs never send it. It is kept as queue metadata, not served back in /batch.
    policy_version: Index | None = Field(
        default=None,
        description="Policy version (trainer step) of the weights that generated this group; "
        "run-api --max-staleness drops groups that are too old. Null: never dropped.",
    )
    # atroposlib extensions: rollout outcomes (docs/guides/rollout-outcomes.md). Stock Atropos
    # servers and trainers ignore these keys; run-api serves them back in /batch only when set,
    # so a stock group is served with exactly its 14 keys.
    rollout_ids: list[RolloutId] | None = Field(
        default=None, description="[G] stable rollout id of each kept (completed) member.")
    attempts: list[Index] | None = Field(
        default=None, description="[G] attempt of each kept member (0: first try).")
    excluded: list[ExcludedMember] | None = Field(
        default=None,
        description="Members of the group left out of tokens/masks/scores: masked (weighted 0, "
        "kept for inspection) or failed (no score). They count in no group statistic. A group "
        "that carries this list is complete as sent and is never merged with others.")
    # atroposlib extension: queue metadata for run-api's ledger, never served back
    env_drops: EnvDrops | None = Field(default=None, description="Groups the sender dropped "
                                       "after sampling since its last group, for the ledger.")
    # atroposlib extension: stock Atropos servers and trainers ignore it; run-api stores it and
    # serves it back in /batch only when set (after the outcome fields).
    item: Any | None = Field(
        default=None, description="The dataset item the group was sampled for (free-form JSON, "
        f"at most {MAX_ITEM_BYTES} bytes), as the env's scorer takes it: `atropos-replay "
        "rescore` scores the recorded completions again from it. Null: not recorded.")

    @field_validator("messages")
    @classmethod
    def _messages_have_role_and_content(cls, value: Any) -> Any:
        # after the type check: value is None or a list of lists of dicts
        for i, conversation in enumerate(value or ()):
            for j, message in enumerate(conversation):
                if "role" not in message or "content" not in message:
                    raise ValueError(
                        f"messages[{i}][{j}] must be an object with 'role' and 'content' keys"
                    )
        return value

    @field_validator("messages", "generation_params", "overrides", "group_overrides", "images")
    @classmethod
    def _json_round_trips(cls, value: Any) -> Any:
        problem = free_json_error(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("item")
    @classmethod
    def _item_is_small_json(cls, value: Any) -> Any:
        problem = free_json_error(value)
        if problem:
            raise ValueError(problem)
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        if size > MAX_ITEM_BYTES:
            raise ValueError(f"item is {size} bytes of JSON, more than the {MAX_ITEM_BYTES} a "
                             "group may carry: send a smaller item (the fields the env's scorer "
                             "reads, or an id into its dataset), or leave item out")
        return value

    @model_validator(mode="after")
    def _rows_agree(self) -> ScoredData:
        # attribute access, not model_dump: no copy of the (large) token lists
        problem = group_shape_error({name: getattr(self, name) for name in _SHAPE_FIELDS})
        if problem:
            raise ValueError(problem)
        problem = outcome_shape_error(self.rollout_ids, self.attempts, self.excluded,
                                      len(self.tokens))
        if problem:
            raise ValueError(problem)
        if self.advantages is not None and any(
            len(row) > len(seq) for row, seq in zip(self.advantages, self.tokens, strict=True)
        ):
            self.advantages = [
                row[: len(seq)] for row, seq in zip(self.advantages, self.tokens, strict=True)
            ]
        return self


def free_json_error(value: Any) -> str | None:
    """Return why free-form JSON cannot be stored and served back as sent, or None.

    The server serves what it stores as JSON with signed 64-bit integers and without NaN or
    Infinity, so a larger integer or a non-finite float would fail or come back changed.

    Args:
        value: parsed JSON (dicts, lists, str, int, float, bool, None), any depth.

    Returns:
        A message naming the first bad value's path (e.g. ``[0]["temperature"]``), or None.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{path}[{key!r}]", v) for key, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
        elif isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
            return (f"value at {path or 'top level'} is {item}, outside the signed 64-bit range "
                    f"[{INT64_MIN}, {INT64_MAX}]; send it as a string or a float")
        elif isinstance(item, float) and not math.isfinite(item):
            return (f"value at {path or 'top level'} is {item}: JSON numbers must be finite "
                    "(NaN and Infinity would be served back as null)")
    return None


_SHAPE_FIELDS = ("tokens", "masks", "scores", *PER_TOKEN_FIELDS, "overrides", "messages",
                 "distill_token_ids", "distill_logprobs")
#: The rollout-outcome extension fields: stored with a group and served back only when set.
OUTCOME_FIELDS = ("rollout_ids", "attempts", "excluded")
#: Every field of a stored group, in wire order (the 14 keys upstream returns; ``policy_version``
#: is queue metadata, not part of the served group, and :data:`OUTCOME_FIELDS` then ``item``
#: follow these keys only when a group carries them).
GROUP_FIELDS = tuple(name for name in ScoredData.model_fields
                     if name not in ("policy_version", "env_drops", "item")
                     and name not in OUTCOME_FIELDS)


class LatestExamplePlaceholder(BaseModel):
    """``GET /latest_example`` before any group was queued: nine empty arrays (Atropos 0.4).

    ``generation_params`` is ``[]`` here although real groups carry an object.
    """

    model_config = ConfigDict(extra="forbid")

    tokens: list[Any] = Field(max_length=0, description="Always [].")
    masks: list[Any] = Field(max_length=0, description="Always [].")
    scores: list[Any] = Field(max_length=0, description="Always [].")
    advantages: list[Any] = Field(max_length=0, description="Always [].")
    ref_logprobs: list[Any] = Field(max_length=0, description="Always [].")
    generation_params: list[Any] = Field(max_length=0, description="Always [] (sic).")
    inference_logprobs: list[Any] = Field(max_length=0, description="Always [].")
    messages: list[Any] = Field(max_length=0, description="Always [].")
    images: list[Any] = Field(max_length=0, description="Always [].")


class ScoredDataResponse(BaseModel):
    """``POST /scored_data`` response."""

    status: str = Field(description='"received" (queued) or "buffered" (waiting to fill a group).')
    buffer_size: int | None = Field(
        default=None, description="Sequences still buffered for this env (only when buffered)."
    )


class ScoredDataListResponse(BaseModel):
    """``POST /scored_data_list`` response."""

    status: str = Field(description='Always "received".')
    groups_processed: int = Field(description="Number of groups in the request.")
    buffered: int | None = Field(default=None, description="How many of them were buffered.")
    last_buffer_size: int | None = Field(
        default=None, description="buffer_size reported for the last buffered group."
    )


class Batch(BaseModel):
    """``GET /batch`` response: ``batch`` is null until a full batch can be formed."""

    batch: list[ScoredData] | None = Field(
        description="Groups whose sequences sum exactly to the registered batch_size, FIFO."
    )


class Status(BaseModel):
    """``GET /status`` response."""

    current_step: int = Field(description="Batches served so far (plus starting_step).")
    queue_size: int = Field(description="Groups queued and not yet served.")
    max_staleness: int | None = Field(
        default=None, description="Staleness limit in force (only present when one is set).")
    stale_groups_dropped: dict[str, int] | None = Field(
        default=None, description="Groups dropped as too stale, per env id ('null' for groups "
        "without one); present when a staleness limit is set or something was dropped.")
    ledger: dict[str, Any] | None = Field(default=None, description="The run ledger (as GET "
                                          "/ledger), only with ?ledger=true.")


class EnvStatus(BaseModel):
    """``GET /status-env`` response."""

    current_step: int = Field(description="Batches served so far (plus starting_step).")
    queue_size: int = Field(description="Sequences ahead of this env, in units of its group size.")
    unallocated_fraction: float = Field(description="1 - sum of connected envs' minimums.")
    self_queue_size: int = Field(description="This env's own queued groups.")
    max_group_size: int = Field(description="Largest group size in the queue (>= 1).")
    env_weight: float = Field(description="This env's share of inference weight (>= 0.01).")
    stale_groups_dropped: int | None = Field(default=None, description=(
        "This env's groups dropped as too stale (present when a staleness limit is set or "
        "something was dropped)."))
    max_staleness: int | None = Field(default=None, description=(
        "Staleness limit in force, in steps (only when one is set; stock envs ignore it)."))


class Info(BaseModel):
    """``GET /info`` response; -1 sentinels before registration."""

    batch_size: int = Field(description="Sequences per batch (-1 before /register).")
    max_token_len: int = Field(description="Trainer's max sequence length (-1 before /register).")


class WandbInfo(BaseModel):
    """``GET /wandb_info`` response; nulls before registration."""

    group: str | None = Field(description="W&B group of the run (null before /register).")
    project: str | None = Field(description="W&B project of the run (null before /register).")
