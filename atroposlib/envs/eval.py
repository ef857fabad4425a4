"""Evaluation helpers: bounded-concurrency runs, mean metrics, pass@k and ``metrics.json``.

:class:`EvalLogMixin` gives ``BaseEnv`` its ``evaluate_log``; :class:`EvalBase` runs a
standalone evaluation against an inference server.
"""

from __future__ import annotations

import asyncio
import csv
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from atroposlib.inference.clients.manager import ServerManager
    from atroposlib.type_definitions import Message

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained
    on Code", arXiv:2107.03374, eq. 1), computed as a stable product.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


async def evaluate_items(
    items: Iterable[T],
    run_item: Callable[[T], Awaitable[R]],
    max_concurrency: int = 16,
) -> tuple[list[R], int]:
    """Run ``run_item`` over ``items`` with at most ``max_concurrency`` in flight.

    An item whose ``run_item`` raises is logged and counted, not scored 0.

    Args:
        items: the evaluation items.
        run_item: coroutine function scoring one item (e.g. returns ``{"correct": 1.0}``).
        max_concurrency: in-flight limit (use ``config.max_eval_workers``).

    Returns:
        ``(results in item order, without failures; number of failed items)``.
    """
    semaphore = asyncio.Semaphore(max(1, max_concurrency))

    async def one(item: T) -> tuple[bool, Any]:
        async with semaphore:
            try:
                return True, await run_item(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed eval item is counted, not scored
                logger.warning("eval item failed (%s: %s)", type(exc).__name__, exc)
                return False, None

    outcomes = await asyncio.gather(*(one(item) for item in items))
    results = [value for ok, value in outcomes if ok]
    return results, sum(1 for ok, _ in outcomes if not ok)


def mean_metrics(results: Sequence[Mapping[str, float]], prefix: str = "eval/") -> dict[str, float]:
    """Average each numeric key over ``results`` (keys missing from a result are skipped there).

    Returns:
        ``{prefix + key: mean}``; empty when ``results`` is empty.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for result in results:
        for key, value in result.items():
            if isinstance(value, (int, float)):  # bools count as 0/1
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {f"{prefix}{key}": sums[key] / counts[key] for key in sums}


#: Columns of ``samples.csv``: what was asked, what the model answered, its score, the answer.
SAMPLE_COLUMNS = ("prompt", "completion", "score", "reference")

# Keys environments commonly use for each column, first match wins.
_PROMPT_KEYS = ("prompt", "question", "instruction", "problem", "input")
_COMPLETION_KEYS = ("completion", "response", "reply", "output", "generation")
_SCORE_KEYS = ("score", "correct", "reward")
_REFERENCE_KEYS = ("reference", "answer", "gold_answer", "gold", "target", "expected")


def _first(sample: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if sample.get(key) is not None:
            return sample[key]
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def sample_row(sample: Mapping[str, Any]) -> dict[str, Any]:
    """One evaluation sample as a ``samples.csv`` row of :data:`SAMPLE_COLUMNS`.

    Each column takes the first key present among the usual names: prompt from
    ``prompt``/``question``/``instruction``/``problem``/``input``, else the last user message
    of ``messages``; completion from ``completion``/``response``/``reply``/``output``/
    ``generation``, else the last assistant message of ``messages``; score from ``score``/
    ``correct``/``reward`` (booleans as 0/1); reference from ``reference``/``answer``/
    ``gold_answer``/``gold``/``target``/``expected``. Missing columns are empty (score None).
    Non-string values are written as JSON.
    """
    messages = sample.get("messages")
    messages = messages if isinstance(messages, list) else []

    def last(role: str) -> Any:
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == role:
                return message.get("content")
        return None

    prompt = _first(sample, _PROMPT_KEYS)
    completion = _first(sample, _COMPLETION_KEYS)
    score = _first(sample, _SCORE_KEYS)
    if isinstance(score, bool):
        score = float(score)
    elif not isinstance(score, (int, float)):
        score = None
    return {
        "prompt": _text(prompt if prompt is not None else last("user")),
        "completion": _text(completion if completion is not None else last("assistant")),
        "score": score,
        "reference": _text(_first(sample, _REFERENCE_KEYS)),
    }


def samples_summary(rows: Sequence[Mapping[str, Any]], out_dir: str | Path) -> str:
    """One line: sample count, mean score, accuracy and where the samples were written.

    Accuracy is the share of scored samples with a score above 0 (right under 0/1 and ±1
    rewards alike). Samples without a score count in N but not in the mean or accuracy.

    Args:
        rows: :func:`sample_row` outputs.
        out_dir: the directory holding ``samples.jsonl`` and ``samples.csv``.
    """
    scores = [float(r["score"]) for r in rows if r.get("score") is not None]
    parts = [f"{len(rows)} sample{'' if len(rows) == 1 else 's'}"]
    if scores:
        mean = sum(scores) / len(scores)
        accuracy = sum(s > 0 for s in scores) / len(scores)
        unscored = f" ({len(rows) - len(scores)} unscored)" if len(scores) < len(rows) else ""
        parts.append(f"mean score {mean:.4g}{unscored}")
        parts.append(f"accuracy {accuracy:.1%} (score > 0)")
    out = Path(out_dir)
    return (", ".join(parts) + f"; samples written to {out / 'samples.jsonl'} and "
            f"{out / 'samples.csv'}")


def eval_dir(data_dir: str | None, name: str) -> Path:
    """Where an env's evaluation files go: ``data_dir``, else ``evals/<name>-<YYYYmmdd-HHMMSS>``."""
    if data_dir:
        return Path(data_dir)
    return Path("evals") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def evaluate_log(
    metrics: Mapping[str, Any],
    eval_dir: str | Path | None = None,
    task_name: str | None = None,
    model_name: str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
    generation_parameters: Mapping[str, Any] | None = None,
    samples: Sequence[Mapping[str, Any]] | None = None,
    verbose: bool = True,
) -> Path | None:
    """Write evaluation results as ``{eval_dir}/metrics.json`` (+ ``samples.jsonl``).

    ``metrics.json`` = ``{"config_general": {"model_name", "total_evaluation_time_seconds"
    (a string), "generation_parameters"}, "results": {"atropos|<task>|0": metrics, "all":
    metrics}}``; ``samples.jsonl`` has one JSON object per sample, as given, and
    ``samples.csv`` the same samples as a table of :data:`SAMPLE_COLUMNS` (see
    :func:`sample_row`). With ``verbose``, a one-line summary of the samples is printed too.

    Args:
        metrics: metric name -> value.
        eval_dir: output directory (created); None writes nothing (logged).
        task_name: the task's name in ``results`` (default ``"eval"``).
        model_name: the evaluated model.
        start_time: ``time.time()`` at the start (the duration is 0 without it).
        end_time: ``time.time()`` at the end (default now).
        generation_parameters: the sampling settings used.
        samples: per-example records.
        verbose: also print a metrics table.

    Returns:
        The path of ``metrics.json``, or None when ``eval_dir`` is None.
    """
    end_time = time.time() if end_time is None else end_time
    task = task_name or "eval"
    payload = {
        "config_general": {
            "model_name": model_name,
            "total_evaluation_time_seconds": str(
                end_time - start_time if start_time is not None else 0.0
            ),
            "generation_parameters": dict(generation_parameters or {}),
        },
        "results": {f"atropos|{task}|0": dict(metrics), "all": dict(metrics)},
    }
    if verbose:
        from atroposlib.utils.metrics import format_metrics_table

        print(format_metrics_table(dict(metrics), title=f"{task} ({model_name})"))
    if eval_dir is None:
        logger.info("no eval_dir given: evaluation metrics were not written to disk")
        return None
    out_dir = Path(eval_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metrics.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    if samples:
        from atroposlib.utils.io import dumps_line

        with open(out_dir / "samples.jsonl", "w", encoding="utf-8") as fh:
            for sample in samples:
                fh.write(dumps_line(sample))
        rows = [sample_row(sample) for sample in samples]
        with open(out_dir / "samples.csv", "w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=SAMPLE_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        if verbose:
            print(samples_summary(rows, out_dir))
    return path


class EvalLogMixin:
    """``BaseEnv``'s ``evaluate_log``: an env's evaluation files, in one directory per run.

    Reads what ``BaseEnv`` sets: ``name``, ``config`` (``data_dir_to_save_evals``,
    ``max_seq_len``), ``server`` (the first server's ``config.model_name``) and
    ``_run_state.eval_mode``. Sets ``_eval_metrics_path`` (the last ``metrics.json`` written,
    which the evaluate runner returns) and ``_eval_dir`` (chosen once per env).
    """

    _eval_metrics_path: Path | None = None
    _eval_dir: Path | None = None

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
        path = evaluate_log(  # the module function of that name, not this method
            metrics,
            eval_dir=self._eval_dir_path() if writes else None,
            task_name=task_name or self.name or "env",
            model_name=model_name or self.server.servers[0].config.model_name,
            start_time=start_time,
            end_time=end_time,
            generation_parameters={
                **(generation_parameters or {}),
                "max_new_tokens": self.config.max_seq_len,
            },
            samples=samples,
            verbose=verbose,
        )
        if path is not None:
            self._eval_metrics_path = path
        return path


class EvalBase(ABC):
    """A standalone evaluation (no ``BaseEnv``): items in, mean metrics out.

    Subclass it and implement :meth:`setup_data` (the items) and :meth:`run_item` (score one
    item, returning ``(metrics, samples)``); then ``await MyEval(...)(server_manager)`` or
    ``asyncio.run(eval_runner(MyEval(...)))`` from a script.

    Args:
        pass_at_n: the ``k`` of pass@k an implementation reports.
        pass_at_n_samples: completions drawn per item (``n``); requests ask for
            ``max(pass_at_n, pass_at_n_samples)``.
        **kwargs: stored as attributes; ``temperature``, ``top_p``, ``max_tokens`` shape the
            requests, ``eval_dir`` (where ``metrics.json`` goes), ``task_name``,
            ``max_concurrency`` (default 16) the run.
    """

    def __init__(self, pass_at_n: int = 1, pass_at_n_samples: int = 1, **kwargs: Any):
        self.pass_at_n = pass_at_n
        self.pass_at_n_samples = pass_at_n_samples
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.data = self.setup_data()

    def get_generation_params(self) -> dict[str, Any]:
        """Sampling keywords for each request.

        Returns temperature (default 0), n, top_p (1) and max_tokens (-1 = server's limit).
        """
        return {
            "temperature": getattr(self, "temperature", 0.0),
            "n": max(self.pass_at_n, self.pass_at_n_samples),
            "top_p": getattr(self, "top_p", 1.0),
            "max_tokens": getattr(self, "max_tokens", -1),
        }

    async def chat_completion(self, server: Any, messages: list[dict[str, Any]]) -> Any:
        """One chat completion with :meth:`get_generation_params` (an OpenAI ``ChatCompletion``)."""
        return await server.chat_completion(messages=messages, **self.get_generation_params())

    @abstractmethod
    def setup_data(self) -> list:
        """Return the evaluation items (called once, by ``__init__``)."""

    @abstractmethod
    async def run_item(self, server: ServerManager, data_item: Any) -> tuple[dict, list]:
        """Score one item: ``(metrics such as {"correct": 1.0}, sample records)``."""

    async def __call__(self, server_manager: ServerManager) -> dict[str, float]:
        """Run every item (bounded concurrency), average the metrics, write them.

        Returns:
            The mean of each metric over the items that did not fail.
        """
        start = time.time()
        results, failed = await evaluate_items(
            self.data,
            lambda item: self.run_item(server_manager, item),
            getattr(self, "max_concurrency", 16),
        )
        metrics = mean_metrics([m for m, _ in results], prefix="")
        if failed:
            metrics["failed_items"] = failed
        samples = [s for _, item_samples in results for s in (item_samples or [])]
        servers = getattr(server_manager, "servers", None) or []
        evaluate_log(
            metrics,
            eval_dir=getattr(self, "eval_dir", None),
            task_name=getattr(self, "task_name", None) or type(self).__name__,
            model_name=servers[0].config.model_name if servers else None,
            start_time=start,
            generation_parameters=self.get_generation_params(),
            samples=samples,
            verbose=getattr(self, "verbose", True),
        )
        return metrics


async def eval_runner(eval_env: EvalBase, argv: Sequence[str] | None = None) -> dict[str, float]:
    """Command-line entry for an :class:`EvalBase`: point it at an OpenAI-compatible server.

    Flags: ``--base-url`` (default ``DEFAULT_INFERENCE_URL``, ``http://127.0.0.1:9100/v1``), ``--model-name``,
    ``--api-key`` (default ``x``), ``--server-type`` (default ``openai``), ``--eval-dir``.

    Returns:
        The metrics :meth:`EvalBase.__call__` returned.
    """
    from atroposlib.defaults import DEFAULT_INFERENCE_URL
    from atroposlib.inference.clients.config import APIServerConfig
    from atroposlib.inference.clients.manager import ServerManager
    from atroposlib.utils.flags import ArgumentParser

    parser = ArgumentParser(description=f"Run the {type(eval_env).__name__} evaluation.")
    parser.add_argument("--base-url", default=DEFAULT_INFERENCE_URL,
                        help=f"OpenAI-compatible base URL of the model (default {DEFAULT_INFERENCE_URL})")
    parser.add_argument("--model-name", required=True, help="model name sent in every request")
    parser.add_argument("--api-key", default="x", help="bearer token of the server (default x)")
    parser.add_argument("--server-type", default="openai",
                        help="backend: openai, vllm, sglang or trl (default openai)")
    parser.add_argument("--eval-dir", default=None,
                        help="write metrics.json and samples.jsonl there (default: the "
                        "evaluation's eval_dir; none: only log the metrics)")
    args = parser.parse_args(argv)
    if args.eval_dir is not None:
        eval_env.eval_dir = args.eval_dir
    config = APIServerConfig(
        base_url=args.base_url, model_name=args.model_name, api_key=args.api_key,
        server_type=args.server_type,
    )
    return await eval_env(ServerManager([config]))


async def eval_samples(
    env: Any,
    items: Sequence[Any],
    messages_fn: Callable[[Any], list[Message]],
    score_fn: Callable[[Any, str, str], Any],
    *,
    max_tokens: int | Callable[[list[Message]], int],
    temperature: float = 0.0,
    answer_fn: Callable[[Any], Any] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Sample one completion per evaluation item and score it (no logging).

    Requests run concurrently, at most ``env.config.max_eval_workers`` at a time, on the
    ``eval`` split of the server manager. An item whose request or scoring raises is logged
    and counted, not scored 0.

    Args:
        env: the environment (its ``server`` and ``config.max_eval_workers`` are used).
        items: evaluation items.
        messages_fn: item -> chat messages.
        score_fn: ``(item, completion_text, finish_reason) ->`` a :data:`ScoreResult`
            (a score, or ``(score, details)``; may be a coroutine function).
        max_tokens: completion budget, or a function of the item's messages returning it.
        temperature: sampling temperature (0 = greedy).
        answer_fn: item -> reference answer, stored in each sample as ``"answer"`` (for views).

    Returns:
        ``(samples in item order, failed item count)``; a sample is ``{"messages",
        "response", "score", "finish_reason"}`` (+ ``"answer"``, + ``"details"`` when the
        score came with details); ``response`` is the reply text.
    """
    from atroposlib.envs.scoring import resolve_score

    async def one(item: Any) -> dict[str, Any]:
        messages = messages_fn(item)
        budget = max_tokens(messages) if callable(max_tokens) else max_tokens
        completion = await env.server.chat_completion(
            messages=messages, n=1, max_tokens=budget, temperature=temperature,
            split="eval",
        )
        choice = completion.choices[0]
        text = choice.message.content or ""
        reason = str(choice.finish_reason)
        score, details = await resolve_score(score_fn(item, text, reason))
        sample = {"messages": messages + [{"role": "assistant", "content": text}], "response": text,
                  "score": score, "finish_reason": reason}
        if details:
            sample["details"] = details
        if answer_fn is not None:
            sample["answer"] = answer_fn(item)
        return sample

    return await evaluate_items(items, one, int(env.config.max_eval_workers))


__all__ = [
    "SAMPLE_COLUMNS",
    "EvalBase",
    "EvalLogMixin",
    "eval_dir",
    "eval_runner",
    "eval_samples",
    "evaluate_items",
    "evaluate_log",
    "mean_metrics",
    "pass_at_k",
    "sample_row",
    "samples_summary",
]
