"""Helpers for writing environments: defaults, data loading, groups, answer parsing, multi-turn.

Used by :class:`atroposlib.envs.single_turn.SingleTurnEnv` and the example environments;
import them from here in your own envs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB
from atroposlib.defaults import DEFAULT_INFERENCE_MODEL, DEFAULT_INFERENCE_URL
from atroposlib.envs.base import APIServerConfig, ScoredDataGroup
from atroposlib.errors import ConfigError
from atroposlib.type_definitions import Message

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


# ----------------------------------------------------------------------------- data loading
_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_rows(
    name_or_path: str,
    split: str = "train",
    config_name: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Load a dataset split as a list of row dicts, from the HF hub or a local path.

    Args:
        name_or_path: a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file, a local
            directory (a ``save_to_disk`` dataset, one file per split such as
            ``train.jsonl``/``test.jsonl``, or files ``datasets`` can read), or a hub id such
            as ``"cais/mmlu"``. A name starting with ``.``, ``/`` or ``~`` is a path.
        split: split to read (ignored for single local files, which are one split).
        config_name: hub dataset configuration (e.g. ``"all"`` for MMLU).
        limit: keep at most this many rows.

    Returns:
        The rows.

    Raises:
        ConfigError: the dataset cannot be loaded; the message names it and how to fix it
            (offline runs need a local path or a cached hub dataset).
    """
    import datasets

    path = Path(name_or_path).expanduser()
    try:
        if path.is_file():
            fmt = _LOCAL_FORMATS.get(path.suffix.lower())
            if fmt is None:
                raise ConfigError(
                    f"dataset file {path} has an unknown extension; use one of "
                    f"{', '.join(_LOCAL_FORMATS)}"
                )
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
        elif path.is_dir() and (path / "dataset_info.json").exists():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split]
        elif path.is_dir() and (split_file := _split_file(path, split)) is not None:
            if split_file.stat().st_size == 0:
                return []
            ds = datasets.load_dataset(
                _LOCAL_FORMATS[split_file.suffix.lower()], data_files=str(split_file), split="train"
            )
        elif path.is_dir():
            ds = datasets.load_dataset(str(path), split=split)
        elif name_or_path.startswith((".", "/", "~")):
            raise ConfigError(
                f"dataset path {name_or_path!r} does not exist (resolved to {path.resolve()}); "
                "pass an existing file or directory with --env.dataset_name PATH (relative "
                "paths are taken from the current directory)"
            )
        else:
            ds = datasets.load_dataset(name_or_path, config_name, split=split)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the fix
        hint = (
            f"A local directory needs {split}.jsonl (or .json/.csv/.parquet) or a save_to_disk "
            "dataset"
            if path.is_dir()
            else "Pass a local JSONL file with --env.dataset_name PATH, or make the hub dataset "
            "available (it is not cached while HF_DATASETS_OFFLINE=1)"
        )
        raise ConfigError(
            f"cannot load dataset {name_or_path!r} (split {split!r}): {type(exc).__name__}: "
            f"{exc}. {hint}"
        ) from exc
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return [dict(row) for row in ds]


def _split_file(directory: Path, split: str) -> Path | None:
    """``directory/<split>.jsonl`` (or another local format), when it exists."""
    for suffix in _LOCAL_FORMATS:
        candidate = directory / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def maybe_json(value: Any) -> Any:
    """Decode ``value`` when it is a JSON string (hub datasets often store lists as text)."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("[", "{"):
            return json.loads(stripped)
    return value


# ----------------------------------------------------------------------------- groups
def new_group(with_logprobs: bool = True) -> ScoredDataGroup:
    """An empty group with the per-sequence lists the envs fill."""
    group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
    if with_logprobs:
        group["inference_logprobs"] = []
    return group


def add_rollout(group: ScoredDataGroup, node: Any, score: float, messages: list[Message]) -> None:
    """Append one managed-server sequence (tokens, masks, log-probs) with its score.

    Log-probs at masked (prompt) positions are written as ``MASKED_LOGPROB`` (1.0), as the
    API expects, whatever the server put there.
    """
    group["tokens"].append(list(node.tokens))
    group["masks"].append(list(node.masked_tokens))
    group["inference_logprobs"].append(
        [lp if m != IGNORE_INDEX else MASKED_LOGPROB
         for lp, m in zip(node.logprobs, node.masked_tokens, strict=True)])
    group["scores"].append(float(score))
    group["messages"].append(messages)


# ----------------------------------------------------------------------------- procedural words
_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t",
           "v", "w", "z", "br", "cr", "dr", "st", "str", "tr", "pl", "gr", "sh", "ch", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "y", "ee", "oo", "ai", "ea"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "rr", "ss", "ll", "ck", "st", "nd"]

def make_word(rng: Any, min_len: int, max_len: int) -> str:
    """A pronounceable pseudo-word of ``min_len..max_len`` letters (no word list needed)."""
    target = rng.randint(min_len, max_len)
    word = ""
    while len(word) < target:
        word += rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
    return word[:target]


# ----------------------------------------------------------------------------- answer parsing
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def extract_answer_tag(text: str) -> str | None:
    """The content of the LAST ``<answer>...</answer>`` in ``text`` (stripped), or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)


def extract_tool_calls(text: str) -> tuple[list[dict[str, Any]], int]:
    """Parse every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ``text``.

    ``arguments`` may also be a JSON string (OpenAI style); it is decoded.

    Returns:
        ``(calls, malformed)``: the well-formed calls as ``{"name", "arguments"}`` dicts, and
        how many blocks were not valid JSON objects with a string ``name`` and dict arguments.
    """
    calls, malformed = [], 0
    for raw in _TOOL_CALL.findall(text):
        try:
            call = json.loads(raw.strip())
            args = call.get("arguments", call.get("parameters", {}))
            args = json.loads(args) if isinstance(args, str) else args
        except (json.JSONDecodeError, AttributeError):
            malformed += 1
            continue
        if not isinstance(call.get("name"), str) or not isinstance(args, dict):
            malformed += 1
            continue
        calls.append({"name": call["name"], "arguments": args})
    return calls, malformed


# ----------------------------------------------------------------------------- multi-turn
@dataclass
class Episode:
    """One multi-turn rollout through ``managed_server``.

    Attributes:
        messages: the whole conversation (system/user/assistant/tool turns).
        node: the managed sequence covering every assistant turn (masks train them all).
        turns: assistant turns taken.
        finish_reasons: ``finish_reason`` of each assistant turn.
        contiguous: True when every turn extended the previous sequence (False means the chat
            template re-rendered earlier turns differently; then only the last turn's node is
            returned and earlier turns are masked).
        out_of_context: the episode stopped early because the next turn would not fit in
            ``max_seq_len``.
        truncated: the episode used all ``max_turns`` turns and the env still had an answer
            for the last one; that answer is left out of ``messages``, since no turn of the
            trained sequence follows it.
    """

    messages: list[Message]
    node: Any
    turns: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    contiguous: bool = True
    out_of_context: bool = False
    truncated: bool = False


#: ``on_reply(text, turn) -> messages to append (the env's answer), or None to end``.
ReplyHandler = Callable[[str, int], Awaitable[list[Message] | None] | list[Message] | None]


async def run_episode(
    server: Any,
    tokenizer: Any,
    messages: Sequence[Message],
    on_reply: ReplyHandler,
    *,
    max_turns: int,
    max_tokens: int,
    temperature: float = 1.0,
    split: str = "train",
    max_seq_len: int | None = None,
) -> Episode:
    """Play a conversation turn by turn: sample, let the env answer, repeat.

    Each assistant turn is sampled with ``n=1`` inside ONE ``managed_server`` context, so the
    next prompt (previous sequence + the env's reply) extends the tracked sequence and the
    final node's masks train every assistant turn.

    Args:
        server: the env's ``ServerManager``.
        tokenizer: the policy's tokenizer.
        messages: the opening messages (system, user).
        on_reply: called with each assistant text and the 0-based turn (the last one too, so
            the env can score it); returns the messages to append (e.g. the next observation
            or a tool result), or None when the episode is over. May be async. What it
            returns for the last allowed turn is dropped (``Episode.truncated``).
        max_turns: assistant turns at most (the episode is truncated after it).
        max_tokens: tokens per assistant turn.
        temperature: sampling temperature.
        split: ``"train"`` or ``"eval"`` (which request pool and metrics to use).
        max_seq_len: stop (``Episode.out_of_context``) before a turn whose prompt plus
            ``max_tokens`` would reach this many tokens (the env's ``max_seq_len``); None = no
            check.

    Returns:
        The :class:`Episode`.
    """
    import inspect

    chat: list[Message] = [dict(m) for m in messages]  # type: ignore[misc]
    episode = Episode(messages=chat, node=None)
    async with server.managed_server(tokenizer=tokenizer) as managed:
        for turn in range(max_turns):
            if turn > 0 and max_seq_len is not None:
                prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                if len(tokenizer.encode(prompt, add_special_tokens=False)) + max_tokens >= max_seq_len:
                    episode.out_of_context = True
                    break
            completion = await managed.chat_completion(
                messages=chat, n=1, max_tokens=max_tokens, temperature=temperature,
                split=split,
            )
            choice = completion.choices[0]
            text = choice.message.content or ""
            chat.append({"role": "assistant", "content": text})
            episode.turns += 1
            episode.finish_reasons.append(str(choice.finish_reason))
            reply = on_reply(text, turn)
            if inspect.isawaitable(reply):
                reply = await reply
            if not reply:
                break
            if turn == max_turns - 1:
                # the env's answer to the last turn is never sampled against, so it is not in
                # the tokens; keeping it in the messages would make them disagree
                episode.truncated = True
                break
            chat.extend(reply)
        nodes = managed.get_state()["nodes"]
    episode.contiguous = len(nodes) == 1
    episode.node = nodes[-1]
    return episode


#: What a score hook returns: a reward, or ``(reward, details)`` (details: name -> value,
#: numbers averaged into metrics, anything JSON-able kept in eval samples); maybe awaitable.
ScoreResult = float | tuple[float, Mapping[str, Any]]


async def resolve_score(value: Any) -> tuple[float, dict[str, Any]]:
    """``(reward, details)`` of a score hook's result (awaited first when it is awaitable).

    Accepts a number or ``(number, mapping)``; the number is returned as a float.

    Raises:
        TypeError: the result is neither; the message shows what came back.
    """
    import inspect

    if inspect.isawaitable(value):
        value = await value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
        value, details = value
    else:
        details = {}
    try:
        return float(value), dict(details)
    except (TypeError, ValueError):
        raise TypeError(
            f"a score must be a number or (number, dict of details), got {value!r}"
        ) from None


def mean_details(details: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """``{f"{prefix}/{key}": mean}`` of every numeric (or bool) detail, over the rows that have it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in details:
        for key, value in row.items():
            if isinstance(value, int | float):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {f"{prefix}/{key}": sums[key] / counts[key] for key in sums}


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
    from atroposlib.envs.eval import evaluate_items

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
    "DEFAULT_BASE_URL",
    "Episode",
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
