"""Generic dataset environment: any HF dataset or local file, scored by registered rewards."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

if __package__ in (None, ""):  # run as `python environments/dataset_env.py ...`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import BaseEnv, BaseEnvConfig  # noqa: E402
from atroposlib.envs.reward_fns import registry  # noqa: E402
from environments.common import (  # noqa: E402
    add_rollout,
    default_server,
    default_tokenizer_name,
    load_rows,
    new_group,
    run_eval,
)

DEFAULT_SYSTEM_PROMPT = (
    "Think step by step inside <think></think>, then give the final answer as \\boxed{answer}."
)


class DatasetEnvConfig(BaseEnvConfig):
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
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature (training).")


class DatasetEnv(BaseEnv):
    """Single-turn prompts from a dataset; reward = the configured registry rewards."""

    name = "dataset"
    env_config_cls = DatasetEnvConfig

    @classmethod
    def config_init(cls):
        return (
            DatasetEnvConfig(
                tokenizer_name=default_tokenizer_name(), group_size=8, max_token_length=2048,
                wandb_name=cls.name, use_wandb=False,
            ),
            default_server(),
        )

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
        self.train = [self._item(r) for r in rows]
        if c.shuffle:
            random.Random(c.seed).shuffle(self.train)
        self.reward = registry.create(
            {"type": "combined", "rewards": list(c.reward_funcs)}
            if len(c.reward_funcs) != 1
            else c.reward_funcs[0]
        )
        self.iter = 0
        self._eval_items: list[dict[str, Any]] | None = None
        self.reward_history: list[float] = []

    async def get_next_item(self):
        item = self.train[self.iter % len(self.train)]
        self.iter += 1
        return item

    def _messages(self, item):
        messages = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append(
            {"role": "user", "content": self.config.prompt_template.format(prompt=item["prompt"])}
        )
        return messages

    async def collect_trajectories(self, item):
        messages = self._messages(item)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages, n=self.config.group_size, max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
            )
            nodes = managed.get_state()["nodes"]
        texts = [c.message.content or "" for c in completion.choices]
        scores = self.reward(texts, solution=item["answer"])  # raises RolloutError on failure
        self.reward_history.extend(scores)
        group = new_group()
        for text, node, score in zip(texts, nodes, scores, strict=True):
            add_rollout(group, node, score, messages + [{"role": "assistant", "content": text}])
        return group, []

    async def evaluate(self, *args, **kwargs):
        c = self.config
        if self._eval_items is None:
            rows = load_rows(c.eval_dataset_name or c.dataset_name, c.eval_split,
                             c.dataset_config, c.eval_limit)
            self._eval_items = [self._item(r) for r in rows]
        return await run_eval(
            self, self._eval_items, self._messages,
            lambda item, text, _r: self.reward([text], solution=item["answer"])[0],
            max_tokens=c.max_tokens, metric="eval/mean_reward",
        )

    async def wandb_log(self, metrics=None):
        metrics = dict(metrics or {})
        if self.reward_history:
            metrics["train/mean_reward"] = sum(self.reward_history) / len(self.reward_history)
            self.reward_history = []
        metrics.update(self.reward.metrics)
        await super().wandb_log(metrics)

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter, **(data or {})})


if __name__ == "__main__":
    DatasetEnv.cli()
