"""Text reversal: write a procedurally generated phrase backwards, character by character."""

import difflib
import random

from pydantic import Field

from atroposlib.envs.data import make_word
from atroposlib.envs.scoring import extract_answer_tag
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig

SYSTEM_PROMPT = "You reverse text exactly, character by character (the last character first). Put only the reversed text inside <answer></answer>."


def score_reversal(text: str, target: str, partial_credit: bool) -> float:
    """1.0 for the exact reversal in <answer> tags, else 0.0 (0.5 x similarity with partial credit)."""
    answer = extract_answer_tag(text)
    if answer is None or answer == target:
        return float(answer is not None)
    return 0.5 * difflib.SequenceMatcher(None, answer, target).ratio() if partial_credit else 0.0


class TextReversalConfig(SingleTurnEnvConfig):
    """Settings of :class:`TextReversalEnv`."""
    min_words: int = Field(default=1, ge=1, description="Fewest pseudo-words per text.")
    max_words: int = Field(default=2, ge=1, description="Most pseudo-words per text.")
    min_word_length: int = Field(default=4, ge=1, description="Shortest pseudo-word.")
    max_word_length: int = Field(default=8, ge=1, description="Longest pseudo-word.")
    partial_credit: bool = Field(default=True, description="Near-misses get 0.5 x similarity.")
    max_tokens: int = Field(default=64, ge=1, description="Completion budget per rollout.")
    eval_size: int = Field(default=50, ge=1, description="Items in the evaluation set.")


class TextReversalEnv(SingleTurnEnv):
    """Reverses short texts; exact-match reward with optional similarity partial credit."""
    name = "text_reversal"
    env_config_cls = TextReversalConfig

    async def setup(self):
        c = self.config
        if c.min_words > c.max_words or c.min_word_length > c.max_word_length:
            raise ValueError("min_* must be <= max_* for words and word lengths")
        rng = random.Random(c.seed + 1_000_003)  # the eval set: its own seeded items
        self.eval_items = [self.train_item(i, rng) for i in range(c.eval_size)]

    def train_item(self, index, rng=None):
        c, rng = self.config, rng or self.rng
        text = " ".join(make_word(rng, c.min_word_length, c.max_word_length) for _ in range(rng.randint(c.min_words, c.max_words)))
        return {"question": f"Reverse this text: {text}", "answer": text[::-1]}

    def prompt(self, item):
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": item["question"]}]

    def score(self, item, completion):
        return score_reversal(completion, item["answer"], self.config.partial_credit)


if __name__ == "__main__":
    TextReversalEnv.cli()
