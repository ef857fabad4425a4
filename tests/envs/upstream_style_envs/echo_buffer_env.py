"""Plain (unmanaged) chat completions, tokenize_for_trainer, and undeclared config fields."""

import random
from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "willow"]


class EchoBufferEnv(BaseEnv):
    name = "echo_buffer"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        # score_buffer_size / dataset_path are not BaseEnvConfig fields: old envs pass them anyway.
        env_config = BaseEnvConfig(
            tokenizer_name="unused", group_size=4, use_wandb=False, total_steps=10,
            batch_size=8, max_token_length=512, wandb_name="echo_buffer",
            score_buffer_size=16, dataset_path="generated",
        )
        return env_config, [APIServerConfig(model_name="m", base_url="http://localhost:9001/v1",
                                            api_key="x", num_requests_for_eval=4)]

    async def setup(self):
        self.rng = random.Random(self.config.score_buffer_size)
        self.scores_seen: List[float] = []

    async def get_next_item(self) -> Item:
        return {"word": self.rng.choice(WORDS)}

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        messages = [{"role": "user", "content": f"Repeat the word {item['word']}."}]
        completion = await self.server.chat_completion(
            messages=messages, n=self.config.group_size, max_tokens=32)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completion.choices:
            chat = messages + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat, finish_reason=choice.finish_reason)
            score = 1.0 if item["word"] in choice.message.content else -1.0
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(score)
            self.scores_seen = (self.scores_seen + [score])[-self.config.score_buffer_size:]
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    EchoBufferEnv.cli()
