"""A local test runner that imports the env by its full dotted path and plays one group
against an OpenAI-compatible server given on the command line (no trajectory API)."""

import asyncio
import sys

from environments.community.word_games.word_length_env import WordLengthEnv

from atroposlib.envs.base import APIServerConfig


async def main(base_url: str, tokenizer_name: str) -> None:
    env_config, _ = WordLengthEnv.config_init()
    env_config.tokenizer_name = tokenizer_name
    server = APIServerConfig(model_name="m", base_url=base_url, api_key="x", health_check=False)
    env = WordLengthEnv(config=env_config, server_configs=[server], slurm=False, testing=False)
    await env.setup()
    item = await env.get_next_item()
    group, _ = await env.collect_trajectories(item)
    print(item["word"], group["scores"])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
