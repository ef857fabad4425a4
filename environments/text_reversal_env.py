"""Text reversal: write a procedurally generated phrase backwards, character by character."""

from __future__ import annotations

import difflib
import random
import sys
from pathlib import Path

from pydantic import Field

if __package__ in (None, ""):  # run as `python environments/text_reversal_env.py ...`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import BaseEnv, BaseEnvConfig  # noqa: E402
from environments.common import (  # noqa: E402
    add_rollout,
    default_server,
    default_tokenizer_name,
    extract_answer_tag,
    make_word,
    new_group,
    run_eval,
)

SYSTEM_PROMPT = (
    "You reverse text exactly, character by character (the last character first). Put only "
    "the reversed text inside <answer></answer>."
)


def make_item(rng: random.Random, min_words: int, max_words: int, min_len: int, max_len: int):
    """One item: ``{"text", "target", "question"}``; the text is 1+ pseudo-words."""
    words = [make_word(rng, min_len, max_len) for _ in range(rng.randint(min_words, max_words))]
    text = " ".join(words)
    return {"text": text, "target": text[::-1], "question": f"Reverse this text: {text}"}


def score_reversal(text: str, target: str, partial_credit: bool) -> float:
    """Score a reply against the reversed text.

    Returns:
        1.0 for the exact reversal inside ``<answer>`` tags; otherwise 0.0, or with
        ``partial_credit`` half the ``difflib`` similarity ratio of the tagged answer.
    """
    answer = extract_answer_tag(text)
    if answer is None:
        return 0.0
    if answer == target:
        return 1.0
    if partial_credit:
        return 0.5 * difflib.SequenceMatcher(None, answer, target).ratio()
    return 0.0


class TextReversalConfig(BaseEnvConfig):
    """Settings of :class:`TextReversalEnv`."""

    min_words: int = Field(default=1, ge=1, description="Fewest pseudo-words per text.")
    max_words: int = Field(default=2, ge=1, description="Most pseudo-words per text.")
    min_word_length: int = Field(default=4, ge=1, description="Shortest pseudo-word.")
    max_word_length: int = Field(default=8, ge=1, description="Longest pseudo-word.")
    partial_credit: bool = Field(
        default=True,
        description="Give near-misses 0.5 x character similarity instead of 0 (denser signal).",
    )
    max_tokens: int = Field(default=64, ge=1, description="Completion budget per rollout.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature (training).")
    seed: int = Field(default=0, description="Seed of the training-item generator.")
    eval_size: int = Field(default=50, ge=1, description="Items in the evaluation set.")


class TextReversalEnv(BaseEnv):
    """Reverses short texts; exact-match reward with optional similarity partial credit."""

    name = "text_reversal"
    env_config_cls = TextReversalConfig

    @classmethod
    def config_init(cls):
        return (
            TextReversalConfig(
                tokenizer_name=default_tokenizer_name(), group_size=8, max_token_length=1024,
                wandb_name=cls.name, use_wandb=False,
            ),
            default_server(),
        )

    def _make(self, rng):
        c = self.config
        return make_item(rng, c.min_words, c.max_words, c.min_word_length, c.max_word_length)

    async def setup(self) -> None:
        c = self.config
        if c.min_words > c.max_words or c.min_word_length > c.max_word_length:
            raise ValueError("min_* must be <= max_* for words and word lengths")
        self.rng = random.Random(c.seed)
        self.iter = 0
        eval_rng = random.Random(c.seed + 1_000_003)
        self.eval_items = [self._make(eval_rng) for _ in range(c.eval_size)]
        self.percent_correct: list[float] = []

    async def get_next_item(self):
        self.iter += 1
        return self._make(self.rng)

    @staticmethod
    def _messages(item):
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": item["question"]}]

    async def collect_trajectories(self, item):
        messages = self._messages(item)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages, n=self.config.group_size, max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
            )
            nodes = managed.get_state()["nodes"]
        group = new_group()
        for choice, node in zip(completion.choices, nodes, strict=True):
            text = choice.message.content or ""
            score = score_reversal(text, item["target"], self.config.partial_credit)
            self.percent_correct.append(1.0 if score == 1.0 else 0.0)
            add_rollout(group, node, score, messages + [{"role": "assistant", "content": text}])
        return group, []

    async def evaluate(self, *args, **kwargs):
        return await run_eval(
            self, self.eval_items, self._messages,
            lambda item, text, _r: float(score_reversal(text, item["target"], False) == 1.0),
            max_tokens=self.config.max_tokens,
        )

    async def wandb_log(self, metrics=None):
        metrics = dict(metrics or {})
        if self.percent_correct:
            metrics["train/percent_correct"] = sum(self.percent_correct) / len(self.percent_correct)
            self.percent_correct = []
        await super().wandb_log(metrics)

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter, **(data or {})})


if __name__ == "__main__":
    TextReversalEnv.cli()
