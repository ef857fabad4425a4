"""A Qwen tokenizer whose chat template renders tool calls inside Jinja's sandbox.

Some Qwen releases ship a chat template that builds lists with ``list.append``, which the
sandboxed Jinja environment of ``transformers`` (and of vLLM) refuses, so
``apply_chat_template(..., tools=...)`` fails. :class:`QwenFixedTokenizer` loads the model's
tokenizer and swaps in ``qwen_chat_template.jinja`` (beside this file): the same ChatML with
``<tools>``, ``<tool_call>`` and ``<tool_response>`` blocks, written without mutation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEMPLATE_PATH = Path(__file__).with_name("qwen_chat_template.jinja")


class QwenFixedTokenizer:
    """Wrapper around a Hugging Face Qwen tokenizer with the sandbox-safe chat template.

    Every attribute other than :meth:`apply_chat_template` is the wrapped tokenizer's
    (``encode``, ``decode``, ``eos_token_id`` ...); the wrapped one is ``.tokenizer``.

    Args:
        model_name_or_path: hub id or local directory of a Qwen model or tokenizer.
        **kwargs: passed to ``AutoTokenizer.from_pretrained``.

    Raises:
        OSError: the tokenizer cannot be found (offline and not cached, or a bad path).
    """

    @classmethod
    def _load_chat_template(cls) -> str:
        """The Jinja source of the fixed template."""
        return TEMPLATE_PATH.read_text(encoding="utf-8")

    def __init__(self, model_name_or_path: str, **kwargs: Any):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **kwargs)
        self.tokenizer.chat_template = self._load_chat_template()

    def __getattr__(self, name: str) -> Any:
        if name == "tokenizer":  # not set yet (failed __init__): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = True,
        padding: bool = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | bool | None = None,
        return_dict: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Render ``conversation`` (and ``tools``) with the fixed template.

        Same arguments and results as ``PreTrainedTokenizerBase.apply_chat_template``: token
        ids when ``tokenize`` (the default), else the prompt string.
        """
        return self.tokenizer.apply_chat_template(
            conversation, tools=tools, tokenize=tokenize, padding=padding,
            truncation=truncation, max_length=max_length, return_tensors=return_tensors,
            return_dict=return_dict, add_generation_prompt=add_generation_prompt, **kwargs,
        )
