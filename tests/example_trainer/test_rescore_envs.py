"""`atropos-replay rescore` for every kind of env: the item is put on each group on delivery (a
`collect_trajectory` env, the `process` runner, an env overriding `handle_send_to_api`), a
MultiTurnEnv is scored again from its recorded transcripts, and an env in Atropos 0.4's idiom
through its own `score(rollout_group_data)`. Runs are recorded through a real run-api into
replay bundles (the `record` helper of the SingleTurnEnv tests)."""

from __future__ import annotations

import asyncio
import json
import random
import re

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup, ScoredDataItem
from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig
from atroposlib.testing.fake_server import FakeServer
from example_trainer.replay_cli import main
from tests.example_trainer.test_rescore import ITEMS, _groups, record

HERE = "tests.example_trainer.test_rescore_envs"


def _question(item):
    return f"What is {item['a']} + {item['b']}?"


def _last_number(text):
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


# ------------------------------------------------------- a collect_trajectory env (one rollout)
class OneRolloutEnv(BaseEnv):
    """Atropos 0.4's other idiom: collect_trajectory scores one reply; no score(), no messages."""

    name = "one_rollout"

    async def get_next_item(self):
        return ITEMS[0]

    async def collect_trajectory(self, item):
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.chat_completion(messages=[{"role": "user", "content": _question(item)}],
                                          n=1, max_tokens=64)
            node = managed.get_state()["nodes"][0]
        text = self.tokenizer.decode([t for t, m in zip(node.tokens, node.masked_tokens, strict=True) if m != -100],
                                     skip_special_tokens=True)
        score = 1.0 if _last_number(text) == item["a"] + item["b"] else 0.0
        return ScoredDataItem(tokens=node.tokens, masks=node.masked_tokens, scores=score), []

    async def evaluate(self, *args, **kwargs):
        return None


class RescorableOneRolloutEnv(OneRolloutEnv):
    """The same env with the documented hook: its scorer on the decoded trained tokens."""

    async def rescore_group(self, item, group):
        from atroposlib.envs.rescoring import reply_text

        return [1.0 if _last_number(reply_text(self, group, i)) == item["a"] + item["b"] else 0.0
                for i in range(len(group["tokens"]))]


class StrictOneRolloutEnv(RescorableOneRolloutEnv):
    async def rescore_group(self, item, group):
        from atroposlib.envs.rescoring import reply_text

        return [1.0 if reply_text(self, group, i).strip() == str(item["a"] + item["b"]) else 0.0
                for i in range(len(group["tokens"]))]


class MiscountingOneRolloutEnv(OneRolloutEnv):
    async def rescore_group(self, item, group):
        return [1.0]


def _counting_reply():
    """Replies by call order (n=1 calls of concurrent rollouts), the same four as ``reply``."""
    calls = iter(range(10**6))

    def answer(req):
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", req.prompt)[-1])
        return [str(a + b), f"{a} + {b} = {a + b}", f"{a} + {b} = {a + b + 1}", "no idea"][next(calls) % 4]

    return answer


def test_a_collect_trajectory_env_gets_its_item_on_delivery_and_says_what_to_implement(
        tiny_tokenizer_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("tests.example_trainer.test_rescore.reply", _counting_reply())
    run = record(OneRolloutEnv, tiny_tokenizer_dir, tmp_path / "run", max_token_length=512)
    groups = _groups(run, 1) + _groups(run, 2)
    assert [g["item"] for g in groups] == ITEMS
    assert all(sorted(g["scores"]) == [0.0, 0.0, 1.0, 1.0] for g in groups)
    tok = f"tokenizer_name={tiny_tokenizer_dir}"
    assert main(["rescore", str(run), "--env", f"{HERE}:OneRolloutEnv", "--set", tok]) == 2
    err = capsys.readouterr().err
    assert "OneRolloutEnv has no scorer rescore knows how to call" in err
    assert "implement OneRolloutEnv.rescore_group(item, group)" in err
    assert main(["rescore", str(run), "--env", f"{HERE}:RescorableOneRolloutEnv", "--set", tok]) == 0
    assert main(["rescore", str(run), "--env", f"{HERE}:StrictOneRolloutEnv", "--set", tok]) == 1
    assert "4 of 16 score(s) changed" in capsys.readouterr().out  # "a + b = a+b" now 0
    assert main(["rescore", str(run), "--env", f"{HERE}:MiscountingOneRolloutEnv", "--set", tok]) == 2
    assert "rescore_group returned 1 score(s) for a group of 4" in capsys.readouterr().err


def test_process_mode_and_a_handle_send_to_api_override_record_the_item(tiny_tokenizer, tmp_path):
    from tests.fixtures.sample_envs import ChatLengthEnv

    class Tagging(ChatLengthEnv):
        async def handle_send_to_api(self, scored_data, item=None, do_send_to_api=True,
                                     abort_on_any_max_length_exceeded=True):
            assert all(g["item"] == item for g in scored_data)  # recorded before the override runs
            return await super().handle_send_to_api(scored_data, item, do_send_to_api,
                                                     abort_on_any_max_length_exceeded)

    for cls, record_items in ((ChatLengthEnv, True), (Tagging, True), (ChatLengthEnv, False)):
        path = tmp_path / f"{cls.__name__}-{record_items}.jsonl"
        config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=3, record_items=record_items,
                               ensure_scores_are_not_same=False, data_path_to_save_groups=str(path))
        env = cls(config, [FakeServer()])
        env.tokenizer = tiny_tokenizer
        items = []
        original = env.get_next_item

        async def next_item(original=original, items=items):
            items.append(await original())
            return items[-1]

        env.get_next_item = next_item
        assert asyncio.run(env.process_manager(show_progress=False)) == path
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(rows) == 3
        if record_items:
            assert [r["item"] for r in rows] == json.loads(json.dumps(items))
        else:
            assert all("item" not in r for r in rows)


# ------------------------------------------------------------------------ a multi-turn env
class ToolSumConfig(MultiTurnEnvConfig):
    tool_bonus: float = Field(default=0.0, description="Added to a correct answer that used the tool.")


class ToolSumEnv(MultiTurnEnv):
    """What is a + b, with an `add` tool; the reward follows from the transcript (score_episode)."""

    name = "tool_sum"
    env_config_cls = ToolSumConfig

    async def play_episode(self, item, *, temperature, split):
        def on_reply(text, _turn):
            if text.startswith("add("):
                return [{"role": "user", "content": f"tool result: {item['a'] + item['b']}"}]
            return None

        episode = await self.converse([{"role": "user", "content": _question(item)}], on_reply,
                                      temperature=temperature, split=split)
        return episode, await self.score_episode(item, episode.messages), {}

    async def score_episode(self, item, messages):
        answer = _last_number([m for m in messages if m["role"] == "assistant"][-1]["content"])
        used_tool = any(m["content"].startswith("tool result:") for m in messages)
        if answer != item["a"] + item["b"]:
            return 0.0
        return 1.0 + (self.config.tool_bonus if used_tool else 0.0)


class LiveStateToolSumEnv(ToolSumEnv):
    """The same episodes, with the reward kept in play_episode's own state (no score_episode)."""

    score_episode = MultiTurnEnv.score_episode

    async def play_episode(self, item, *, temperature, split):
        episode = await self.converse([{"role": "user", "content": _question(item)}],
                                      lambda _t, _i: None, temperature=temperature, split=split)
        return episode, 1.0, {}


def _tool_reply():
    """First turns by call order: a tool call, the sum, a wrong sum, no number; after a tool
    result, the number it gave."""
    first = iter(range(10**6))

    def answer(req):
        results = re.findall(r"tool result: (\d+)", req.prompt)  # a later turn's prompt
        if results:
            return results[-1]
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", req.prompt)[-1])
        return [f"add({a}, {b})", str(a + b), str(a + b + 1), "no idea"][next(first) % 4]

    return answer


def test_a_multi_turn_env_is_rescored_from_its_transcripts(tiny_tokenizer_dir, tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.setattr("tests.example_trainer.test_rescore.reply", _tool_reply())
    run = record(ToolSumEnv, tiny_tokenizer_dir, tmp_path / "run")
    groups = _groups(run, 1) + _groups(run, 2)
    assert [g["item"] for g in groups] == ITEMS
    assert all(sorted(g["scores"]) == [0.0, 0.0, 1.0, 1.0] for g in groups)
    assert main(["rescore", str(run), "--env", f"{HERE}:ToolSumEnv"]) == 0
    out = tmp_path / "report.json"
    assert main(["rescore", str(run), "--env", f"{HERE}:ToolSumEnv", "--set", "tool_bonus=0.5",
                 "--json", str(out)]) == 1
    # exactly the members whose transcript used the tool: 1.0 -> 1.5
    expected = [{"step": step, "group": g, "member": i, "rollout_id": group["rollout_ids"][i],
                 "old": 1.0, "new": 1.5, "error": None}
                for step in (1, 2) for g, group in enumerate(_groups(run, step))
                for i, messages in enumerate(group["messages"])
                if any(m["content"].startswith("tool result:") for m in messages)]
    assert len(expected) == 4 and json.loads(out.read_text())["changed"] == expected
    capsys.readouterr()
    # a multi-turn env whose reward comes from live state: bad input, naming the hook
    assert main(["rescore", str(run), "--env", f"{HERE}:LiveStateToolSumEnv"]) == 2
    assert "implement LiveStateToolSumEnv.score_episode(item, messages)" in capsys.readouterr().err


# ------------------------------------------------------------ an env in Atropos 0.4's idiom
class UpstreamSumEnv(BaseEnv):
    """collect_trajectories builds per-member dicts (messages + the item's fields + tokens) and
    returns ``await self.score(to_score)``, which shuffles and may drop members."""

    name = "upstream_sum"

    @classmethod
    def config_init(cls):
        from atroposlib.envs.base import APIServerConfig

        return BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=512), [
            APIServerConfig(model_name="m", base_url="http://127.0.0.1:9001/v1", api_key="x")]

    async def get_next_item(self):
        return ITEMS[0]

    async def collect_trajectories(self, item):
        question = {"role": "user", "content": _question(item)}
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=[question], n=self.config.group_size,
                                                       max_tokens=64)
            nodes = managed.get_state()["nodes"]
        to_score = []
        for choice, node in zip(completion.choices, nodes, strict=True):
            to_score.append({"messages": (question, {"role": "assistant", "content": choice.message.content}),
                             "a": item["a"], "b": item["b"], "finish_reason": choice.finish_reason,
                             "tokens": node.tokens, "masks": node.masked_tokens, "logprobs": node.logprobs})
        return await self.score(to_score), []

    def reward(self, data, reply_text):
        return 1.0 if _last_number(reply_text) == data["a"] + data["b"] else -1.0

    async def score(self, rollout_group_data):
        scores = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[])
        random.shuffle(rollout_group_data)
        for data in rollout_group_data:
            if len([m for m in data["masks"] if m != -100]) < 1:
                continue  # remove obviously bad examples
            scores["tokens"].append(data["tokens"])
            scores["masks"].append(data["masks"])
            scores["inference_logprobs"].append(data["logprobs"])
            scores["scores"].append(self.reward(data, data["messages"][-1]["content"]))
        return scores

    async def evaluate(self, *args, **kwargs):
        return None


class StrictUpstreamSumEnv(UpstreamSumEnv):
    def reward(self, data, reply_text):
        return 1.0 if reply_text.strip() == str(data["a"] + data["b"]) else -1.0


class GoldAnswerUpstreamEnv(UpstreamSumEnv):
    """score() reads a key collect_trajectories computed, which the record does not hold."""

    def reward(self, data, reply_text):
        return 1.0 if reply_text.strip() == data["gold_answer"] else -1.0


def test_an_upstream_style_env_is_rescored_through_its_score(tiny_tokenizer_dir, tmp_path, capsys):
    run = record(UpstreamSumEnv, tiny_tokenizer_dir, tmp_path / "run")
    groups = _groups(run, 1) + _groups(run, 2)
    assert [g["item"] for g in groups] == ITEMS and all(g.get("messages") is None for g in groups)
    assert all(sorted(g["scores"]) == [-1.0, -1.0, 1.0, 1.0] for g in groups)
    tok = f"tokenizer_name={tiny_tokenizer_dir}"
    assert main(["rescore", str(run), "--env", f"{HERE}:UpstreamSumEnv", "--set", tok]) == 0
    out = tmp_path / "report.json"
    assert main(["rescore", str(run), "--env", f"{HERE}:StrictUpstreamSumEnv", "--set", tok,
                 "--json", str(out)]) == 1
    # the members whose reply is "a + b = a+b" (score shuffled them; matched back by tokens)
    changed = json.loads(out.read_text())["changed"]
    assert len(changed) == 4 and all(c["old"] == 1.0 and c["new"] == -1.0 for c in changed)
    for c in changed:
        group = _groups(run, c["step"])[c["group"]]
        item = group["item"]
        assert c["rollout_id"] is None  # the idiom sends groups without rollout ids
        assert f"{item['a']} + {item['b']} = {item['a'] + item['b']}" in reply_of(
            tiny_tokenizer_dir, group, c["member"])
    capsys.readouterr()
    assert main(["rescore", str(run), "--env", f"{HERE}:GoldAnswerUpstreamEnv", "--set", tok]) == 2
    err = capsys.readouterr().err
    assert "GoldAnswerUpstreamEnv.score() looked up 'gold_answer'" in err
    assert "implement GoldAnswerUpstreamEnv.rescore_group(item, group)" in err


def reply_of(tok_dir, group, i):
    from atroposlib.utils.hf_tokenizer import load_tokenizer

    tok = load_tokenizer(str(tok_dir))
    return tok.decode([t for t, m in zip(group["tokens"][i], group["masks"][i], strict=True) if m != -100],
                      skip_special_tokens=True)


async def test_serve_mode_sends_the_item_with_each_group(tiny_tokenizer, tmp_path):
    from atroposlib.env_runtime.serve import ServeLoop
    from tests.fixtures.api_server import registered_trainer, start_run_api
    from tests.fixtures.sample_envs import ChatLengthEnv

    api = start_run_api()
    try:
        trainer = await registered_trainer(api.url, 2, str(tmp_path), num_steps=100, save_checkpoint_interval=-1)
        config = BaseEnvConfig(group_size=2, use_wandb=False, rollout_server_url=api.url, total_steps=1000)
        env = ChatLengthEnv(config, [FakeServer(lambda r: "short" if r.index % 2 else "a longer reply")])
        env.tokenizer = tiny_tokenizer
        loop = ServeLoop(env, status_interval=0.2)
        serving = asyncio.create_task(loop.run())
        groups = []
        async with asyncio.timeout(30):
            while len(groups) < 2:
                groups += await trainer.get_batch() or []
                await asyncio.sleep(0.05)
        loop.stop_event.set()
        await serving
        await trainer.aclose()
    finally:
        api.stop()
    # the item each group was sampled for (ChatLengthEnv's items are its questions)
    assert all(g["item"] == g["messages"][0][0]["content"] for g in groups)
