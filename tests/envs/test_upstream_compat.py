"""An env written the Atropos 0.4 way (gsm8k idioms) runs unchanged on atroposlib."""

from __future__ import annotations

import json
import random
import re

from atroposlib.envs.base import (  # the exact upstream import surface
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    EvalHandlingEnum,
    OpenaiConfig,
    ScoredDataGroup,
)
from atroposlib.envs.checks import check_env
from atroposlib.testing.fake_server import FakeServer
from atroposlib.type_definitions import Item, number

assert OpenaiConfig is APIServerConfig


class UpstreamStyleEnv(BaseEnv):
    name = "upstream_style"

    def __init__(self, config, server_configs, slurm=False, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer: list[float] = []
        self.eval_metrics: list[tuple[str, float]] = []

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="unused", group_size=4, use_wandb=False, total_steps=1000, batch_size=12,
            steps_per_eval=100, max_token_length=2048, wandb_name="upstream_style",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
        )
        server_configs = [APIServerConfig(model_name="fake", base_url="http://localhost:9001/v1",
                                          api_key="x", num_requests_for_eval=256)]
        return env_config, server_configs

    async def setup(self):
        self.train = [{"question": f"{i}+{i}", "gold_answer": str(2 * i)} for i in range(20)]
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        if data is None:
            data = {"iter": self.iter}
        super().save_checkpoint(step, data)

    async def get_next_item(self) -> Item:
        item = self.train[self.iter % len(self.train)]
        self.iter += 1
        return item

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=[{"role": "system", "content": "Answer."},
                          {"role": "user", "content": item["question"]}],
                n=self.config.group_size, max_tokens=self.config.max_token_length, temperature=1.0,
            )
            state = managed.get_state()
            nodes = state["nodes"]
        to_score = []
        for choice, node in zip(completion.choices, nodes, strict=True):
            to_score.append({"text": choice.message.content, "tokens": node.tokens,
                             "masks": node.masked_tokens, "logprobs": node.logprobs,
                             "finish_reason": choice.finish_reason})
        return await self.score(to_score, item["gold_answer"]), []

    async def score(self, rollouts, gold) -> ScoredDataGroup | None:
        scores = ScoredDataGroup()
        scores["tokens"], scores["masks"], scores["scores"], scores["inference_logprobs"] = [], [], [], []
        random.shuffle(rollouts)
        for rollout in rollouts:
            reward: number = 1.0 if gold in rollout["text"] else -1.0
            scores["tokens"].append(rollout["tokens"])
            scores["masks"].append(rollout["masks"])
            scores["inference_logprobs"].append(rollout["logprobs"])
            scores["scores"].append(reward)
            self.percent_correct_buffer.append(max(reward, 0))
        if all(s == scores["scores"][0] for s in scores["scores"]):
            return None
        return scores

    async def evaluate(self, *args, **kwargs):
        completion = await self.server.chat_completion(
            messages=[{"role": "user", "content": "1+1"}], n=1, max_tokens=16, split="eval")
        correct = float("2" in completion.choices[0].message.content)
        self.eval_metrics.append(("eval/percent_correct", correct))
        self.evaluate_log(metrics={"eval/percent_correct": correct},
                          samples=[{"question": "1+1", "score": correct}],
                          start_time=0.0, end_time=1.0, generation_parameters={"temperature": 0.0})
        return {"eval/percent_correct": correct}

    async def wandb_log(self, wandb_metrics: dict | None = None):
        wandb_metrics = wandb_metrics or {}
        if self.percent_correct_buffer:
            wandb_metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(
                self.percent_correct_buffer)
        self.percent_correct_buffer = []
        await super().wandb_log(wandb_metrics)


def _script(request):
    # Choice 0 answers correctly (2a for "a+a"), the others do not. Managed mode sends token
    # ids, so the question is read from the rendered prompt text.
    a = int(re.findall(r"(\d+)\+\1", request.prompt)[-1])
    return f"The answer is {2 * a}." if request.index == 0 else "I do not know."


async def test_upstream_style_env_passes_check_env(tiny_tokenizer_dir):
    groups = await check_env(UpstreamStyleEnv, server=FakeServer(_script),
                             config_overrides={"tokenizer_name": str(tiny_tokenizer_dir)},
                             num_groups=3)
    assert all(sorted(g["scores"]) == [-1.0, -1.0, -1.0, 1.0] for g in groups)


async def test_upstream_style_env_evaluate_log_and_process(tiny_tokenizer_dir, tmp_path):
    config, _ = UpstreamStyleEnv.config_init()
    config = config.model_copy(update={
        "tokenizer_name": str(tiny_tokenizer_dir), "data_dir_to_save_evals": str(tmp_path / "ev"),
        "data_path_to_save_groups": str(tmp_path / "g.jsonl"), "total_steps": 2})
    env = UpstreamStyleEnv(config, [FakeServer(_script)])
    assert await env.evaluate() == {"eval/percent_correct": 1.0}
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["results"]["atropos|upstream_style|0"] == {"eval/percent_correct": 1.0}
    assert metrics["config_general"]["generation_parameters"] == {"temperature": 0.0,
                                                                  "max_new_tokens": 2048}
    assert json.loads((tmp_path / "ev" / "samples.jsonl").read_text())["score"] == 1.0
    env2 = UpstreamStyleEnv(config, [FakeServer(_script)])
    await env2.process_manager(show_progress=False)
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 2
    env2.checkpoint_dir = str(tmp_path / "ck")
    env2.save_checkpoint(5)
    assert json.loads((tmp_path / "ck/env_checkpoints/upstream_style/step-5.json").read_text()) == {
        "iter": env2.iter}
