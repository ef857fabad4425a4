"""Shared type aliases of environments: messages, items, agent/game histories and eval schemas.

Import-compatible with Atropos 0.4 ``atroposlib.type_definitions``.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

#: Content of a chat message: plain text, or a list of OpenAI content parts
#: (``{"type": "text", "text": ...}``, ``{"type": "image_url", ...}``).
Content = str | list[dict[str, Any]]


class Message(TypedDict):
    """One chat message as envs pass it around and send it in ``ScoredDataGroup.messages``.

    The API does not enforce this shape beyond ``role`` and ``content`` being present.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: Content
    reward: NotRequired[float | None]


#: The label of a position excluded from the loss, in a group's ``masks`` (its labels): the
#: ignore index of ``torch.nn.CrossEntropyLoss``.
IGNORE_INDEX = -100
#: Placeholder log-probability at masked (prompt) positions of ``inference_logprobs``.
MASKED_LOGPROB = 1.0

#: Key of a group's reference answer, inside ``group_overrides`` (or at the group's top level);
#: the rollout views (process HTML, view-run) show it beside the group.
REFERENCE_KEY = "reference_answer"

#: Whatever ``get_next_item`` returns; opaque to the framework.
Item = Any
#: A plain scalar.
number = int | float
#: A string identifier.
UUID = str


class AgentStep(TypedDict, total=False):
    """One step of an agent rollout: what it saw, what it did, and what it got."""

    observation: Any
    action: Any
    reward: float | None
    messages: list[Message]
    info: dict[str, Any]


#: An agent's trajectory, step by step.
AgentHistory = list[AgentStep]
#: An observation returned by a game/env step (free-form).
Observation = Any


class GameStep(TypedDict, total=False):
    """One step of a game played by the policy (text games, gymnasium wrappers)."""

    observation: Observation
    action: str
    reward: float
    done: bool
    messages: list[Message]
    info: dict[str, Any]


#: A whole game, step by step.
GameHistory = list[GameStep]


class EvaluationConfigGeneral(TypedDict, total=False):
    """``config_general`` block of ``metrics.json`` written by ``BaseEnv.evaluate_log``."""

    model_name: str
    total_evaluation_time_seconds: str
    generation_parameters: dict[str, Any]
    start_time: float
    end_time: float


#: Metric name -> value, e.g. ``{"eval/percent_correct": 0.42}``.
EvaluationMetrics = dict[str, float]


class EvaluationResults(TypedDict):
    """``results`` block of ``metrics.json``: ``{"atropos|<task>|0": metrics, "all": metrics}``."""

    all: EvaluationMetrics


class EvaluationSample(TypedDict, total=False):
    """One line of ``samples.jsonl`` written next to ``metrics.json``."""

    messages: list[Message]
    question: str
    gold_answer: str
    model_answer: str
    score: float
    correct: bool
    finish_reason: str


def __getattr__(name: str) -> Any:
    """Load ``ChatCompletionContentPartParam`` (OpenAI's, kept at Atropos 0.4's path) on first use.

    So importing this module does not import ``openai``.
    """
    if name == "ChatCompletionContentPartParam":
        from openai.types.chat import ChatCompletionContentPartParam

        globals()[name] = ChatCompletionContentPartParam
        return ChatCompletionContentPartParam
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AgentHistory",
    "AgentStep",
    "Content",
    "EvaluationConfigGeneral",
    "EvaluationMetrics",
    "EvaluationResults",
    "EvaluationSample",
    "GameHistory",
    "GameStep",
    "IGNORE_INDEX",
    "Item",
    "MASKED_LOGPROB",
    "Message",
    "Observation",
    "REFERENCE_KEY",
    "UUID",
    "number",
]
