"""Letter counting: "how many r's in 'strawberry'?" on procedurally generated words."""

from __future__ import annotations

import random
import re

from pydantic import Field

from atroposlib.envs.data import make_word
from atroposlib.envs.scoring import extract_answer_tag
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig

SYSTEM_PROMPT = (
    "You count letters carefully. Spell the word letter by letter, count, then give only the "
    "final number(s) inside <answer></answer>, e.g. <answer>3</answer>."
)


def make_question(rng: random.Random, min_len: int, max_len: int, n_letters: int) -> dict:
    """One item: ``{"word", "letters", "counts", "question"}``.

    Letters are mostly drawn from the word (so counts above 1 are common) and sometimes from
    the whole alphabet (count 0).
    """
    word = make_word(rng, min_len, max_len)
    letters: list[str] = []
    while len(letters) < n_letters:
        pool = word if rng.random() < 0.8 else "abcdefghijklmnopqrstuvwxyz"
        letter = rng.choice(pool)
        if letter not in letters:
            letters.append(letter)
    counts = [word.count(letter) for letter in letters]
    quoted = ", ".join(f"'{letter}'" for letter in letters)
    if n_letters == 1:
        question = f"How many times does the letter {quoted} appear in the word '{word}'?"
    else:
        question = (
            f"How many times does each of the letters {quoted} appear in the word '{word}'? "
            "Give the counts in the same order, separated by commas."
        )
    return {"word": word, "letters": letters, "counts": counts, "question": question}


_NUMBER_WORDS = {"zero": 0, "none": 0, "no": 0, "once": 1, "one": 1, "twice": 2, "two": 2,
                 "thrice": 3, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10}
_NUMBER = re.compile(r"-?\d+|\b(?:" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)


def numbers_in(text: str) -> list[int]:
    """Integers in ``text`` in order: digits and number words ("twice", "three", "no")."""
    return [int(tok) if tok.lstrip("-").isdigit() else _NUMBER_WORDS[tok.lower()]
            for tok in _NUMBER.findall(text)]


def score_answer(text: str, counts: list[int]) -> float:
    """Score a reply against the true counts.

    Returns:
        1.0 for the right count(s) inside ``<answer>`` tags, 0.5 for the right count(s) as
        the last number(s) of an untagged reply ("appears twice" counts), else 0.0.
    """
    tagged = extract_answer_tag(text)
    if tagged is not None:
        return 1.0 if numbers_in(tagged) == counts else 0.0
    return 0.5 if numbers_in(text)[-len(counts):] == counts else 0.0


class LetterCountingConfig(SingleTurnEnvConfig):
    """Settings of :class:`LetterCountingEnv`."""

    min_word_length: int = Field(default=5, ge=1, description="Shortest generated word.")
    max_word_length: int = Field(default=12, ge=1, description="Longest generated word.")
    letters_per_question: int = Field(
        default=1, ge=1, le=5, description="How many different letters each question asks about."
    )
    max_tokens: int = Field(default=128, ge=1, description="Completion budget per rollout.")
    eval_size: int = Field(default=50, ge=1, description="Questions in the evaluation set.")


class LetterCountingEnv(SingleTurnEnv):
    """Counts letters in pseudo-words; reward 1 / 0.5 (right but untagged) / 0."""

    name = "letter_counting"
    env_config_cls = LetterCountingConfig

    async def setup(self) -> None:
        cfg = self.config
        if cfg.min_word_length > cfg.max_word_length:
            raise ValueError("min_word_length must be <= max_word_length; swap or adjust them")
        eval_rng = random.Random(cfg.seed + 1_000_003)
        self.eval_items = [self.train_item(i, eval_rng) for i in range(cfg.eval_size)]

    def train_item(self, index, rng=None):
        cfg = self.config
        return make_question(rng or self.rng, cfg.min_word_length, cfg.max_word_length,
                             cfg.letters_per_question)

    def prompt(self, item):
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": item["question"]}]

    def score(self, item, completion):
        return score_answer(completion, item["counts"])

    def answer(self, item):
        return item["counts"]


if __name__ == "__main__":
    LetterCountingEnv.cli()
