"""Small environments used by the env-runtime tests (also runnable as CLI scripts)."""

from __future__ import annotations

import random

from pydantic import Field

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
    ScoredDataItem,
)


class ArithmeticConfig(BaseEnvConfig):
    """Config of the arithmetic test env."""

    max_operand: int = Field(default=9, description="Largest operand of the generated sums.")
    max_tokens: int = Field(default=16, description="Completion budget per rollout, in tokens.")


class ArithmeticEnv(BaseEnv):
    """Asks 'a+b=' and rewards answers containing the sum; uses managed_server (exact tokens)."""

    name = "arithmetic"
    env_config_cls = ArithmeticConfig

    @classmethod
    def config_init(cls):
        return (
            ArithmeticConfig(group_size=4, use_wandb=False, max_token_length=256),
            APIServerConfig(model_name="smollm2", base_url="http://127.0.0.1:9100/v1", api_key="x",
                            server_type="vllm"),
        )

    async def setup(self) -> None:
        self.rng = random.Random(0)
        self.iter = 0

    async def get_next_item(self):
        self.iter += 1
        a, b = self.rng.randint(0, self.config.max_operand), self.rng.randint(0, self.config.max_operand)
        return {"question": f"What is {a}+{b}? Answer with a number.", "answer": a + b}

    async def collect_trajectories(self, item):
        messages = [{"role": "user", "content": item["question"]}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages, n=self.config.group_size, max_tokens=self.config.max_tokens,
                temperature=1.0,
            )
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        for choice, node in zip(completion.choices, nodes, strict=True):
            text = choice.message.content or ""
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(1.0 if str(item["answer"]) in text else -1.0)
            group["messages"].append(messages + [{"role": "assistant", "content": text}])
        return group, []

    async def evaluate(self, *args, **kwargs):
        correct = 0
        for _ in range(4):
            item = await self.get_next_item()
            completion = await self.server.chat_completion(
                messages=[{"role": "user", "content": item["question"]}], n=1,
                max_tokens=self.config.max_tokens, split="eval", temperature=0.0,
            )
            correct += str(item["answer"]) in (completion.choices[0].message.content or "")
        return {"eval/percent_correct": correct / 4}


class SingleRolloutEnv(BaseEnv):
    """Implements collect_trajectory (one rollout) and relies on the default aggregation."""

    name = "single"

    async def setup(self) -> None:
        self.count = 0

    async def get_next_item(self):
        self.count += 1
        return self.count

    async def collect_trajectory(self, item):
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=[{"role": "user", "content": f"Say {item}"}], n=1, max_tokens=8
            )
            node = managed.get_state()["nodes"][0]
        text = completion.choices[0].message.content or ""
        return ScoredDataItem(tokens=node.tokens, masks=node.masked_tokens,
                              inference_logprobs=node.logprobs, scores=float(len(text))), []

    async def evaluate(self, *args, **kwargs):
        return {"eval/dummy": 1.0}


class ChatLengthEnv(BaseEnv):
    """Plain chat completions (works with any OpenAI-compatible server); score = reply length."""

    name = "chat_length"

    @classmethod
    def config_init(cls):
        return (
            BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=512),
            APIServerConfig(model_name="fake", base_url="http://127.0.0.1:9/v1", api_key="x"),
        )

    async def setup(self) -> None:
        self.count = 0

    async def get_next_item(self):
        self.count += 1
        return f"Question number {self.count}?"

    async def collect_trajectories(self, item):
        from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

        messages = [{"role": "user", "content": item}]
        completion = await self.server.chat_completion(
            messages=messages, n=self.config.group_size, max_tokens=32
        )
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for choice in completion.choices:
            chat = messages + [{"role": "assistant", "content": choice.message.content or ""}]
            out = tokenize_for_trainer(self.tokenizer, chat, finish_reason=choice.finish_reason)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(float(len(choice.message.content or "")))
            group["messages"].append(chat)
        return group, []

    async def evaluate(self, *args, **kwargs):
        completion = await self.server.chat_completion(
            messages=[{"role": "user", "content": "eval"}], n=2, max_tokens=8, split="eval"
        )
        lengths = [len(c.message.content or "") for c in completion.choices]
        return {"eval/mean_length": sum(lengths) / len(lengths)}


if __name__ == "__main__":
    import sys

    # `python -m tests.envs.sample_envs ENV_CLASS MODE [flags]`
    globals()[sys.argv.pop(1)].cli()
