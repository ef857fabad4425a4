"""The ``process`` and ``evaluate`` runners: an env without a trainer or API."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atroposlib.env_runtime.delivery import deliver_groups
from atroposlib.env_runtime.filtering import ItemFilter, next_item
from atroposlib.env_runtime.sinks import JsonlSink, WandbSink, close_sinks, find_sink, local_sinks
from atroposlib.env_runtime.step import REFUSAL_STREAK, refusal_message, run_item
from atroposlib.envs.run_state import RunState
from atroposlib.errors import RolloutError
from atroposlib.inference.clients.base import is_refused_request

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger(__name__)


def start_run(env: BaseEnv, **values: Any) -> RunState:
    """Freeze the env's config and bind a fresh :class:`RunState` (``values`` override fields)."""
    state = RunState.for_config(env.config, **values)
    env.config.freeze()
    env.bind_run_state(state)
    return state


async def run_process(env: BaseEnv, show_progress: bool = True) -> Path | None:
    """Generate ``config.total_steps`` groups without an API and write them to JSONL + HTML.

    ``total_steps <= 0`` means: until ``get_next_item`` returns None. With
    ``item_filter.enabled`` the items are drawn through the item filter
    (:mod:`~atroposlib.env_runtime.filtering`), as in serve mode. Each item goes through
    :func:`~atroposlib.env_runtime.step.run_item` (no length limit: there is no trainer) and
    then :func:`~atroposlib.env_runtime.delivery.deliver_groups` (the env's sinks, no API), so
    the ``prepare_checked_groups`` hook of subclasses that enrich groups acts here too.

    Returns:
        The JSONL path written, or None when no path was configured.

    Raises:
        RolloutError: ``max_consecutive_failures`` items in a row produced no usable group, or
            the inference server refused the request of ``REFUSAL_STREAK`` items in a row.
    """
    from tqdm.auto import tqdm

    state = start_run(env, sinks=local_sinks(env))
    jsonl: JsonlSink | None = find_sink(state.sinks, JsonlSink)
    wandb_sink: WandbSink | None = find_sink(state.sinks, WandbSink)
    await env.setup()
    item_filter = ItemFilter.for_env(env)
    if wandb_sink is not None:
        wandb_sink.start()
    target = state.total_steps if state.total_steps > 0 else math.inf
    done = consecutive_failures = refusals = 0
    backlog: list[Any] = []
    progress = tqdm(
        total=None if target == math.inf else target,
        desc=f"{env.name or 'env'} groups",
        disable=not show_progress,
    )
    try:
        while done < target:
            item = backlog.pop(0) if backlog else await next_item(env, item_filter)
            if item is None:
                logger.info("get_next_item returned None: stopping after %d groups", done)
                break
            outcome = await run_item(env, item, check_length=False)
            refusals = refusals + 1 if outcome.error is not None and is_refused_request(outcome.error) else 0
            if refusals >= REFUSAL_STREAK:
                raise RolloutError(refusal_message(refusals, outcome.error))
            backlog.extend(outcome.backlog)
            if item_filter is not None:
                item_filter.note(item, outcome.scores)
            accepted = await deliver_groups(env, outcome.groups, item, send_to_api=False, check_length=False)
            await env.cleanup()
            if not accepted:
                consecutive_failures += 1
                limit = env.config.max_consecutive_failures
                if 0 < limit <= consecutive_failures:
                    raise RolloutError(
                        f"{consecutive_failures} items in a row produced no usable group "
                        f"(stats: {dict(env.stats)}); check the log above for the failing "
                        "rollouts, or raise --env.max_consecutive_failures"
                    )
                if consecutive_failures in (10, 100, 1000):
                    logger.warning(
                        "%d items in a row produced no usable group; stats: %s",
                        consecutive_failures,
                        dict(env.stats),
                    )
                continue
            consecutive_failures = 0
            done += len(accepted)
            progress.update(len(accepted))
            await env.wandb_log({})
    finally:
        # Also on Ctrl-C: what was generated stays on disk, with its HTML view.
        progress.close()
        await env.server.aclose()
        await close_sinks(state.sinks)
        if jsonl is not None and jsonl.path.exists():
            from atroposlib.frontend.jsonl2html import generate_html

            html = generate_html(jsonl.path)
            logger.info("wrote %d groups to %s and %s", done, jsonl.path, html)
    return jsonl.path if jsonl is not None else None


async def run_evaluate(env: BaseEnv) -> Path:
    """Run ``setup`` and ``evaluate``; make sure ``metrics.json`` exists; return its path.

    When ``evaluate`` does not call ``evaluate_log`` itself, its returned metrics are written.
    With ``use_wandb`` the metrics are also logged (as ``eval/<name>``).
    """
    state = start_run(env, eval_mode=True)
    await env.setup()
    start = time.time()
    try:
        metrics = await env.evaluate()
    finally:
        await env.server.aclose()
    if env._eval_metrics_path is None:  # evaluate() did not call evaluate_log itself
        env.evaluate_log(dict(metrics or {}), start_time=start)
    assert env._eval_metrics_path is not None
    if env.config.use_wandb:
        sink = WandbSink(env)
        state.sinks.append(sink)
        sink.start()
        await env.wandb_log({f"eval/{k}" if "/" not in k else k: v for k, v in (metrics or {}).items()})
        await close_sinks(state.sinks)
    return env._eval_metrics_path


__all__ = ["run_evaluate", "run_process", "start_run"]
