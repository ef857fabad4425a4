"""One rollout at a time (collect_trajectory -> ScoredDataItem) scored with parse_tool_call."""

import json
from typing import List, Optional, Tuple

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    EvalHandlingEnum,
    ScoredDataItem,
)
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atroposlib.utils.tool_call_parser import parse_tool_call

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


class ToolCallItemConfig(BaseEnvConfig):
    max_gen_per_turn: int = 256


class ToolCallItemEnv(BaseEnv):
    name = "tool_call_item"
    env_config_cls = ToolCallItemConfig

    @classmethod
    def config_init(cls) -> Tuple[ToolCallItemConfig, List[APIServerConfig]]:
        env_config = ToolCallItemConfig(
            tokenizer_name="unused", group_size=3, use_wandb=False, total_steps=10, batch_size=6,
            max_token_length=512, eval_handling=EvalHandlingEnum.LIMIT_TRAIN, start_tok_length=8,
        )
        return env_config, [APIServerConfig(model_name="m", base_url="http://localhost:9001/v1",
                                            api_key="x")]

    async def setup(self):
        self.cities = ["Paris", "Lima", "Oslo"]
        self.i = 0

    async def get_next_item(self) -> Item:
        self.i += 1
        return {"city": self.cities[self.i % len(self.cities)]}

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        messages = [{"role": "system", "content": "Tools: " + json.dumps(TOOLS)},
                    {"role": "user", "content": f"Weather in {item['city']}?"}]
        completion = await self.server.chat_completion(
            messages=messages, n=1, max_tokens=self.config.max_gen_per_turn)
        text = completion.choices[0].message.content
        name, args, is_error = parse_tool_call(text, TOOLS, ["tool_call"])
        reward = 1.0 if not is_error and args.get("city") == item["city"] else -1.0
        out = tokenize_for_trainer(self.tokenizer, messages + [{"role": "assistant", "content": text}])
        return ScoredDataItem(tokens=out["tokens"], masks=out["masks"], scores=reward), []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ToolCallItemEnv.cli()
