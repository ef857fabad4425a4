"""The ``RewardFunction`` base class: weighted, logged, fail-loudly scoring of completions."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from atroposlib.errors import RolloutError

#: One completion as reward functions accept it: a string, a message dict
#: (``{"role": "assistant", "content": ...}``), an OpenAI-style choice dict
#: (``{"message": {...}}``), or a list of messages (the last assistant one is scored).
Completion = str | dict[str, Any] | Sequence[dict[str, Any]]


def get_content(completion: Any) -> str:
    """Extract the assistant text from one completion in any of the accepted shapes.

    Args:
        completion: a string; a message dict with ``content``; a choice dict with
            ``message``; a list of message dicts (the last ``assistant`` message is used, or
            the last message if none is from the assistant); or an object with
            ``.message.content`` / ``.content`` / ``.text`` (OpenAI response objects).

    Returns:
        The text. List-of-parts content (``[{"type": "text", "text": ...}]``) is joined.

    Raises:
        TypeError: the shape is not one of the above; the message names the type found.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        if "message" in completion:
            return get_content(completion["message"])
        if "content" in completion:
            content = completion["content"]
            if content is None:
                return ""
            if isinstance(content, list):
                return "".join(
                    part.get("text", "") for part in content if isinstance(part, dict)
                )
            return str(content)
        if "text" in completion:
            return str(completion["text"])
    elif isinstance(completion, Sequence) and completion:
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        chosen = assistant[-1] if assistant else (messages[-1] if messages else None)
        if chosen is not None:
            return get_content(chosen)
    else:
        message = getattr(completion, "message", None)
        if message is not None:
            return get_content({"content": getattr(message, "content", None)})
        for attr in ("content", "text"):
            if hasattr(completion, attr):
                return get_content({"content": getattr(completion, attr)})
    raise TypeError(
        f"cannot extract completion text from {type(completion).__name__}; pass a string, a "
        "message dict with 'content', a choice dict with 'message', or a list of messages"
    )


def broadcast(value: Any, n: int, name: str) -> list[Any]:
    """Return ``value`` as a list of ``n`` entries, one per completion.

    Args:
        value: a scalar (repeated ``n`` times) or a list/tuple of length ``n``.
        n: number of completions.
        name: the keyword's name, for the error message.

    Raises:
        ValueError: ``value`` is a sequence whose length is not ``n``.
    """
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise ValueError(
                f"{name} has {len(value)} entries but there are {n} completions; pass one "
                f"{name} per completion or a single value for all"
            )
        return list(value)
    return [value] * n


class RewardFunction(ABC):
    """A reward: maps a list of completions to one float each.

    Subclasses implement :meth:`compute`. Calling the instance runs ``compute``, checks the
    result (one finite float per completion), multiplies by ``weight`` and records
    ``reward/{name}/mean_raw|mean_weighted|min|max`` in :attr:`metrics` (merge it into an env's
    ``wandb_log``).

    Unlike Atropos 0.4 (which returned 0.0 for every completion on any exception), a failing
    reward function raises :class:`~atroposlib.errors.RolloutError`: the env drops and counts
    the group instead of training on a silent zero.

    Args:
        weight: multiplier applied to every score.
        name: metric name; defaults to the registry name derived from the class name.
        **kwargs: reward-specific options; unknown ones raise ``TypeError`` in subclasses.
    """

    def __init__(self, weight: float = 1.0, name: str | None = None, **kwargs: Any):
        if kwargs:
            raise TypeError(
                f"{type(self).__name__} got unknown options {sorted(kwargs)}; check the "
                "reward's docstring for the options it accepts"
            )
        if not math.isfinite(float(weight)):
            raise ValueError(f"reward weight must be a finite number, got {weight!r}")
        self.weight = float(weight)
        self.name = name or registry_name(type(self))
        self.metrics: dict[str, float] = {}

    @abstractmethod
    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion (unweighted).

        Args:
            completions: N completions (see :data:`Completion`).
            **kwargs: per-batch context such as ``solution`` (one per completion or one for
                all); rewards ignore keywords they do not use.

        Returns:
            N floats.
        """

    def __call__(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score ``completions``, apply the weight and record metrics.

        Returns:
            N weighted floats, one per completion.

        Raises:
            RolloutError: ``compute`` raised, or returned the wrong number of scores or a
                non-finite score. The message names the reward and the cause.
        """
        completions = list(completions)
        try:
            raw = [float(x) for x in self.compute(completions, **kwargs)]
        except RolloutError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with context, never swallowed
            raise RolloutError(
                f"reward function {self.name!r} failed on {len(completions)} completions: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if len(raw) != len(completions):
            raise RolloutError(
                f"reward function {self.name!r} returned {len(raw)} scores for "
                f"{len(completions)} completions; compute() must return one per completion"
            )
        bad = [x for x in raw if not math.isfinite(x)]
        if bad:
            raise RolloutError(f"reward function {self.name!r} returned non-finite scores {bad}")
        weighted = [x * self.weight for x in raw]
        if raw:
            self.metrics = {
                f"reward/{self.name}/mean_raw": sum(raw) / len(raw),
                f"reward/{self.name}/mean_weighted": sum(weighted) / len(weighted),
                f"reward/{self.name}/min": min(weighted),
                f"reward/{self.name}/max": max(weighted),
            }
        return weighted

    # Upstream name kept for compatibility.
    get_content = staticmethod(get_content)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, weight={self.weight})"


def registry_name(cls: type) -> str:
    """Registry name of a reward class: lower-cased class name without a trailing ``reward``.

    ``AccuracyReward`` -> ``accuracy``, ``R1Reward`` -> ``r1``.
    """
    name = cls.__name__.lower()
    return name[: -len("reward")] if name.endswith("reward") and name != "reward" else name
