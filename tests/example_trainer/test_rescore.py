"""`atropos-replay rescore`: a SingleTurnEnv's groups carry their items through a real run-api into
replay bundles, and an env whose scorer changed reports exactly the members whose score changed."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from pydantic import Field

from atroposlib.api.client import AtroposClient
from atroposlib.api.models import Registration
from atroposlib.env_runtime.delivery import deliver_groups
from atroposlib.envs import SingleTurnEnv
from atroposlib.envs.groups import check_groups, record_item
from atroposlib.envs.single_turn import SingleTurnEnvConfig
from atroposlib.testing.fake_server import FakeServer
from example_trainer.bundles import read_bundle, write_bundle
from example_trainer.replay_cli import main
from tests.fixtures.api_server import start_run_api

ITEMS = [{"a": 57, "b": 12}, {"a": 3, "b": 4}, {"a": 20, "b": 22}, {"a": 9, "b": 90}]
HERE = "tests.example_trainer.test_rescore"


class SumConfig(SingleTurnEnvConfig):
    """SingleTurnEnvConfig plus the scorer's one setting."""

    partial_credit: float = Field(default=0.0, ge=0, le=1,
                                  description="Score of a reply whose last number is wrong.")


class SumEnv(SingleTurnEnv):
    """What is a + b? 1 when the reply's last number is the sum, partial_credit for another number."""

    name = "sum"
    env_config_cls = SumConfig

    def prompt(self, item):
        return [{"role": "user", "content": f"What is {item['a']} + {item['b']}?"}]

    def score(self, item, completion):
        numbers = re.findall(r"-?\d+", completion)
        if numbers and int(numbers[-1]) == item["a"] + item["b"]:
            return 1.0
        return self.config.partial_credit if numbers else 0.0


class StrictSumEnv(SumEnv):
    """The scorer changed: the reply must be the sum alone."""

    def score(self, item, completion):
        return 1.0 if completion.strip() == str(item["a"] + item["b"]) else 0.0


class BrokenSumEnv(SumEnv):
    """A scorer that raises."""

    def score(self, item, completion):
        raise RuntimeError("the scorer broke")


class SetUpSumEnv(SumEnv):
    """A scorer that uses what setup() builds (rescore runs setup only with --setup)."""

    async def setup(self):
        self.bonus = 0.0

    def score(self, item, completion):
        return super().score(item, completion) + self.bonus


class TokenOnlySumEnv(SumEnv):
    """Groups without messages: rescore decodes the trained tokens."""

    send_messages = False


class CutOffSumEnv(TokenOnlySumEnv):
    """A reply cut off at the budget scores -1 without being scored."""

    truncated_reward = -1.0


def reply(req):
    """Per item, replies by index: the sum, the sum after working, a wrong sum, no number."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", req.prompt)[-1])
    return [str(a + b), f"{a} + {b} = {a + b}", f"{a} + {b} = {a + b + 1}", "no idea"][req.index % 4]


def record(cls, tok_dir, run_dir, db=None, **config):
    """Sample a group of 4 per item with ``cls``, post them to a real run-api, and write each
    served batch of 8 as a replay bundle (as the trainer does: the batch as GET /batch served it)."""
    defaults, _ = cls.config_init()
    settings = {**defaults.model_dump(), "tokenizer_name": str(tok_dir), "group_size": 4, **config}
    env = cls(cls.env_config_cls(**settings), [FakeServer(reply)])
    api = start_run_api(db=db)
    try:
        with AtroposClient(api.url) as client:
            client.register(Registration(
                wandb_group="g", wandb_project="p", batch_size=8, max_token_len=512,
                checkpoint_dir="ck", save_checkpoint_interval=-1, starting_step=0, num_steps=10))
            for item in ITEMS:
                group, _ = asyncio.run(env.collect_trajectories(item))
                # the runners' path: checked, then delivered (which puts the item on the group)
                checked = check_groups(group, 4, False, -1, env.stats)
                (group,) = asyncio.run(deliver_groups(env, checked, item, send_to_api=False))
                client.post_scored_data(group)
            step = 0
            while batch := client.get_batch():
                step += 1
                write_bundle(run_dir, step, {"batch": batch, "dropped": [], "skipped": False}, {})
    finally:
        api.stop()
    assert step == 2
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_tokenizer_dir):
    return record(SumEnv, tiny_tokenizer_dir, tmp_path_factory.mktemp("rescore") / "run",
                  db=tmp_path_factory.mktemp("db") / "queue.db")


def _groups(run_dir, step):
    return read_bundle(run_dir, step).header["batch"]


def test_groups_carry_their_item_through_run_api_into_the_bundles(run):
    groups = _groups(run, 1) + _groups(run, 2)
    assert [g["item"] for g in groups] == ITEMS
    assert all(g["scores"] == [1.0, 1.0, 0.0, 0.0] for g in groups)
    assert all(len(g["rollout_ids"]) == 4 for g in groups)


def test_the_same_scorer_changes_nothing(run, capsys):
    assert main(["rescore", str(run), "--env", f"{HERE}:SumEnv"]) == 0
    assert "rescore: 0 of 16 score(s) changed in 4 group(s) of 2 step(s)" in capsys.readouterr().out


def test_a_changed_scorer_reports_exactly_the_members_that_changed(run, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["rescore", str(run), "--env", f"{HERE}:StrictSumEnv", "--all", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    # member 1 ("57 + 12 = 69") scored 1 and now 0; every other member is unchanged
    expected = [{"step": step, "group": g, "member": 1, "rollout_id": group["rollout_ids"][1],
                 "old": 1.0, "new": 0.0, "error": None}
                for step in (1, 2) for g, group in enumerate(_groups(run, step))]
    assert report["changed"] == expected
    assert report["totals"] == {"steps": 2, "groups": 4, "members": 16, "changed": 4, "errors": 0,
                                "groups_without_item": 0}
    assert [s["changed"] for s in report["steps"]] == [2, 2]
    text = capsys.readouterr().out
    assert "rescore: step 1: 2 of 8 score(s) changed" in text
    assert f"group 0 member 1 rollout {expected[0]['rollout_id']}: 1.0 -> 0.0" in text


def test_a_changed_setting_and_one_step(run, capsys):
    assert main(["rescore", str(run), "--env", f"{HERE}:SumEnv", "--step", "2",
                 "--set", "partial_credit=0.5"]) == 1
    text = capsys.readouterr().out
    wrong = [g["rollout_ids"][2] for g in _groups(run, 2)]  # "a + b = a+b+1" now gets 0.5
    assert [line.split(" rollout ")[1] for line in text.splitlines() if " rollout " in line] == [
        f"{rid}: 0.0 -> 0.5" for rid in wrong]
    assert "rescore: 2 of 8 score(s) changed in 2 group(s) of 1 step(s)" in text


def test_a_scorer_that_raises_is_reported_for_every_member(run, capsys):
    assert main(["rescore", str(run), "--env", f"{HERE}:BrokenSumEnv", "--step", "1"]) == 1
    text = capsys.readouterr().out
    assert text.count("-> error (RuntimeError: the scorer broke)") == 8
    assert "(8 scorer error(s)" in text


def test_setup_runs_when_asked(run, capsys):
    assert main(["rescore", str(run), "--env", f"{HERE}:SetUpSumEnv", "--step", "1"]) == 1
    assert "(8 scorer error(s)" in capsys.readouterr().out  # no self.bonus without setup()
    assert main(["rescore", str(run), "--env", f"{HERE}:SetUpSumEnv", "--setup"]) == 0


def test_token_only_groups_are_rescored_from_their_decoded_tokens(tiny_tokenizer_dir, tmp_path, capsys):
    run = record(TokenOnlySumEnv, tiny_tokenizer_dir, tmp_path / "run")
    assert all(g["messages"] is None for g in _groups(run, 1))
    tok = f"tokenizer_name={tiny_tokenizer_dir}"
    assert main(["rescore", str(run), "--env", f"{HERE}:TokenOnlySumEnv", "--set", tok]) == 0
    assert main(["rescore", str(run), "--env", f"{HERE}:StrictSumEnv", "--set", tok]) == 1
    assert "4 of 16 score(s) changed" in capsys.readouterr().out
    # decoding needs the run's tokenizer: one that cannot load is bad input, with the fix
    missing = f"tokenizer_name={tmp_path / 'missing'}"
    assert main(["rescore", str(run), "--env", f"{HERE}:TokenOnlySumEnv", "--set", missing]) == 2
    err = capsys.readouterr().err
    assert "cannot load the env's tokenizer" in err and "--set tokenizer_name=" in err


@pytest.mark.parametrize("max_tokens", [1, 256])
def test_cut_off_replies_keep_their_truncated_reward(tiny_tokenizer_dir, tmp_path, capsys, max_tokens):
    # max_tokens 1 cuts every reply (recorded -1, not scored); 256 cuts none (scored as usual)
    run = record(CutOffSumEnv, tiny_tokenizer_dir, tmp_path / "run", max_tokens=max_tokens)
    cut = max_tokens == 1
    assert all(g["scores"] == ([-1.0] * 4 if cut else [1.0, 1.0, 0.0, 0.0]) for g in _groups(run, 1))
    tok = f"tokenizer_name={tiny_tokenizer_dir}"
    assert main(["rescore", str(run), "--env", f"{HERE}:CutOffSumEnv", "--set", tok]) == 0
    # the same recording scored by an env without truncated_reward: cut replies are scored now
    code = main(["rescore", str(run), "--env", f"{HERE}:TokenOnlySumEnv", "--set", tok])
    assert code == (1 if cut else 0)
    capsys.readouterr()


# ---------------------------------------------------------------------------- bad input: exit 2
def _bad(capsys, *args):
    assert main(["rescore", *args]) == 2
    return capsys.readouterr().err


def test_a_run_without_bundles(tmp_path, capsys):
    assert "no replay bundles in" in _bad(capsys, str(tmp_path), "--env", f"{HERE}:SumEnv")


def test_unknown_and_unsuitable_envs(run, capsys):
    assert "unknown environment 'no_such_env'" in _bad(capsys, str(run), "--env", "no_such_env")
    assert "cannot import 'Nope'" in _bad(capsys, str(run), "--env", f"{HERE}:Nope")
    err = _bad(capsys, str(run), "--env", "atroposlib.envs.groups:CheckedGroups")
    assert "is CheckedGroups, not a BaseEnv subclass" in err


def test_bad_steps_and_settings(run, capsys):
    assert "no bundle for step(s) 9" in _bad(capsys, str(run), "--env", f"{HERE}:SumEnv", "--step", "9")
    err = _bad(capsys, str(run), "--env", f"{HERE}:SumEnv", "--set", "partial_credt=0.5")
    assert "has no setting 'partial_credt'; did you mean partial_credit?" in err
    err = _bad(capsys, str(run), "--env", f"{HERE}:SumEnv", "--set", "partial_credit=2")
    assert "invalid --set" in err and "partial_credit" in err
    assert "write KEY=VALUE" in _bad(capsys, str(run), "--env", f"{HERE}:SumEnv", "--set", "oops")


def test_a_damaged_bundle(run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = copy / "bundles" / "step_000002.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    err = _bad(capsys, str(copy), "--env", f"{HERE}:SumEnv")
    assert "cannot read the bundle of step 2" in err and "changed after it was written" in err


def test_groups_without_items_say_how_to_record_them(tiny_tokenizer_dir, tmp_path, capsys):
    run = record(SumEnv, tiny_tokenizer_dir, tmp_path / "run", record_items=False)
    assert all("item" not in g for g in _groups(run, 1))
    err = _bad(capsys, str(run), "--env", f"{HERE}:SumEnv")
    assert "none of the 4 groups" in err and "--env.record_items true" in err


def test_items_that_json_cannot_carry_are_left_off(caplog):
    from collections import Counter

    stats = Counter()
    group = {"tokens": [[1]], "masks": [[1]], "scores": [1.0]}
    assert record_item(dict(group), {"a": (1, 2), 3: "x"})["item"] == {"a": [1, 2], "3": "x"}
    assert "item" not in record_item(group, {"blob": "x" * 70_000}, stats)
    assert "item" not in record_item(group, {"id": 2**64}, stats)
    assert "item" not in record_item(group, {1, 2}, stats)
    assert stats["items_not_recorded"] == 3
    assert caplog.text.count("sent without its item") == 1  # logged once
