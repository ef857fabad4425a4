"""``ServerHarness``: an in-process inference server that answers from canned responses.

The harness is the test double behind ``ServerManager(..., testing=True)`` and the usual stand-in
for a real backend in unit tests of ``ManagedServer`` and the OpenAI proxy. It never does I/O:

* ``set_tokens_and_logprobs_response(prompt, prompt_tokens, output_tokens_list,
  output_logprobs_list, finish_reasons)`` makes ``tokens_and_logprobs_completion`` answer a
  prompt (looked up by its text, else by its token ids) with exactly those tokens;
* ``set_completion_response(prompt, response)`` and ``set_chat_completion_response(messages,
  response)`` make ``completion`` / ``chat_completion`` return a prepared OpenAI object (or a
  string, or a list of strings for ``n`` choices, wrapped into one).

A request with no canned answer raises ``KeyError`` naming what was asked, so a test that forgot
to prepare a response fails loudly instead of hanging. ``tokenizer`` and ``config`` are plain
attributes that tests may replace. For a scripted server that answers *any* prompt, see
:class:`atroposlib.testing.fake_server.FakeServer`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.responses import chat_completion_response, completion_response


def _messages_key(messages: Any) -> str:
    """A stable lookup key for a list of chat messages (role + content + tool fields)."""
    return json.dumps(list(messages or []), sort_keys=True, default=str)


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


def _choice_rows(resp: str | list[str], n: int,
                 finish_reason: FinishReason | list[FinishReason]) -> list[tuple[str, str]]:
    """``(text, finish_reason)`` for each of ``n`` choices; a single string/reason is repeated."""
    texts = [resp] * n if isinstance(resp, str) else list(resp)
    reasons = [finish_reason] * n if isinstance(finish_reason, str) else list(finish_reason)
    if len(texts) < n or len(reasons) < n:
        raise ValueError(f"n={n} choices need {n} responses and finish reasons, got "
                         f"{len(texts)} and {len(reasons)}")
    return list(zip(texts[:n], reasons[:n], strict=True))


def create_chat_completion(resp: str | list[str], n: int = 1,
                           finish_reason: FinishReason | list[FinishReason] = "stop",
                           model: str = "test_model") -> Any:
    """An OpenAI ``ChatCompletion`` with ``n`` assistant choices, for tests and canned answers.

    Args:
        resp: the reply text, used for every choice, or one text per choice.
        n: how many choices.
        finish_reason: one reason for every choice, or one per choice.
        model: the ``model`` field of the result.

    Returns:
        ``openai.types.chat.ChatCompletion`` (a fresh id, ``created`` = now).

    Raises:
        ValueError: a list ``resp`` or ``finish_reason`` has fewer than ``n`` entries.
    """
    return chat_completion_response(_choice_rows(resp, n, finish_reason), model)


def create_completion(resp: str | list[str], n: int = 1,
                      finish_reason: FinishReason | list[FinishReason] = "stop",
                      model: str = "test_model") -> Any:
    """An OpenAI ``Completion`` with ``n`` text choices; arguments as :func:`create_chat_completion`.

    Returns:
        ``openai.types.completion.Completion``.

    Raises:
        ValueError: a list ``resp`` or ``finish_reason`` has fewer than ``n`` entries.
    """
    return completion_response(_choice_rows(resp, n, finish_reason), model)


def _wrap_chat(texts: list[str], model: str) -> Any:
    return create_chat_completion(texts, len(texts), model=model)


def _wrap_completion(texts: list[str], model: str) -> Any:
    return create_completion(texts, len(texts), model=model)


class ServerHarness(InferenceClient):
    """Canned-response inference server (see module docstring).

    Example::

        server = ServerHarness()
        server.tokenizer = tokenizer
        server.set_tokens_and_logprobs_response(
            prompt="Hello", prompt_tokens=tokenizer.encode("Hello"),
            output_tokens_list=[[32, 87]], output_logprobs_list=[[-0.1, -0.2]],
            finish_reasons=["stop"],
        )
        managed = ManagedServer(server, tokenizer=tokenizer)
    """

    def __init__(self, config: APIServerConfig | None = None, tokenizer: Any = None, **_: Any):
        """Create an empty harness.

        Args:
            config: server settings (default: model "harness", no URL, no health checks).
            tokenizer: the tokenizer ``ManagedServer`` should use when given none.
        """
        super().__init__(
            config
            or APIServerConfig(model_name="harness", base_url=None, api_key=None, health_check=False)
        )
        self.server_healthy = True
        self._tokenizer = tokenizer
        self.tokens_and_logprobs: dict[str, tuple[list[int], list[list[int]], list[list[float]], list[str]]] = {}
        self.completion_responses: dict[str, Any] = {}
        self.chat_responses: dict[str, Any] = {}
        self.requests: list[dict[str, Any]] = []

    # tests assign ``server.tokenizer = ...``; the base class's property loads from the hub
    @property
    def tokenizer(self) -> Any:
        """The tokenizer given to the harness (None unless set)."""
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    # ------------------------------------------------------------------ preparing answers
    def set_tokens_and_logprobs_response(
        self,
        prompt: str,
        prompt_tokens: list[int],
        output_tokens_list: list[list[int]],
        output_logprobs_list: list[list[float]],
        finish_reasons: list[str] | None = None,
    ) -> None:
        """Answer ``tokens_and_logprobs_completion`` for ``prompt`` with these tokens.

        Args:
            prompt: the prompt text the caller will send (also matched by ``prompt_tokens``).
            prompt_tokens: ``[P]`` token ids of the prompt.
            output_tokens_list: ``[n][T_k]`` sampled token ids, one list per choice.
            output_logprobs_list: ``[n][T_k]`` log-probs of those tokens.
            finish_reasons: ``[n]`` reasons (default ``"stop"`` for each).

        Raises:
            ValueError: the per-choice lists differ in length.
        """
        n = len(output_tokens_list)
        reasons = list(finish_reasons) if finish_reasons is not None else ["stop"] * n
        if len(output_logprobs_list) != n or len(reasons) != n:
            raise ValueError(
                f"output_tokens_list ({n}), output_logprobs_list ({len(output_logprobs_list)}) "
                f"and finish_reasons ({len(reasons)}) must have one entry per choice"
            )
        self.tokens_and_logprobs[prompt] = (
            list(prompt_tokens),
            [list(t) for t in output_tokens_list],
            [list(lp) for lp in output_logprobs_list],
            reasons,
        )

    def set_completion_response(self, prompt: str, response: Any) -> None:
        """Answer ``completion(prompt=prompt)`` with ``response`` (Completion, str or [str])."""
        self.completion_responses[prompt] = response

    def set_chat_completion_response(self, messages: list[dict[str, Any]], response: Any) -> None:
        """Answer ``chat_completion(messages=messages)`` with ``response`` (ChatCompletion, str or [str])."""
        self.chat_responses[_messages_key(messages)] = response

    # ------------------------------------------------------------------ backend wrappers
    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        self.requests.append({"kind": "chat", **kwargs})
        key = _messages_key(kwargs.get("messages"))
        if key not in self.chat_responses:
            raise KeyError(f"ServerHarness has no chat response for messages {key}")
        return self._as_object(self.chat_responses[key], _wrap_chat, kwargs)

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        self.requests.append({"kind": "completion", **kwargs})
        prompt = kwargs.get("prompt")
        if prompt not in self.completion_responses:
            raise KeyError(f"ServerHarness has no completion response for prompt {prompt!r}")
        return self._as_object(self.completion_responses[prompt], _wrap_completion, kwargs)

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        self.requests.append({"kind": "tokens", **kwargs})
        prompt, input_ids = kwargs.get("prompt"), kwargs.get("input_ids")
        if prompt in self.tokens_and_logprobs:
            found = self.tokens_and_logprobs[prompt]
        else:
            found = next(
                (v for v in self.tokens_and_logprobs.values() if input_ids is not None and v[0] == list(input_ids)),
                None,
            )
            if found is None:
                raise KeyError(
                    f"ServerHarness has no tokens_and_logprobs response for prompt {prompt!r} "
                    f"(input_ids {input_ids!r}); call set_tokens_and_logprobs_response first"
                )
        prompt_tokens, outputs, logprobs, reasons = found
        return list(prompt_tokens), [list(o) for o in outputs], [list(lp) for lp in logprobs], list(reasons)

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "ServerHarness does not implement get_logprobs; assign server.get_logprobs in the test"
        )

    @staticmethod
    def _as_object(response: Any, wrap: Any, kwargs: dict[str, Any]) -> Any:
        if isinstance(response, str):
            return wrap([response], str(kwargs.get("model", "harness")))
        if isinstance(response, list) and all(isinstance(r, str) for r in response):
            return wrap(list(response), str(kwargs.get("model", "harness")))
        return response


