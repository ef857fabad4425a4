"""Request types of the in-process sampler's routes, with OpenAI's and vLLM's field names."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Most completions one request may ask for (vLLM has no fixed cap; this keeps one call bounded).
MAX_N = 256

#: Fields that would change what is sampled and that this sampler does not implement: a request
#: setting one to anything but its neutral value is refused (400), never silently ignored.
UNSUPPORTED: dict[str, Any] = {
    "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0,
    "min_tokens": 0, "logit_bias": None, "best_of": None, "use_beam_search": False,
    "stream": False, "echo": False, "prompt_logprobs": None, "guided_json": None,
    "guided_regex": None, "guided_choice": None, "guided_grammar": None, "response_format": None,
    "structured_outputs": None, "tools": None, "suffix": None,
}


class _Sampling(BaseModel):
    """Fields both routes share. Unknown fields are accepted and ignored, as vLLM does."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    stop: str | list[str] | None = None
    seed: int | None = None
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> _Sampling:
        extra = self.model_extra or {}
        given = [f"{k}={extra[k]!r}" for k, neutral in UNSUPPORTED.items()
                 if k in extra and extra[k] not in (neutral, None)]
        if given:
            raise ValueError(f"{', '.join(given)}: not supported by the trainer's in-process sampler "
                             "(rollout_engine: hf); drop it, or sample from vLLM (rollout_engine: vllm)")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple (empty strings dropped)."""
        if self.stop is None:
            return ()
        return tuple(s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt as text or token ids (a list of them is several prompts)."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=0)

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: a conversation rendered with the tokenizer's chat template."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


__all__ = ["MAX_N", "UNSUPPORTED", "ChatCompletionRequest", "CompletionRequest"]
