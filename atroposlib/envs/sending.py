"""The group check and the self-sending path of ``BaseEnv`` (a mixin).

The runners check each group once (:func:`~atroposlib.env_runtime.step.run_item`) and deliver
it (:mod:`atroposlib.env_runtime.delivery`). An env that builds and sends groups itself, as
Atropos 0.4 envs may, calls :meth:`GroupSendingMixin.handle_send_to_api`: the same check, then
the same delivery. :meth:`GroupSendingMixin.prepare_checked_groups` is the hook both paths call
on the groups the check kept.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.groups import CheckedGroups, ScoredDataGroup, check_groups
from atroposlib.envs.runners import get_runner
from atroposlib.type_definitions import Item


class GroupSendingMixin:
    """``BaseEnv``'s group check, and sending for envs that send their own groups.

    Reads what ``BaseEnv`` sets: ``config`` (``group_size``, ``ensure_scores_are_not_same``,
    ``include_messages``), ``stats``, ``_run_state`` and ``_decode``.
    """

    config: Any
    stats: Any
    _run_state: Any
    _decode: Any

    def _check_groups(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup | None] | None,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> CheckedGroups:
        """The usable groups of ``scored_data``; drops are logged and counted in ``stats``.

        The one scored-group check (:func:`~atroposlib.envs.groups.check_groups`): groups the
        runner already checked (a ``CheckedGroups``, as ``run_item`` hands them on) are not
        checked again. ``abort_on_any_max_length_exceeded`` drops groups with a sequence of
        ``>= max_seq_len`` tokens (the trainer's, once the API told us).
        """
        return check_groups(
            scored_data, self.config.group_size, self.config.ensure_scores_are_not_same,
            self._run_state.max_seq_len if abort_on_any_max_length_exceeded else -1, self.stats,
            self._run_state.drops,
        )

    def _accept_groups(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup | None] | None,
        abort_on_any_max_length_exceeded: bool = True,
        item: Item = None,
    ) -> list[ScoredDataGroup]:
        """Check the groups (unless checked already); normalise and record the usable ones.

        Returns the accepted groups, with every optional key present (None when absent).
        """
        return self._run_state.accept(self._check_groups(scored_data, abort_on_any_max_length_exceeded),
                                      self.config.include_messages, self._decode)

    async def handle_send_to_api(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup | None] | None,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> list[ScoredDataGroup]:
        """For an env that sends groups itself: check them, then deliver them like the runners do.

        Groups already checked (a ``CheckedGroups``) are not checked again. Accepted groups go
        through :func:`atroposlib.env_runtime.delivery.deliver_checked`: the
        ``prepare_checked_groups`` hook, normalising and recording, every sink of the run (JSONL,
        W&B) and, with ``do_send_to_api`` (serve mode), the outbox the serve loop drains, so a
        finished group is never lost to an API outage. Each sent group gets ``policy_version``:
        the trainer step when its rollout started (else ``curr_step``), unless it already has
        one. The runners deliver their own groups without coming back here, unless a subclass
        overrides this method. Returns the accepted groups.

        Raises:
            RuntimeError: ``do_send_to_api`` outside the serve loop (there is no outbox).
        """
        checked = self._check_groups(scored_data, abort_on_any_max_length_exceeded)
        return await get_runner("deliver")(self, checked, item, do_send_to_api)

    async def prepare_checked_groups(self, groups: CheckedGroups) -> None:
        """Hook: change, in place, the groups that passed the check before they are recorded.

        Called by :meth:`handle_send_to_api` with only the groups the check kept (so dropped
        groups cost no extra work), before they are normalised, recorded and sent. The default
        does nothing; ``TeacherDistillationEnv`` adds the teacher's log-probs here.
        """


__all__ = ["GroupSendingMixin"]
