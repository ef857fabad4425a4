"""RLAIF: completions are scored by an LLM judge (rubric or pairwise) through the same servers."""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from typing import Any, Literal

from pydantic import Field

from atroposlib.envs.data import load_rows
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from atroposlib.errors import RolloutError

#: Offline prompts used when dataset_name is 'builtin'.
BUILTIN_PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Give three tips for writing clear emails.",
    "Write a haiku about autumn rain.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a bakery that sells only bread, and say why.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "How do I boil an egg so the yolk stays soft?",
    "Describe a cat to someone who has never seen one.",
    "Why should you back up your files? Answer briefly.",
    "Write a polite message declining a meeting invitation.",
    "List four renewable sources of energy.",
    "What does a compiler do?",
]

DEFAULT_RUBRIC = (
    "helpful (answers exactly what was asked), correct, clear and concise; "
    "penalise rambling, repetition and made-up facts"
)

RUBRIC_JUDGE = (
    "You are a strict judge. Rate the RESPONSE to the INSTRUCTION from 1 (useless) to 10 "
    "(excellent) for being: {rubric}.\n\nINSTRUCTION:\n{prompt}\n\nRESPONSE:\n{response}\n\n"
    "Reply with only 'Score: N'."
)
PAIRWISE_JUDGE = (
    "You are a strict judge. Which response follows the INSTRUCTION better, being: {rubric}?"
    "\n\nINSTRUCTION:\n{prompt}\n\nRESPONSE A:\n{a}\n\nRESPONSE B:\n{b}\n\n"
    "Reply with only \\boxed{{A}} or \\boxed{{B}}."
)


def parse_rating(text: str, low: int = 1, high: int = 10) -> float | None:
    r"""The rating in a judge reply: "Score: N", "\boxed{N}", "N/10", else a lone number."""
    patterns = (r"score\s*[:=]?\s*(\d+(?:\.\d+)?)", r"\\boxed\{\s*(\d+(?:\.\d+)?)\s*\}",
                r"(\d+(?:\.\d+)?)\s*/\s*10", r"^\s*(\d+(?:\.\d+)?)\s*$")
    for pattern in patterns:
        found = re.findall(pattern, text, re.IGNORECASE | re.MULTILINE)
        for value in reversed(found):
            rating = float(value)
            if low <= rating <= high:
                return rating
    return None


def parse_preference(text: str) -> str | None:
    r"""Return "A" or "B" from ``\boxed{A}``, "Response A" or a lone letter; None if unclear."""
    for pattern in (r"\\boxed\{\s*([AB])\s*\}", r"response\s+([AB])\b", r"^\s*([AB])\s*\.?\s*$"):
        found = set(re.findall(pattern, text, re.IGNORECASE | re.MULTILINE))
        if len(found) == 1:
            return found.pop().upper()
    return None


class JudgeConfig(SingleTurnEnvConfig):
    """Settings of :class:`JudgeEnv`."""

    dataset_name: str = Field(
        default="builtin",
        description="'builtin' (a small offline prompt list), or a hub id / local file with "
        "instructions in prompt_field.",
    )
    dataset_config: str | None = Field(default=None, description="Hub dataset configuration.")
    split: str = Field(default="train", description="Split to read.")
    prompt_field: str = Field(default="prompt", description="Field with the instruction.")
    limit: int | None = Field(default=None, description="Use at most this many prompts.")
    seed: int = Field(default=42, description="Shuffle seed.")
    mode: Literal["rubric", "pairwise"] = Field(
        default="rubric",
        description="rubric: each response rated 1-10 (mean of judge_samples); pairwise: every "
        "pair judged in both orders, score = win rate.",
    )
    rubric: str = Field(default=DEFAULT_RUBRIC, description="What the judge rewards.")
    judge_samples: int = Field(default=1, ge=1, description="Judge ratings averaged (rubric).")
    judge_max_tokens: int = Field(default=16, ge=1, description="Judge reply budget.")
    judge_temperature: float = Field(
        default=0.0, ge=0,
        description="Judge temperature of the first attempt; retries use at least 0.7 so a "
        "deterministic judge can change its answer.",
    )
    judge_retries: int = Field(
        default=2, ge=0,
        description="Extra judge attempts when no verdict can be parsed; after them the group "
        "is dropped (RolloutError), never scored 0.",
    )
    judge_prefill: bool = Field(
        default=True,
        description="Render the judge chat with the tokenizer's template and let the judge "
        "continue after 'Score:' (or '\\boxed{') through the completion API: makes small "
        "judges answer in format. Turn off for chat-only APIs.",
    )
    max_tokens: int = Field(default=128, ge=1, description="Policy completion budget.")
    eval_size: int = Field(default=8, ge=1, description="Prompts rated greedily in evaluate.")
    group_size: int = Field(default=4, ge=1, description="Rollouts (responses) per group.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")


class JudgeEnv(SingleTurnEnv):
    """Policy answers instructions; an LLM judge on the same ServerManager scores them.

    ``evaluate`` rates one greedy answer per eval prompt with the rubric (in both modes) and
    reports ``eval/judge_score`` and ``eval/judge_failure_rate`` (prompts whose answer got no
    verdict, not averaged in as 0).
    """

    name = "judge"
    env_config_cls = JudgeConfig

    async def setup(self) -> None:
        c = self.config
        if c.dataset_name == "builtin":
            prompts = list(BUILTIN_PROMPTS)
        else:
            rows = load_rows(c.dataset_name, c.split, c.dataset_config, c.limit)
            missing = [r for r in rows if c.prompt_field not in r]
            if missing:
                raise KeyError(f"rows lack {c.prompt_field!r} (fields: {sorted(missing[0])}); "
                               "set --env.prompt_field")
            prompts = [str(r[c.prompt_field]) for r in rows]
        if not prompts:
            raise ValueError("the judge env needs at least one prompt")
        random.Random(c.seed).shuffle(prompts)
        n_eval = min(c.eval_size, max(1, len(prompts) // 5))
        items = [{"prompt": p} for p in prompts]
        self.eval_items, self.train_items = items[:n_eval], items[n_eval:] or items

    async def _judge(self, content: str, parse, n: int, prefix: str) -> list[Any]:
        """Ask the judge ``n`` verdicts; retry unparseable ones; raise RolloutError if none.

        Args:
            content: the judge prompt (one user message).
            parse: reply text -> verdict or None.
            n: verdicts wanted.
            prefix: start of the judge's reply, prefilled when ``judge_prefill``.
        """
        c = self.config
        prompt = None
        if c.judge_prefill:
            prompt = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
            ) + prefix
        verdicts: list[Any] = []
        for attempt in range(c.judge_retries + 1):
            kwargs = {"n": n - len(verdicts), "max_tokens": c.judge_max_tokens, "split": "eval",
                      "temperature": c.judge_temperature if attempt == 0 else max(0.7, c.judge_temperature)}
            if prompt is not None:
                completion = await self.server.completion(prompt=prompt, **kwargs)
                replies = [prefix + (ch.text or "") for ch in completion.choices]
            else:
                completion = await self.server.chat_completion(
                    messages=[{"role": "user", "content": content}], **kwargs)
                replies = [ch.message.content or "" for ch in completion.choices]
            verdicts += [v for v in map(parse, replies) if v is not None]
            if len(verdicts) >= n:
                return verdicts[:n]
        if verdicts:
            return verdicts
        raise RolloutError(
            f"the judge gave no parseable verdict in {c.judge_retries + 1} attempts; use a "
            "stronger judge model, raise judge_max_tokens or judge_retries"
        )

    async def rate(self, prompt: str, response: str) -> float:
        """Rubric score in [0, 1]: (mean rating - 1) / 9."""
        content = RUBRIC_JUDGE.format(rubric=self.config.rubric, prompt=prompt, response=response)
        ratings = await self._judge(content, parse_rating, self.config.judge_samples, "Score:")
        return (sum(ratings) / len(ratings) - 1.0) / 9.0

    async def pairwise_scores(self, prompt: str, responses: list[str]) -> list[float]:
        """Win rate of each response over every other, each pair judged in both orders."""
        wins = [0.0] * len(responses)
        games = [0] * len(responses)

        async def duel(i: int, j: int) -> None:
            content = PAIRWISE_JUDGE.format(rubric=self.config.rubric, prompt=prompt,
                                            a=responses[i], b=responses[j])
            winner = (await self._judge(content, parse_preference, 1, "\\boxed{"))[0]
            wins[i if winner == "A" else j] += 1.0
            games[i] += 1
            games[j] += 1

        await asyncio.gather(*(duel(i, j) for i, j in itertools.permutations(range(len(responses)), 2)))
        return [w / g if g else 0.5 for w, g in zip(wins, games, strict=True)]

    def prompt(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    async def score(self, item, completion: str) -> float:
        """:meth:`rate` (rubric); raises RolloutError when the judge gives no verdict."""
        return await self.rate(item["prompt"], completion)

    async def score_group(self, item, completions, finish_reasons):
        """Pairwise mode: :meth:`pairwise_scores` of the group; rubric: :meth:`score` each."""
        if self.config.mode == "pairwise":
            return await self.pairwise_scores(item["prompt"], completions)
        return await super().score_group(item, completions, finish_reasons)

    def eval_metrics(self, samples):
        """``eval/judge_score``: the mean rubric score of the judged answers."""
        return {"eval/judge_score": sum(s["score"] for s in samples) / len(samples)} if samples else {}

    def eval_failure_metrics(self, failed, total):
        """``eval/judge_failure_rate``: share of eval prompts without a verdict (or a reply)."""
        return {"eval/judge_failure_rate": failed / total if total else 0.0}

    async def wandb_log(self, metrics=None):
        """SingleTurnEnv's metrics plus ``train/judge_score`` (= ``train/mean_score``)."""
        if self.train_scores:
            metrics = {**(metrics or {}), "train/judge_score": sum(self.train_scores) / len(self.train_scores)}
        await super().wandb_log(metrics)


if __name__ == "__main__":
    JudgeEnv.cli()
