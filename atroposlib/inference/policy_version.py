"""The policy version a rollout was sampled with, as the inference server reports it.

``atropos-inference-node`` answers every completion with the header ``X-Atropos-Policy-Version:
N``: the trainer step of the weights that produced it. The inference clients record each version
they see (:func:`record_served_version`) into the collector of the rollout running in the
current asyncio task, which the env runtime opens per item (:func:`collect_served_versions`). A
group is then stamped with the **oldest** version among its rollouts (:func:`oldest_served_version`):
a group is as stale as its stalest rollout, which is what run-api's ``--max-staleness`` must
judge. Servers that send no header (plain vLLM, OpenAI) leave the collector empty, and the
runtime falls back to the trainer step it knew when the rollout started.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping

#: Response header naming the policy version (trainer step) of the weights that served a request.
POLICY_VERSION_HEADER = "X-Atropos-Policy-Version"

_SERVED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "served_policy_versions", default=None)


def parse_policy_version(headers: Mapping[str, str]) -> int | None:
    """The policy version in a response's headers (case-insensitive mapping), None if absent or bad."""
    raw = headers.get(POLICY_VERSION_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def collect_served_versions() -> list[int]:
    """Start a fresh collector for the current task (and the tasks it starts); return it."""
    versions: list[int] = []
    _SERVED.set(versions)
    return versions


def record_served_version(version: int) -> None:
    """Add ``version`` to the current rollout's collector (no-op outside one)."""
    versions = _SERVED.get()
    if versions is not None:
        versions.append(version)


def oldest_served_version() -> int | None:
    """The oldest version the current rollout's completions were served with (None: none reported)."""
    versions = _SERVED.get()
    return min(versions) if versions else None


__all__ = ["POLICY_VERSION_HEADER", "collect_served_versions", "oldest_served_version",
           "parse_policy_version", "record_served_version"]
