"""Managed server through ManagedServerAdapter, best-of-n selection, trimmed thinking."""

from typing import List, Optional, Tuple

from atroposlib.envs.server_handling.managed_server import ManagedServerAdapter

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.best_of_n_selection import select_best_index
from atroposlib.utils.message_history_utils import ensure_trajectory_token_limit, truncate_thinking


class BestOfNManagedEnv(BaseEnv):
    name = "best_of_n_managed"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = BaseEnvConfig(tokenizer_name="unused", group_size=4, use_wandb=False,
                                   total_steps=10, batch_size=8, max_token_length=1024)
        return env_config, [APIServerConfig(model_name="m", base_url="http://localhost:9001/v1",
                                            api_key="x")]

    async def setup(self):
        self.n = 0
        self.best_lengths: List[int] = []

    async def get_next_item(self) -> Item:
        self.n += 1
        return {"a": self.n, "b": 2 * self.n}

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        question = f"What is {item['a']} + {item['b']}?"
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            client = ManagedServerAdapter(managed)
            completion = await client.chat.completions.create(
                messages=[{"role": "user", "content": question}],
                n=self.config.group_size, max_tokens=256)
            nodes = managed.get_state()["nodes"]
        gold = str(item["a"] + item["b"])
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for choice, node in zip(completion.choices, nodes):
            reply = truncate_thinking(choice.message.content, self.tokenizer, 16)
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["scores"].append(1.0 if gold in reply else -1.0)
            group["messages"].append([{"role": "user", "content": question},
                                      {"role": "assistant", "content": reply}])
        best = select_best_index(group["scores"], [len(t) for t in group["tokens"]])
        self.best_lengths.append(len(group["tokens"][best]))
        kept = ensure_trajectory_token_limit([group], self.tokenizer, self.config.max_token_length)
        return (kept[0] if kept else None), []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    BestOfNManagedEnv.cli()
