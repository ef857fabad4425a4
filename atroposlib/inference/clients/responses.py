"""OpenAI response objects from generated text, for clients that do not get them from an OpenAI server.

``ManagedServer``, the test doubles and backends with their own generation endpoint answer
``chat_completion`` / ``completion`` with the same types as the ``openai`` client does; these two
functions build them. Objects are built without validation (``model_construct``): every value
comes from our own code.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any


def chat_completion_response(
    choices: Iterable[tuple[Any, str | None]], model: str, usage: Any = None
) -> Any:
    """An ``openai`` ``ChatCompletion`` with one choice per ``(message, finish_reason)``.

    Args:
        choices: ``(message, finish_reason)`` pairs; a message is the reply text, or a
            ``ChatCompletionMessage`` (e.g. with ``tool_calls``).
        model: the ``model`` field.
        usage: the ``usage`` field (a ``CompletionUsage``), or None.

    Returns:
        ``openai.types.chat.ChatCompletion`` (a fresh id, ``created`` = now).
    """
    from openai.types.chat import ChatCompletion, ChatCompletionMessage
    from openai.types.chat.chat_completion import Choice

    return ChatCompletion.model_construct(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        choices=[
            Choice.model_construct(
                index=i, finish_reason=reason, logprobs=None,
                message=(ChatCompletionMessage.model_construct(role="assistant", content=message)
                         if isinstance(message, str) else message),
            )
            for i, (message, reason) in enumerate(choices)
        ],
        created=int(time.time()),
        model=model,
        object="chat.completion",
        usage=usage,
    )


def completion_response(
    choices: Iterable[tuple[str, str | None]], model: str, usage: Any = None
) -> Any:
    """An ``openai`` ``Completion`` with one choice per ``(text, finish_reason)``.

    Returns:
        ``openai.types.completion.Completion`` (a fresh id, ``created`` = now).
    """
    from openai.types import Completion, CompletionChoice

    return Completion.model_construct(
        id=f"cmpl-{uuid.uuid4().hex}",
        choices=[
            CompletionChoice.model_construct(index=i, text=text, finish_reason=reason, logprobs=None)
            for i, (text, reason) in enumerate(choices)
        ],
        created=int(time.time()),
        model=model,
        object="text_completion",
        usage=usage,
    )


__all__ = ["chat_completion_response", "completion_response"]
