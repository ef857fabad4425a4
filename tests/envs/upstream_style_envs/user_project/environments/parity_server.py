"""A top-level env of a user's environments/ tree; it imports a helper from a sibling folder
by its full dotted path (environments.eval_environments...), as the project is laid out."""

from typing import List, Optional, Tuple

from environments.eval_environments.eval_helpers import ANSWER_PROMPT, extract_answer

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class ParityEnv(BaseEnv):
    name = "parity"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(tokenizer_name="unused", group_size=4, use_wandb=False,
                                   total_steps=10, batch_size=8, max_token_length=512)
        return env_config, [APIServerConfig(model_name="m", base_url="http://localhost:9001/v1",
                                            api_key="x")]

    async def setup(self):
        self.n = 0

    async def get_next_item(self) -> Item:
        self.n += 1
        return {"number": 7 * self.n + 2}

    def answer(self, item: Item) -> str:
        return "even" if item["number"] % 2 == 0 else "odd"

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        messages = [{"role": "system", "content": ANSWER_PROMPT},
                    {"role": "user", "content": f"Is {item['number']} even or odd?"}]
        completion = await self.server.chat_completion(messages=messages, n=self.config.group_size)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completion.choices:
            text = choice.message.content
            out = tokenize_for_trainer(self.tokenizer, messages + [{"role": "assistant", "content": text}])
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if extract_answer(text) == self.answer(item) else -1.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ParityEnv.cli()
