"""The env author's toolbox in one import; each name lives in the module of its topic.

* :mod:`atroposlib.envs.config`: :func:`default_server`, :data:`DEFAULT_BASE_URL`;
* :mod:`atroposlib.envs.data`: :func:`load_rows`, :func:`maybe_json`, :func:`make_word`;
* :mod:`atroposlib.envs.groups`: :func:`new_group`, :func:`add_rollout`;
* :mod:`atroposlib.envs.episodes`: :class:`Episode`, :func:`run_episode`;
* :mod:`atroposlib.envs.scoring`: :func:`extract_answer_tag`, :func:`extract_tool_calls`,
  :data:`ScoreResult`, :func:`resolve_score`, :func:`mean_details`;
* :mod:`atroposlib.envs.eval`: :func:`eval_samples`.
"""

from __future__ import annotations

from atroposlib.envs.config import DEFAULT_BASE_URL, default_server
from atroposlib.envs.data import load_rows, make_word, maybe_json
from atroposlib.envs.episodes import Episode, ReplyHandler, run_episode
from atroposlib.envs.eval import eval_samples
from atroposlib.envs.groups import add_rollout, new_group
from atroposlib.envs.scoring import (
    ScoreResult,
    extract_answer_tag,
    extract_tool_calls,
    mean_details,
    resolve_score,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "Episode",
    "ReplyHandler",
    "ScoreResult",
    "add_rollout",
    "default_server",
    "eval_samples",
    "extract_answer_tag",
    "extract_tool_calls",
    "load_rows",
    "make_word",
    "maybe_json",
    "mean_details",
    "new_group",
    "resolve_score",
    "run_episode",
]
