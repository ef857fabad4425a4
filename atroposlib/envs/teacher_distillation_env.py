"""``TeacherDistillationEnv``: attach a teacher model's top-k prompt log-probs to every group.

Import surface (Atropos 0.4 compatible)::

    from atroposlib.envs.teacher_distillation_env import (
        TeacherDistillationConfig, TeacherDistillationEnv)

Subclass it instead of ``BaseEnv``; nothing else changes in the env. With
``--env.teacher_enabled`` every accepted group gets, just before it is sent (``serve``) or
saved (``process``), for each sequence ``i`` and token position ``t``:

* ``distill_token_ids[i][t]``: the ``K`` token ids the teacher ranks highest for position
  ``t`` given ``tokens[i][:t]`` (rank order), and
* ``distill_logprobs[i][t]``: their teacher log-probs (natural log),

so both are ``[G][T_i][K]`` and aligned with ``tokens``. Position 0 has no context and holds
``[]``. ``K = teacher_top_k``; ``teacher_top_k = 0`` means one entry per position: the actual
token ``tokens[i][t]`` and its teacher log-prob (what reverse-KL / on-policy distillation
needs); ``-1`` disables the fetch. The fields travel through the API to the trainer verbatim.

The teacher is queried with ``get_logprobs(input_ids=seq, top_k=..., max_tokens=1)`` (vLLM's
``prompt_logprobs``; use ``server_type: vllm``). A failed request, or an answer that does not
match the sequence (length, missing actual token, too few candidates), nulls BOTH fields of
that group, logs why and counts it in ``stats["teacher_groups_failed"]``: never silently wrong
data. ``group_overrides["teacher_top_k"]`` overrides ``K`` for one group,
``group_overrides["skip_teacher_top_k"]`` skips the fetch (both fields are then None).

Teacher and student must share a tokenizer (the ids are compared position by position); a
mismatch raises :class:`~atroposlib.errors.ConfigError` before any rollout.

Teacher servers come from the constructor (``teacher_server_configs=[APIServerConfig(...)]``)
or, on the command line of ``serve`` and ``process``, from ``--teacher.*`` flags / a YAML
``teacher:`` key (``process`` too, so offline datasets can carry teacher log-probs).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from pydantic import Field

from atroposlib.envs.base import BaseEnv, ScoredDataGroup
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.groups import CheckedGroups
from atroposlib.envs.teacher_servers import (
    check_server_tokenizers,
    resolve_teacher_server_configs,
    teacher_manager,
    tokenizer_difference,
)
from atroposlib.errors import AtroposError, ConfigError
from atroposlib.inference.clients.base import APIServer, actual_token_logprob
from atroposlib.inference.clients.config import APIServerConfig, ServerBaseline
from atroposlib.inference.clients.manager import ServerManager

logger = logging.getLogger(__name__)


class TeacherDistillationConfig(BaseEnvConfig):
    """``BaseEnvConfig`` plus the teacher switches."""

    teacher_enabled: bool = Field(
        default=False,
        description="Fetch teacher top-k prompt log-probs for every group (distill_token_ids / "
        "distill_logprobs). Needs teacher servers (--teacher.base_url ... or "
        "teacher_server_configs).",
    )
    teacher_top_k: int = Field(
        default=0,
        ge=-1,
        description="Teacher candidates per token position: K>0 = the K most likely ids, 0 = only "
        "the actual token's log-prob, -1 = do not fetch. Per group: "
        "group_overrides['teacher_top_k'].",
    )


class TeacherDistillationError(AtroposError):
    """The teacher's answer cannot be aligned with a sequence (the group's fields are nulled)."""


def align_teacher_logprobs(
    tokens: list[int], result: dict[str, Any], top_k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Turn one ``get_logprobs`` answer into the ``[T][K]`` distillation arrays of a sequence.

    Args:
        tokens: ``[T]`` the sequence sent to the teacher.
        result: ``{"prompt_topk_token_ids": [T][<=K+1], "prompt_topk_logprobs": [T][<=K+1]}``,
            rank-sorted per position (vLLM adds the actual token when it is outside the top K);
            ``prompt_tokens`` ``[T]`` is checked when present.
        top_k: ``K > 0``: keep the ``K`` best candidates; ``0``: keep only the actual token.

    Returns:
        ``(ids [T][K], logprobs [T][K])`` (``K = 1`` when ``top_k == 0``); position 0 is ``[]``
        when the teacher has nothing for it (no context).

    Raises:
        TeacherDistillationError: lengths differ, a position has too few candidates, the actual
            token is missing (``top_k == 0``) or a log-prob is not finite.
    """
    ids = result.get("prompt_topk_token_ids")
    lps = result.get("prompt_topk_logprobs")
    if ids is None or lps is None:
        raise TeacherDistillationError("teacher answer has no prompt_topk_token_ids/logprobs")
    prompt = result.get("prompt_tokens")
    if prompt is not None and list(prompt) != list(tokens):
        raise TeacherDistillationError(
            f"teacher scored {len(prompt)} tokens that differ from the {len(tokens)} sent"
        )
    if len(ids) != len(tokens) or len(lps) != len(tokens):
        raise TeacherDistillationError(
            f"teacher returned {len(ids)} ids / {len(lps)} log-prob positions for a sequence "
            f"of {len(tokens)} tokens"
        )
    out_ids: list[list[int]] = []
    out_lps: list[list[float]] = []
    for pos, (pos_ids, pos_lps) in enumerate(zip(ids, lps, strict=True)):
        pos_ids, pos_lps = list(pos_ids or []), list(pos_lps or [])
        if len(pos_ids) != len(pos_lps):
            raise TeacherDistillationError(f"position {pos}: {len(pos_ids)} ids, {len(pos_lps)} log-probs")
        if pos == 0 and not pos_ids:
            out_ids.append([])
            out_lps.append([])
            continue
        if top_k == 0:
            actual = actual_token_logprob(result, pos, tokens[pos])
            if actual is None:
                raise TeacherDistillationError(
                    f"position {pos}: the actual token {tokens[pos]} is not in the teacher answer"
                )
            keep_ids, keep_lps = [int(tokens[pos])], [actual]
        else:
            if len(pos_ids) < top_k:
                raise TeacherDistillationError(
                    f"position {pos}: {len(pos_ids)} teacher candidates, expected {top_k}"
                )
            keep_ids = [int(t) for t in pos_ids[:top_k]]
            keep_lps = [float(x) for x in pos_lps[:top_k]]
        if not all(math.isfinite(x) for x in keep_lps):
            raise TeacherDistillationError(f"position {pos}: non-finite teacher log-prob {keep_lps}")
        out_ids.append(keep_ids)
        out_lps.append(keep_lps)
    return out_ids, out_lps


class TeacherDistillationEnv(BaseEnv):
    """``BaseEnv`` whose groups carry teacher top-k log-probs (see the module docstring).

    Counters in ``self.stats`` (logged to W&B as ``train/<key>``): ``teacher_groups_enriched``,
    ``teacher_groups_failed`` (fields nulled) and ``teacher_groups_skipped``
    (``skip_teacher_top_k`` or ``teacher_top_k == -1``). The teacher's request metrics are
    logged as ``teacher_server/...``.
    """

    env_config_cls: type[BaseEnvConfig] = TeacherDistillationConfig
    server_namespaces: dict[str, str] = {"teacher": "teacher_server_configs"}

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: list[APIServerConfig | APIServer] | APIServerConfig | ServerBaseline | APIServer,
        slurm: bool = False,
        testing: bool = False,
        teacher_server_configs: list[APIServerConfig | APIServer] | APIServerConfig | APIServer | None = None,
    ):
        """Build the env and, when ``config.teacher_enabled``, its teacher ``ServerManager``.

        Args:
            config: a ``TeacherDistillationConfig`` (a plain ``BaseEnvConfig`` means no teacher).
            server_configs: the student (policy) inference servers, as for ``BaseEnv``.
            slurm: derive student inference URLs from SLURM variables.
            testing: use in-process ``FakeServer`` s for student and teacher.
            teacher_server_configs: the teacher's servers (configs with ``server_type='vllm'``,
                or ready ``APIServer`` instances); load-balanced like the student's.

        Raises:
            ConfigError: the teacher is enabled without servers, a teacher backend cannot
                return prompt log-probs, or the first teacher's tokenizer (given as settings)
                differs from the student's (see
                :meth:`_validate_teacher_tokenizer_compatibility`).
        """
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.teacher: ServerManager | None = None
        self._teacher_tokenizer_checked = False
        if not getattr(config, "teacher_enabled", False):
            if teacher_server_configs:
                logger.warning(
                    "teacher servers given but teacher_enabled is false: no teacher log-probs "
                    "will be fetched (pass --env.teacher_enabled true to use them)"
                )
            return
        self.teacher, tokenizer_name = teacher_manager(
            teacher_server_configs, lambda: self.tokenizer, testing=testing
        )
        if tokenizer_name is not None:
            self._validate_teacher_tokenizer_compatibility(tokenizer_name)

    @classmethod
    def teacher_config_init(cls) -> APIServerConfig | list[APIServerConfig] | None:
        """Default teacher servers for ``serve`` and ``process`` (None: no default).

        Atropos 0.4's hook: override it to return the teacher's ``APIServerConfig`` (or a
        list); YAML ``teacher:`` and ``--teacher.*`` flags override it field by field.
        """
        return None

    # ------------------------------------------------------------------ checks
    def check_teacher_tokenizer(self) -> None:
        """Make sure every teacher server tokenizes exactly like the student (checked once).

        Raises:
            ConfigError: a teacher tokenizer differs from ``config.tokenizer_name``'s or cannot
                be loaded; the message says how to fix it.
        """
        if self.teacher is None or self._teacher_tokenizer_checked:
            return
        check_server_tokenizers(self.tokenizer, self.config.tokenizer_name, self.teacher.servers)
        self._teacher_tokenizer_checked = True

    # ------------------------------------------------------------------ Atropos 0.4 names
    @property
    def teacher_server(self) -> ServerManager | None:
        """The teacher ``ServerManager`` (None without a teacher).

        Atropos 0.4's name for :attr:`teacher`.
        """
        return self.__dict__.get("teacher")

    @teacher_server.setter
    def teacher_server(self, value: Any) -> None:
        self.teacher = value

    async def _attach_teacher_distillation(self, group: ScoredDataGroup) -> ScoredDataGroup:
        """Set (or null, on failure) the group's ``distill_*`` fields and return the group.

        Atropos 0.4's name for the per-group step :meth:`handle_send_to_api` performs; a
        no-op without a teacher.
        """
        if self.__dict__.get("teacher") is None:
            return group
        if "_run_state" not in self.__dict__:  # an env built without __init__ (tests)
            from atroposlib.envs.run_state import RunState

            self._run_state = RunState()
        await self._enrich_group(group)
        return group

    def _validate_teacher_tokenizer_compatibility(self, teacher_tokenizer_name: str) -> None:
        """Check that the tokenizer named ``teacher_tokenizer_name`` matches the student's.

        The same name as the student tokenizer's ``name_or_path`` passes without loading.

        Raises:
            ConfigError (a ``ValueError``): "Cross-tokenizer distillation is not supported",
                with the first difference, or the teacher tokenizer cannot be loaded.
        """
        if getattr(self.tokenizer, "name_or_path", None) == teacher_tokenizer_name:
            return
        from atroposlib.utils.hf_tokenizer import load_tokenizer

        try:
            teacher = load_tokenizer(teacher_tokenizer_name, "teacher tokenizer")
        except OSError as exc:
            raise ConfigError(str(exc)) from exc
        difference = tokenizer_difference(self.tokenizer, teacher)
        if difference is not None:
            raise ConfigError(
                f"Cross-tokenizer distillation is not supported: the teacher tokenizer "
                f"{teacher_tokenizer_name!r} differs from the student's ({difference}); use a "
                "teacher that shares the student's tokenizer"
            )

    #: Atropos 0.4's name (called on the class) for :func:`resolve_teacher_server_configs`.
    _resolve_teacher_server_configs = staticmethod(resolve_teacher_server_configs)

    # ------------------------------------------------------------------ enrichment
    def _group_top_k(self, group: ScoredDataGroup) -> int | None:
        """The group's top-k, or None when the fetch is skipped.

        Raises:
            TeacherDistillationError: ``group_overrides['teacher_top_k']`` is not an int >= -1.
        """
        overrides = group.get("group_overrides") or {}
        if overrides.get("skip_teacher_top_k"):
            return None
        raw = overrides.get("teacher_top_k", getattr(self.config, "teacher_top_k", 0))
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < -1:
            raise TeacherDistillationError(
                f"group_overrides['teacher_top_k'] must be an int >= -1, got {raw!r}"
            )
        return None if raw == -1 else raw

    async def fetch_teacher_logprobs(
        self, tokens: list[list[int]], top_k: int
    ) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
        """Ask the teacher for the distillation arrays of a group's sequences (concurrently).

        Args:
            tokens: ``[G][T_i]`` full sequences (prompt + completion).
            top_k: ``K >= 0`` (see :func:`align_teacher_logprobs`).

        Returns:
            ``(distill_token_ids [G][T_i][K], distill_logprobs [G][T_i][K])``.

        Raises:
            TeacherDistillationError: an answer does not match its sequence.
            Exception: whatever the teacher request raised (e.g. ``InferenceError``).
        """
        results = await asyncio.gather(
            *(self._fetch_teacher_for_sequence(list(seq), top_k) for seq in tokens)
        )
        return [ids for ids, _ in results], [lps for _, lps in results]

    async def _fetch_teacher_for_sequence(
        self, token_ids: list[int], top_k: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Ask the teacher for one sequence's ``(ids [T][K], logprobs [T][K])``.

        Atropos 0.4's per-sequence step (the one to override for another teacher source).

        Raises:
            TeacherDistillationError: the answer does not match ``token_ids``.
        """
        assert self.teacher is not None
        # vLLM's prompt_logprobs=k returns the k best AND the actual token, so k >= 1 also
        # covers top_k == 0 (the actual token only).
        result = await self.teacher.get_logprobs(
            input_ids=token_ids, top_k=max(top_k, 1), max_tokens=1
        )
        return align_teacher_logprobs(token_ids, result, top_k)

    async def _enrich_group(self, group: ScoredDataGroup) -> None:
        """Set (or null) one group's ``distill_*`` fields; failures are logged and counted."""
        try:
            top_k = self._group_top_k(group)
            if top_k is None:  # skipped: the group goes without teacher fields
                group["distill_token_ids"] = None
                group["distill_logprobs"] = None
                self.stats["teacher_groups_skipped"] += 1
                return
            ids, lps = await self.fetch_teacher_logprobs(group["tokens"], top_k)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed teacher call nulls this group only
            group["distill_token_ids"] = None
            group["distill_logprobs"] = None
            self.stats["teacher_groups_failed"] += 1
            logger.warning(
                "teacher log-probs failed for a group of %d; sending it without distillation "
                "fields (%s: %s)", len(group.get("tokens") or []), type(exc).__name__, exc,
            )
            return
        group["distill_token_ids"] = ids
        group["distill_logprobs"] = lps
        self.stats["teacher_groups_enriched"] += 1

    async def prepare_checked_groups(self, groups: CheckedGroups) -> None:
        """Add teacher log-probs to the groups that passed the check (see ``BaseEnv``).

        Groups that the check dropped are not sent to the teacher; without a teacher this
        does nothing.

        Raises:
            ConfigError: the teacher tokenizer differs from the student's.
        """
        if self.teacher is not None:
            self.check_teacher_tokenizer()
            await asyncio.gather(*(self._enrich_group(g) for g in groups))

    # ------------------------------------------------------------------ lifecycle
    async def env_manager(self) -> None:
        """Serve mode; checks the teacher tokenizer first and closes the teacher at the end."""
        self.check_teacher_tokenizer()
        try:
            await super().env_manager()
        finally:
            if self.teacher is not None:
                await self.teacher.aclose()

    async def process_manager(self, show_progress: bool = True) -> Any:
        """Process mode; checks the teacher tokenizer first and closes the teacher at the end."""
        self.check_teacher_tokenizer()
        try:
            return await super().process_manager(show_progress=show_progress)
        finally:
            if self.teacher is not None:
                await self.teacher.aclose()

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Add the teacher's request metrics (``teacher_server/...``), then log as usual."""
        metrics = dict(metrics or {})
        if self.teacher is not None and self.config.use_wandb:
            for key, value in self.teacher.wandb_metrics().items():
                metrics[f"teacher_{key}"] = value
        await super().wandb_log(metrics)


__all__ = [
    "TeacherDistillationConfig",
    "TeacherDistillationEnv",
    "TeacherDistillationError",
    "align_teacher_logprobs",
    "resolve_teacher_server_configs",
    "tokenizer_difference",
]
