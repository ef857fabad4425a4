"""A community env in a nested folder; it imports its sibling data module as
environments.community.word_games.word_list, as community envs of a shared tree do."""

from typing import List, Optional, Tuple

from environments.community.word_games.word_list import WORDS

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item


class WordLengthEnv(BaseEnv):
    name = "word_length"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(tokenizer_name="unused", group_size=2, use_wandb=False,
                                   total_steps=10, batch_size=4, max_token_length=512)
        return env_config, [APIServerConfig(model_name="m", base_url="http://localhost:9001/v1",
                                            api_key="x")]

    async def setup(self):
        self.i = 0

    async def get_next_item(self) -> Item:
        self.i += 1
        return {"word": WORDS[self.i % len(WORDS)]}

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        prompt = f"How many letters are in the word {item['word']}? Reply with the number only.\n"
        completion = await self.server.completion(prompt=prompt, n=self.config.group_size,
                                                  max_tokens=8)
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completion.choices:
            answer_ids = self.tokenizer.encode(choice.text, add_special_tokens=False)
            group["tokens"].append(prompt_ids + answer_ids)
            group["masks"].append([-100] * len(prompt_ids) + answer_ids)
            group["scores"].append(1.0 if choice.text.strip() == str(len(item["word"])) else 0.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    WordLengthEnv.cli()
