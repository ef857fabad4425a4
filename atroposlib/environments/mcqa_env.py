"""Multiple-choice QA (MMLU-style): think, then answer with the option letter."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from atroposlib.envs.data import load_rows, maybe_json
from atroposlib.envs.scoring import extract_answer_tag
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig

LETTERS = "ABCDEFGHIJ"
SYSTEM_PROMPT = (
    "Answer the multiple-choice question. Think briefly, then give only the letter of the "
    "correct option inside <answer></answer>, e.g. <answer>B</answer>."
)


def normalise_row(row: dict[str, Any], question_field: str, choices_field: str,
                  answer_field: str) -> dict[str, Any]:
    """Turn a dataset row into ``{"question", "choices": [str], "answer": int}``.

    Accepts choices as a list (or JSON list) in ``choices_field``, or as columns ``A``,
    ``B``, ... ; the answer as an index (0-based int) or a letter.

    Raises:
        KeyError: a field is missing (the message lists the row's fields).
        ValueError: the answer is not a valid index or letter for the choices.
    """
    if question_field not in row:
        raise KeyError(f"no question field {question_field!r} in row fields {sorted(row)}; "
                       "set --env.question_field")
    if choices_field in row:
        choices = [str(c) for c in maybe_json(row[choices_field])]
    else:
        choices = [str(row[k]) for k in LETTERS if k in row]
    if len(choices) < 2:
        raise KeyError(f"no choices (field {choices_field!r} or columns A, B, ...) in row "
                       f"fields {sorted(row)}; set --env.choices_field")
    raw = row.get(answer_field)
    if isinstance(raw, str) and raw.strip().upper() in LETTERS[: len(choices)] and raw.strip():
        answer = LETTERS.index(raw.strip().upper())
    elif isinstance(raw, int | float) or (isinstance(raw, str) and raw.strip().isdigit()):
        answer = int(raw)
    else:
        raise ValueError(f"answer {raw!r} is neither a letter nor an index; set --env.answer_field")
    if not 0 <= answer < len(choices):
        raise ValueError(f"answer index {answer} out of range for {len(choices)} choices")
    return {"question": str(row[question_field]), "choices": choices, "answer": answer}


def parse_letter(text: str, n_choices: int) -> str | None:
    """The chosen letter: from ``<answer>X</answer>``, else "answer is X" / "Answer: X"."""
    valid = LETTERS[:n_choices]
    tagged = extract_answer_tag(text)
    if tagged is not None:
        match = re.fullmatch(rf"\(?([{valid}])\)?[.)]?(?:\s.*)?", tagged.strip(), re.DOTALL)
        return match.group(1) if match else None
    found = re.findall(rf"answer(?: is|:)\s*\(?([{valid}])\b", text, re.IGNORECASE)
    return found[-1].upper() if found else None


class MCQAConfig(SingleTurnEnvConfig):
    """Settings of :class:`MCQAEnv`."""

    dataset_name: str = Field(
        default="cais/mmlu", description="HF hub dataset id, or a local .jsonl/.json/.csv file."
    )
    dataset_config: str | None = Field(default="all", description="Hub dataset configuration.")
    split: str = Field(default="auxiliary_train", description="Split used for training.")
    eval_split: str = Field(default="test", description="Split used by evaluate.")
    eval_limit: int = Field(default=200, ge=1, description="Evaluate on at most this many rows.")
    question_field: str = Field(default="question", description="Field with the question.")
    choices_field: str = Field(
        default="choices", description="Field with the list of options (else columns A, B, ...)."
    )
    answer_field: str = Field(
        default="answer", description="Field with the correct option (0-based index or letter)."
    )
    shuffle_choices: bool = Field(
        default=False, description="Permute the options of each training item (augmentation)."
    )
    seed: int = Field(default=42, description="Seed for shuffling rows and options.")
    limit: int | None = Field(default=None, description="Use at most this many training rows.")
    max_tokens: int = Field(default=256, ge=1, description="Completion budget per rollout.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")


class MCQAEnv(SingleTurnEnv):
    """Reward 1 for the right letter, 0 otherwise (and 0 when the reply was cut off)."""

    name = "mcqa"
    env_config_cls = MCQAConfig
    truncated_reward = 0.0

    def _rows(self, split: str, limit: int | None) -> list[dict[str, Any]]:
        c = self.config
        return [
            normalise_row(r, c.question_field, c.choices_field, c.answer_field)
            for r in load_rows(c.dataset_name, split, c.dataset_config, limit)
        ]

    async def setup(self) -> None:
        self.train_items = self._rows(self.config.split, self.config.limit)
        if not self.train_items:
            raise ValueError(f"dataset {self.config.dataset_name!r} has no training rows")
        self.rng.shuffle(self.train_items)

    def load_eval_items(self) -> list[dict[str, Any]]:
        """The eval split's rows, loaded on the first evaluate."""
        return self._rows(self.config.eval_split, self.config.eval_limit)

    def train_item(self, index: int) -> dict[str, Any]:
        item = super().train_item(index)
        if self.config.shuffle_choices:
            order = list(range(len(item["choices"])))
            self.rng.shuffle(order)
            item = {"question": item["question"],
                    "choices": [item["choices"][i] for i in order],
                    "answer": order.index(item["answer"])}
        return item

    def prompt(self, item):
        options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(item["choices"]))
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"{item['question']}\n\n{options}"}]

    def score(self, item, completion: str) -> float:
        """1.0 when the parsed letter is the right one, else 0.0."""
        return 1.0 if parse_letter(completion, len(item["choices"])) == LETTERS[item["answer"]] else 0.0

    def answer(self, item):
        return LETTERS[item["answer"]]


if __name__ == "__main__":
    MCQAEnv.cli()
