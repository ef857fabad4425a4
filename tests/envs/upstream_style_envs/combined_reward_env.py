"""Rewards from the registry (a CombinedReward of format + a custom one), OpenaiConfig alias."""

from typing import List, Optional, Tuple

from atroposlib.envs.reward_fns import CombinedReward, RewardFunction, registry
from atroposlib.envs.server_handling.server_baseline import ReasoningConfig

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, OpenaiConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


@registry.register(name="mentions_color")
class MentionsColor(RewardFunction):
    def compute(self, completions, **kwargs):
        return [1.0 if kwargs["color"] in str(c) else 0.0 for c in completions]


class CombinedRewardEnv(BaseEnv):
    name = "combined_reward"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[OpenaiConfig]]:
        env_config = BaseEnvConfig(tokenizer_name="unused", group_size=4, use_wandb=False,
                                   total_steps=10, batch_size=8, max_token_length=512)
        return env_config, [OpenaiConfig(model_name="m", base_url="http://localhost:9001/v1",
                                         api_key="x")]

    async def setup(self):
        self.reward = CombinedReward(rewards=[{"type": "format", "preferred_tags": ["answer"]},
                                              "mentions_color"], normalization="sum")
        self.reasoning = ReasoningConfig(enabled=False)
        self.colors = ["red", "green", "blue"]
        self.k = 0

    async def get_next_item(self) -> Item:
        self.k += 1
        return {"color": self.colors[self.k % 3]}

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        assert not self.reasoning.is_reasoning_kwargs_active()
        messages = [{"role": "user", "content": f"Name the color {item['color']} in <answer>."}]
        completion = await self.server.chat_completion(messages=messages, n=self.config.group_size)
        texts = [c.message.content for c in completion.choices]
        scores = self.reward(texts, color=item["color"])
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for text, score in zip(texts, scores):
            out = tokenize_for_trainer(self.tokenizer, messages + [{"role": "assistant", "content": text}])
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(score)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    CombinedRewardEnv.cli()
