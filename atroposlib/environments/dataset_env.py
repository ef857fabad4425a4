"""Generic dataset environment: any HF dataset or local file, scored by registered rewards."""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field

from atroposlib.envs.data import load_rows
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from atroposlib.rewards import registry

DEFAULT_SYSTEM_PROMPT = (
    "Think step by step inside <think></think>, then give the final answer as \\boxed{answer}."
)


class DatasetEnvConfig(SingleTurnEnvConfig):
    """Settings of :class:`DatasetEnv`."""

    dataset_name: str = Field(
        default="openai/gsm8k",
        description="HF hub dataset id, or a local .jsonl/.json/.csv/.parquet file or dataset dir.",
    )
    dataset_config: str | None = Field(default="main", description="Hub dataset configuration.")
    split: str = Field(default="train", description="Split used for training items.")
    eval_dataset_name: str | None = Field(
        default=None, description="Dataset for evaluate (default: dataset_name)."
    )
    eval_split: str = Field(default="test", description="Split used by evaluate.")
    eval_limit: int = Field(default=200, ge=1, description="Evaluate on at most this many rows.")
    prompt_field: str = Field(default="question", description="Row field holding the prompt.")
    answer_field: str = Field(default="answer", description="Row field holding the reference answer.")
    answer_regex: str | None = Field(
        default=r"####\s*(.+?)\s*$",
        description="Regex whose group 1 extracts the answer from answer_field (None = use the "
        "whole field). The default takes GSM8K's text after '####'; rows it does not match use "
        "the whole field.",
    )
    system_prompt: str | None = Field(
        default=DEFAULT_SYSTEM_PROMPT, description="System message (None = no system message)."
    )
    prompt_template: str = Field(
        default="{prompt}", description="User message; {prompt} is replaced by prompt_field."
    )
    reward_funcs: list[str | dict[str, Any]] = Field(
        default_factory=lambda: ["accuracy"],
        description="Reward specs for the registry (names or {'type': ..., 'weight': ...}); "
        "several are summed with CombinedReward. Each gets solution=<answer>.",
    )
    shuffle: bool = Field(default=True, description="Shuffle training rows (seeded).")
    seed: int = Field(default=42, description="Shuffle seed.")
    limit: int | None = Field(default=None, description="Use at most this many training rows.")
    max_tokens: int = Field(default=512, ge=1, description="Completion budget per rollout.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")


class DatasetEnv(SingleTurnEnv):
    """Single-turn prompts from a dataset; reward = the configured registry rewards."""

    name = "dataset"
    env_config_cls = DatasetEnvConfig

    def _answer(self, row: dict[str, Any]) -> str:
        raw = row.get(self.config.answer_field)
        if raw is None:
            raise KeyError(
                f"row has no answer field {self.config.answer_field!r} (fields: {sorted(row)}); "
                "set --env.answer_field"
            )
        text = str(raw)
        if self.config.answer_regex:
            match = re.search(self.config.answer_regex, text, re.MULTILINE | re.DOTALL)
            if match:
                text = match.group(1)
        return text.strip().replace(",", "") if re.fullmatch(r"[\d,.\-]+", text.strip()) else text

    def _item(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.config.prompt_field not in row:
            raise KeyError(
                f"row has no prompt field {self.config.prompt_field!r} (fields: {sorted(row)}); "
                "set --env.prompt_field"
            )
        return {"prompt": str(row[self.config.prompt_field]), "answer": self._answer(row)}

    async def setup(self) -> None:
        c = self.config
        rows = load_rows(c.dataset_name, c.split, c.dataset_config, c.limit)
        if not rows:
            raise ValueError(f"dataset {c.dataset_name!r} split {c.split!r} is empty")
        self.train_items = [self._item(r) for r in rows]
        if c.shuffle:
            random.Random(c.seed).shuffle(self.train_items)
        self.reward = registry.create(
            {"type": "combined", "rewards": list(c.reward_funcs)}
            if len(c.reward_funcs) != 1
            else c.reward_funcs[0]
        )

    def load_eval_items(self) -> list[dict[str, Any]]:
        """Rows of ``eval_split`` (of ``eval_dataset_name``, default ``dataset_name``)."""
        c = self.config
        rows = load_rows(c.eval_dataset_name or c.dataset_name, c.eval_split,
                         c.dataset_config, c.eval_limit)
        return [self._item(r) for r in rows]

    def prompt(self, item):
        messages = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append(
            {"role": "user", "content": self.config.prompt_template.format(prompt=item["prompt"])}
        )
        return messages

    def score(self, item, completion: str) -> float:
        """The configured registry reward(s) of the reply (raises RolloutError on failure)."""
        return self.reward([completion], solution=item["answer"])[0]

    def eval_metrics(self, samples):
        """SingleTurnEnv's metrics plus ``eval/mean_reward`` (= ``eval/mean_score``)."""
        metrics = super().eval_metrics(samples)
        metrics["eval/mean_reward"] = metrics["eval/mean_score"]
        return metrics

    async def wandb_log(self, metrics=None):
        metrics = dict(metrics or {})
        if self.train_scores:
            metrics["train/mean_reward"] = sum(self.train_scores) / len(self.train_scores)
        metrics.update(self.reward.metrics)
        await super().wandb_log(metrics)


if __name__ == "__main__":
    DatasetEnv.cli()
