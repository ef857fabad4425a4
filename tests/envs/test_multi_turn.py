"""MultiTurnEnv: episodes as rollouts, details as metrics, evaluate with failed episodes."""

from __future__ import annotations

import pytest

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.env_runtime.checks import check_env
from atroposlib.envs import MultiTurnEnv
from atroposlib.testing.fake_server import FakeServer
from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_tokenizer_multi_turn")
    make_tiny_tokenizer(path)
    return str(path)


class GuessEnv(MultiTurnEnv):
    """Guess the number: the env answers "higher"/"lower" until the guess is right."""

    name = "guess"
    config_defaults = {"max_turns": 3}

    async def setup(self):
        self.train_items = [{"answer": n} for n in (3, 5, 7)]
        self.eval_items = [{"answer": n} for n in (1, 2, 3, 4)]

    async def play_episode(self, item, *, temperature, split):
        if item["answer"] == 4:
            raise RuntimeError("board broken")
        state = {"guesses": 0, "right": False}

        def on_reply(text, _turn):
            state["guesses"] += 1
            guess = int(text) if text.strip().isdigit() else -1
            if guess == item["answer"]:
                state["right"] = True
                return None
            return [{"role": "user", "content": "higher" if guess < item["answer"] else "lower"}]

        messages = [{"role": "user", "content": "Guess my number (1-9)."}]
        episode = await self.converse(messages, on_reply, temperature=temperature, split=split)
        return episode, float(state["right"]), {"guesses": state["guesses"]}


def _counting_reply(req):
    # guesses 1, 2, 3, ... : one more each turn (turns = assistant messages so far + 1)
    return str(req.prompt.count("<|im_start|>assistant"))


async def test_episodes_train_every_turn_and_details_become_metrics(tok_dir, tmp_path, monkeypatch):
    groups = await check_env(GuessEnv, FakeServer(_counting_reply),
                             {"tokenizer_name": tok_dir, "group_size": 2}, num_groups=1)
    assert groups[0]["scores"] == [1.0, 1.0]  # guesses 1, 2, 3 reach the answer 3
    config, _ = GuessEnv.config_init()
    assert config.max_turns == 3
    env = GuessEnv(GuessEnv.env_config_cls(**{**config.model_dump(), "tokenizer_name": tok_dir,
                                              "group_size": 2,
                                              "data_dir_to_save_evals": str(tmp_path)}),
                   [FakeServer(_counting_reply)])
    await env.setup()
    group, _ = await env.collect_trajectories(await env.get_next_item())
    assert group["scores"] == [1.0, 1.0]
    trained = env.tokenizer.decode([t for t, m in zip(group["tokens"][0], group["masks"][0], strict=True)
                                    if m != IGNORE_INDEX])
    assert trained == "1<|im_end|>2<|im_end|>3<|im_end|>"  # every turn, not the env's replies
    metrics = await env.evaluate()
    assert metrics["eval/failed_items"] == 1.0 and metrics["eval/num_items"] == 3.0
    assert metrics["eval/accuracy"] == 1.0 and metrics["eval/guesses"] == pytest.approx(2.0)
    seen = {}

    async def fake_base_log(self, metrics=None):
        seen.update(metrics or {})

    monkeypatch.setattr("atroposlib.envs.base.BaseEnv.wandb_log", fake_base_log)
    await env.wandb_log({})
    assert seen["train/guesses"] == 3.0 and seen["train/percent_correct"] == 1.0
    group, _ = await env.collect_trajectories(await env.get_next_item())  # 5: out of turns
    assert group["scores"] == [0.0, 0.0]


async def test_answer_to_the_last_allowed_turn_is_not_in_the_messages(tok_dir):
    """At max_turns the env's answer to the last turn is never sampled against: it is not in the
    tokens, so it must not be in the messages either (they must describe the same sequence)."""
    env = GuessEnv(GuessEnv.env_config_cls(tokenizer_name=tok_dir, group_size=1, max_turns=3),
                   [FakeServer(_counting_reply)])
    await env.setup()
    episode, score, details = await env.play_episode({"answer": 7}, temperature=1.0, split="train")
    assert episode.truncated and score == 0.0 and details == {"guesses": 3}  # on_reply saw all 3
    roles = [m["role"] for m in episode.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    masked = env.tokenizer.decode([t for t, m in zip(episode.node.tokens, episode.node.masked_tokens,
                                                     strict=True) if m == IGNORE_INDEX])
    assert all(m["content"] in masked for m in episode.messages if m["role"] == "user")
    solved, _, _ = await env.play_episode({"answer": 3}, temperature=1.0, split="train")
    assert not solved.truncated and solved.turns == 3
