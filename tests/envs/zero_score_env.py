"""A sample env whose scorer hides its errors as a score of 0 (what check_env warns about)."""

from __future__ import annotations

import json

from atroposlib.envs import SingleTurnEnv


class ZeroOnErrorEnv(SingleTurnEnv):
    """Scores the JSON field ``answer`` of a reply; a reply it cannot parse gets 0 (the smell)."""

    name = "zero_on_error"

    async def setup(self) -> None:
        self.train_items = [{"question": "2 + 2", "answer": 4}]
        self.eval_items = []

    def prompt(self, item):
        return [{"role": "user", "content": item["question"]}]

    def score(self, item, completion):
        try:
            return float(json.loads(completion)["answer"] == item["answer"])
        except (json.JSONDecodeError, KeyError, TypeError):
            return 0.0

    def parse_hint(self, text):
        try:
            return int(text)
        except ValueError:
            return 0  # not a scoring function: not flagged
