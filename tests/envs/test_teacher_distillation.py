"""TeacherDistillationEnv: teacher top-k enrichment, overrides, failures, tokenizer check, CLI."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from atroposlib.api.factory import build_app
from atroposlib.api.settings import ApiSettings
from atroposlib.env_runtime.command_line import parse_args, parse_args_with_namespaces
from atroposlib.env_runtime.serve import ServeLoop
from atroposlib.envs.teacher_distillation_env import (
    TeacherDistillationConfig,
    TeacherDistillationEnv,
    align_teacher_logprobs,
)
from atroposlib.errors import ConfigError
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.vllm_client import VLLMServer
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeServer, fake_prompt_logprobs
from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer
from tests.fixtures.api_server import registered_trainer

TEXTS = ["2+2 is 4.", "2+2 is five, I think.", "four", "It is 4"]


class DistillEnv(TeacherDistillationEnv):
    """Scores fixed answers by length; items may carry group_overrides."""

    name = "distill_test"

    async def setup(self) -> None:
        self.n = 0

    async def get_next_item(self):
        self.n += 1
        return {"question": f"Q{self.n}: 2+2?", "group_overrides": {}}

    async def collect_trajectories(self, item):
        completion = await self.server.chat_completion(
            messages=[{"role": "user", "content": item["question"]}], n=self.config.group_size,
            max_tokens=16,
        )
        prompt = self.tokenizer.encode(item["question"], add_special_tokens=False)
        group = {"tokens": [], "masks": [], "scores": [],
                 "group_overrides": dict(item["group_overrides"]) or None}
        for choice in completion.choices:
            answer = self.tokenizer.encode(choice.message.content, add_special_tokens=False)
            group["tokens"].append(prompt + answer)
            group["masks"].append([-100] * len(prompt) + answer)
            group["scores"].append(float(len(answer)))
        return group, []

    async def evaluate(self, *args, **kwargs):
        return {}


def make_group(tokenizer, texts=TEXTS[:2], **overrides):
    tokens = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    group = {"tokens": tokens, "masks": [[-100] * 2 + t[2:] for t in tokens],
             "scores": [float(i) for i in range(len(texts))]}
    if overrides:
        group["group_overrides"] = overrides
    return group


def make_env(tokenizer_dir, teacher=None, top_k=3, enabled=True, group_size=2, **extra):
    config = TeacherDistillationConfig(
        tokenizer_name=str(tokenizer_dir), group_size=group_size, use_wandb=False,
        teacher_enabled=enabled, teacher_top_k=top_k, **extra,
    )
    teacher = teacher if teacher is not None else FakeServer()
    return DistillEnv(config, [FakeServer(list(TEXTS))], teacher_server_configs=[teacher]), teacher


def expected_arrays(tokens, k):
    """What the fake teacher must yield: the k best per position, or the actual token (k=0)."""
    ids, lps = [], []
    for pos, entry in enumerate(fake_prompt_logprobs(tokens, max(k, 1))):
        if entry is None:
            ids.append([]), lps.append([])
            continue
        if k == 0:
            ids.append([tokens[pos]]), lps.append([entry[tokens[pos]][0]])
            continue
        best = sorted(entry.items(), key=lambda kv: kv[1][1])[:k]
        ids.append([t for t, _ in best]), lps.append([lp for _, (lp, _) in best])
    return ids, lps


async def test_enrichment_has_shape_g_t_k_and_the_teachers_values(tiny_tokenizer_dir):
    env, teacher = make_env(tiny_tokenizer_dir, top_k=3)
    group = make_group(env.tokenizer)
    [out] = await env.handle_send_to_api(group, do_send_to_api=False)
    assert len(out["distill_token_ids"]) == len(out["distill_logprobs"]) == 2
    for seq, ids, lps in zip(out["tokens"], out["distill_token_ids"], out["distill_logprobs"], strict=True):
        assert len(ids) == len(lps) == len(seq)
        assert ids[0] == [] and lps[0] == []
        assert all(len(row) == 3 for row in ids[1:]) and all(len(row) == 3 for row in lps[1:])
        assert (ids, lps) == expected_arrays(seq, 3)
        assert all(row == sorted(row, reverse=True) for row in lps[1:])  # rank order
    calls = [r for r in teacher.requests if r.kind == "logprobs"]
    assert len(calls) == 2 and {r.kwargs["top_k"] for r in calls} == {3}
    assert {r.kwargs["max_tokens"] for r in calls} == {1}
    assert sorted(r.kwargs["input_ids"] for r in calls) == sorted(group["tokens"])
    assert env.stats["teacher_groups_enriched"] == 1 and env.stats["teacher_groups_failed"] == 0


async def test_top_k_zero_keeps_only_the_actual_tokens_logprob(tiny_tokenizer_dir):
    env, _ = make_env(tiny_tokenizer_dir, top_k=0)
    [out] = await env.handle_send_to_api(make_group(env.tokenizer), do_send_to_api=False)
    for seq, ids, lps in zip(out["tokens"], out["distill_token_ids"], out["distill_logprobs"], strict=True):
        assert [row[0] for row in ids[1:]] == seq[1:]
        assert (ids, lps) == expected_arrays(seq, 0)


async def test_group_override_teacher_top_k_wins_over_the_config(tiny_tokenizer_dir):
    env, teacher = make_env(tiny_tokenizer_dir, top_k=3)
    [out] = await env.handle_send_to_api(make_group(env.tokenizer, teacher_top_k=2), do_send_to_api=False)
    assert {len(row) for ids in out["distill_token_ids"] for row in ids[1:]} == {2}
    assert {r.kwargs["top_k"] for r in teacher.requests} == {2}


async def test_skip_and_minus_one_fetch_nothing(tiny_tokenizer_dir):
    env, teacher = make_env(tiny_tokenizer_dir, top_k=3)
    [skipped] = await env.handle_send_to_api(
        make_group(env.tokenizer, skip_teacher_top_k=True), do_send_to_api=False)
    [off] = await env.handle_send_to_api(make_group(env.tokenizer, teacher_top_k=-1), do_send_to_api=False)
    assert teacher.requests == []
    assert skipped["distill_token_ids"] is None and off["distill_logprobs"] is None
    assert env.stats["teacher_groups_skipped"] == 2


async def test_disabled_teacher_builds_no_manager_and_sends_nothing(tiny_tokenizer_dir):
    env, teacher = make_env(tiny_tokenizer_dir, enabled=False)
    assert env.teacher is None
    [out] = await env.handle_send_to_api(make_group(env.tokenizer), do_send_to_api=False)
    assert out["distill_token_ids"] is None and teacher.requests == []


async def test_a_failed_request_nulls_only_its_group_and_is_counted(tiny_tokenizer_dir):
    env, teacher = make_env(tiny_tokenizer_dir, top_k=2)
    teacher.fail_next(1, RuntimeError("teacher exploded"))
    groups = [make_group(env.tokenizer, TEXTS[:2]), make_group(env.tokenizer, TEXTS[2:])]
    out = await env.handle_send_to_api(groups, do_send_to_api=False)
    assert len(out) == 2  # the group is still sent, just without distillation fields
    nulled = [g for g in out if g["distill_token_ids"] is None]
    assert len(nulled) == 1 and nulled[0]["distill_logprobs"] is None
    good = [g for g in out if g["distill_token_ids"] is not None]
    assert len(good) == 1 and len(good[0]["distill_logprobs"][1][1]) == 2
    assert env.stats["teacher_groups_failed"] == 1 and env.stats["teacher_groups_enriched"] == 1


class ShortTeacher(FakeServer):
    """A teacher whose answer is one position short (e.g. it dropped a BOS)."""

    async def _get_logprobs_wrapper(self, **kwargs):
        result = await super()._get_logprobs_wrapper(**kwargs)
        return {"prompt_topk_token_ids": result["prompt_topk_token_ids"][1:],
                "prompt_topk_logprobs": result["prompt_topk_logprobs"][1:]}


async def test_a_length_mismatch_nulls_both_fields(tiny_tokenizer_dir, caplog):
    env, _ = make_env(tiny_tokenizer_dir, teacher=ShortTeacher(), top_k=2)
    group = make_group(env.tokenizer)
    # stale data is cleared
    group["distill_token_ids"] = [[[1]] * len(t) for t in group["tokens"]]
    group["distill_logprobs"] = [[[-1.0]] * len(t) for t in group["tokens"]]
    [out] = await env.handle_send_to_api(group, do_send_to_api=False)
    assert out["distill_token_ids"] is None and out["distill_logprobs"] is None
    assert env.stats["teacher_groups_failed"] == 1
    assert "positions for a sequence of" in caplog.text


def test_align_rejects_too_few_candidates_missing_tokens_and_non_finite_values():
    ok = {"prompt_topk_token_ids": [[], [5, 6]], "prompt_topk_logprobs": [[], [-0.1, -2.0]]}
    assert align_teacher_logprobs([1, 6], ok, 1) == ([[], [5]], [[], [-0.1]])
    assert align_teacher_logprobs([1, 6], ok, 0) == ([[], [6]], [[], [-2.0]])
    with pytest.raises(Exception, match="2 teacher candidates, expected 3"):
        align_teacher_logprobs([1, 6], ok, 3)
    with pytest.raises(Exception, match="actual token 7 is not in"):
        align_teacher_logprobs([1, 7], ok, 0)
    bad = {"prompt_topk_token_ids": [[], [5]], "prompt_topk_logprobs": [[], [math.nan]]}
    with pytest.raises(Exception, match="non-finite"):
        align_teacher_logprobs([1, 5], bad, 1)
    with pytest.raises(Exception, match="differ from the 2 sent"):
        align_teacher_logprobs([1, 5], {**ok, "prompt_tokens": [1, 9]}, 1)


async def test_tokenizer_mismatch_is_a_config_error_before_any_rollout(tiny_tokenizer_dir, tmp_path):
    other = make_tiny_tokenizer()
    other.add_tokens(["<tool_call>"])
    env, teacher = make_env(tiny_tokenizer_dir, teacher=FakeServer(tokenizer=other),
                            data_path_to_save_groups=str(tmp_path / "g.jsonl"), total_steps=1)
    with pytest.raises(ConfigError, match="vocabulary size differs.*--teacher.tokenizer_name"):
        await env.process_manager(show_progress=False)
    assert env.server.servers[0].requests == [] and teacher.requests == []
    with pytest.raises(ConfigError, match="differs from the student tokenizer"):
        await env.handle_send_to_api(make_group(env.tokenizer), do_send_to_api=False)


def test_enabled_teacher_needs_a_server_that_can_score_prompts(tiny_tokenizer_dir):
    config = TeacherDistillationConfig(tokenizer_name=str(tiny_tokenizer_dir), teacher_enabled=True)
    with pytest.raises(ConfigError, match="no teacher server configuration was provided.*--teacher.base_url"):
        DistillEnv(config, [FakeServer()])
    openai_teacher = APIServerConfig(base_url="http://127.0.0.1:1/v1", model_name="t", server_type="openai")
    with pytest.raises(ConfigError, match="cannot return prompt log-probs.*server_type vllm"):
        DistillEnv(config, [FakeServer()], teacher_server_configs=[openai_teacher])
    with pytest.raises(ValueError, match="greater than or equal to -1"):
        TeacherDistillationConfig(teacher_top_k=-2)


def test_a_bare_teacher_config_is_a_list_of_one_and_its_tokenizer_checked_at_construction(
        tiny_tokenizer_dir, tmp_path):
    """Atropos 0.4's constructor: one APIServerConfig is wrapped in a list, and the teacher
    tokenizer it names is compared with the student's before the env exists."""
    config = TeacherDistillationConfig(tokenizer_name=str(tiny_tokenizer_dir), teacher_enabled=True)
    same = APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="t", server_type="vllm",
                           tokenizer_name=str(tiny_tokenizer_dir), health_check=False)
    env = DistillEnv(config, [FakeServer()], teacher_server_configs=same)
    assert [s.config for s in env.teacher_server.servers] == [same]
    other = make_tiny_tokenizer()
    other.add_tokens(["<tool_call>"])
    other.save_pretrained(tmp_path / "other")
    different = same.model_copy(update={"tokenizer_name": "none", "model_name": str(tmp_path / "other")})
    with pytest.raises(ValueError, match="Cross-tokenizer distillation is not supported"):
        DistillEnv(config, [FakeServer()], teacher_server_configs=[different])


async def test_per_sequence_fetch_is_the_override_point(tiny_tokenizer_dir):
    """``_fetch_teacher_for_sequence(token_ids, top_k)`` is called once per sequence with the
    group's top-k; an env (or test) that replaces it supplies the arrays."""
    env, teacher = make_env(tiny_tokenizer_dir, top_k=0)
    seen = []

    async def fetch(token_ids, top_k):
        seen.append((len(token_ids), top_k))
        return [[t] for t in token_ids], [[-0.5] for _ in token_ids]

    env._fetch_teacher_for_sequence = fetch
    group = make_group(env.tokenizer, teacher_top_k=7)
    out = await env._attach_teacher_distillation(group)
    assert [k for _, k in seen] == [7, 7] and teacher.requests == []
    assert out["distill_token_ids"][0] == [[t] for t in group["tokens"][0]]
    skipped = await env._attach_teacher_distillation(make_group(env.tokenizer, skip_teacher_top_k=True))
    assert skipped["distill_token_ids"] is None and skipped["distill_logprobs"] is None
    assert len(seen) == 2


class DefaultTeacherEnv(DistillEnv):
    """Atropos 0.4's idiom: the class names its default teacher."""

    @classmethod
    def teacher_config_init(cls):
        return APIServerConfig(base_url="http://127.0.0.1:9003/v1", model_name="teacher",
                               server_type="vllm", timeout=1200)


def test_teacher_config_init_gives_the_default_teacher_under_yaml_and_flags(tmp_path):
    [teacher] = parse_args_with_namespaces(DefaultTeacherEnv, ["serve"])[4]["teacher_server_configs"]
    assert (teacher.base_url, teacher.model_name, teacher.timeout) == (
        "http://127.0.0.1:9003/v1", "teacher", 1200)
    [teacher] = parse_args_with_namespaces(
        DefaultTeacherEnv, ["process", "--teacher.model_name", "big"])[4]["teacher_server_configs"]
    assert (teacher.base_url, teacher.model_name, teacher.timeout) == (
        "http://127.0.0.1:9003/v1", "big", 1200)
    assert DistillEnv.teacher_config_init() is None
    assert parse_args_with_namespaces(DefaultTeacherEnv, ["evaluate"])[4] == {}


def test_cli_teacher_namespace_for_serve_and_process_only(tmp_path, capsys):
    flags = ["--env.teacher_enabled", "--env.teacher_top_k", "4", "--teacher.base_url",
             "http://127.0.0.1:9/v1", "--teacher.model_name", "big", "--teacher.server_type", "vllm"]
    for mode in ("serve", "process"):
        _, env, servers, _, extra = parse_args_with_namespaces(DistillEnv, [mode, *flags])
        assert env.teacher_enabled is True and env.teacher_top_k == 4
        [teacher] = extra["teacher_server_configs"]
        assert (teacher.base_url, teacher.model_name, teacher.server_type) == (
            "http://127.0.0.1:9/v1", "big", "vllm")
        assert not isinstance(servers, list) or servers[0].base_url != teacher.base_url
    assert parse_args_with_namespaces(DistillEnv, ["serve"])[4] == {}  # not given: not passed
    with pytest.raises(SystemExit) as exc:
        parse_args(DistillEnv, ["evaluate", "--teacher.base_url", "http://127.0.0.1:9/v1"])
    assert exc.value.code == 2 and "unknown flag --teacher.base_url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(DistillEnv, ["serve", "--teacher.timeout", "soon"])
    assert "--teacher.timeout" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("teacher:\n  - {base_url: 'http://a/v1', model_name: t1, server_type: vllm}\n"
                   "  - {base_url: 'http://b/v1', model_name: t2, server_type: vllm}\n")
    extra = parse_args_with_namespaces(DistillEnv, ["serve", "--config", str(cfg)])[4]
    assert [c.base_url for c in extra["teacher_server_configs"]] == ["http://a/v1", "http://b/v1"]
    with pytest.raises(SystemExit):
        parse_args(DistillEnv, ["serve", "--config", str(cfg), "--teacher.model_name", "x"])
    assert "--teacher.model_name cannot be combined" in capsys.readouterr().err


def test_process_cli_with_a_vllm_style_http_teacher_writes_distill_fields(tiny_tokenizer_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "groups.jsonl"
    with FakeOpenAIServer(FakeServer(list(TEXTS), tokenizer=tiny_tokenizer)) as http:
        DistillEnv.cli([
            "process", "--env.tokenizer_name", str(tiny_tokenizer_dir), "--env.total_steps", "2",
            "--env.group_size", "2", "--env.data_path_to_save_groups", str(out),
            "--env.teacher_enabled", "--env.teacher_top_k", "2",
            "--openai.base_url", http.base_url, "--openai.model_name", "fake", "--openai.api_key", "x",
            "--teacher.base_url", http.base_url, "--teacher.model_name", "fake",
            "--teacher.api_key", "x", "--teacher.server_type", "vllm",
            "--teacher.tokenizer_name", str(tiny_tokenizer_dir),
        ])
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    for group in groups:
        for seq, ids, lps in zip(group["tokens"], group["distill_token_ids"], group["distill_logprobs"], strict=True):
            assert (ids, lps) == expected_arrays(seq, 2)  # parsed from vLLM's JSON by VLLMServer


async def test_enriched_fields_round_trip_through_the_api_verbatim(tiny_tokenizer_dir):
    env, _ = make_env(tiny_tokenizer_dir, top_k=2)
    [group] = await env.handle_send_to_api(make_group(env.tokenizer), do_send_to_api=False)
    app = build_app(ApiSettings(allowed_hosts=["api"]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await c.post("/register", json={
            "wandb_group": "g", "wandb_project": "p", "batch_size": 2, "max_token_len": 256,
            "checkpoint_dir": "ckpt", "save_checkpoint_interval": 10, "starting_step": 0,
            "num_steps": 10})
        await c.get("/batch")
        assert (await c.post("/scored_data", json=group)).json() == {"status": "received"}
        [served] = (await c.get("/batch")).json()["batch"]
    assert served["distill_token_ids"] == group["distill_token_ids"]
    assert served["distill_logprobs"] == group["distill_logprobs"]


@pytest.mark.e2e
async def test_bundled_model_is_its_own_teacher_through_real_vllm(vllm_server):
    teacher = APIServerConfig(base_url=vllm_server.base_url, model_name=vllm_server.model_name,
                              api_key="x", server_type="vllm", tokenizer_name=str(vllm_server.model_dir))
    config = TeacherDistillationConfig(tokenizer_name=str(vllm_server.model_dir), group_size=2,
                                       use_wandb=False, teacher_enabled=True, teacher_top_k=3)
    env = DistillEnv(config, [FakeServer()], teacher_server_configs=[teacher])
    assert isinstance(env.teacher.servers[0], VLLMServer)
    env.check_teacher_tokenizer()  # same tokenizer: passes
    group = make_group(env.tokenizer, ["The capital of France is Paris.", "2 + 2 = 4"],
                       teacher_top_k=3)
    zero = make_group(env.tokenizer, ["The capital of France is Paris.", "2 + 2 = 5"],
                      teacher_top_k=0)
    try:
        out, out0 = await env.handle_send_to_api([group, zero], do_send_to_api=False)
    finally:
        await env.teacher.aclose()
    assert env.stats["teacher_groups_enriched"] == 2, dict(env.stats)
    for seq, ids, lps in zip(out["tokens"], out["distill_token_ids"], out["distill_logprobs"], strict=True):
        assert len(ids) == len(lps) == len(seq) and ids[0] == []
        assert all(len(r) == 3 for r in ids[1:]) and all(len(r) == 3 for r in lps[1:])
        assert all(math.isfinite(x) and -1e3 < x <= 0 for row in lps for x in row)
        assert all(row == sorted(row, reverse=True) for row in lps[1:])
    for seq, ids, lps in zip(out0["tokens"], out0["distill_token_ids"], out0["distill_logprobs"], strict=True):
        assert [r[0] for r in ids[1:]] == seq[1:] and all(len(r) == 1 for r in lps[1:])
    # "Paris" after "The capital of France is" is likelier than a wrong digit after "2 + 2 =".
    paris, five = out0["distill_logprobs"][0][-2][0], out0["distill_logprobs"][1][-1][0]
    assert paris > five


async def test_serve_mode_posts_enriched_groups_to_a_real_run_api(run_api, tiny_tokenizer_dir, tmp_path):
    env, _ = make_env(tiny_tokenizer_dir, top_k=2, rollout_server_url=run_api.url,
                            total_steps=2, max_batches_offpolicy=1)
    trainer = await registered_trainer(run_api.url, 4, str(tmp_path), num_steps=10, save_checkpoint_interval=-1)
    assert await trainer.get_batch() is None
    serving = asyncio.create_task(ServeLoop(env, status_interval=0.2).run())
    try:
        async with asyncio.timeout(60):
            while not (batch := await trainer.get_batch()):
                await asyncio.sleep(0.05)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await trainer.aclose()
    assert sum(len(g["tokens"]) for g in batch) == 4
    for group in batch:
        for seq, ids, lps in zip(group["tokens"], group["distill_token_ids"], group["distill_logprobs"], strict=True):
            assert (ids, lps) == expected_arrays(seq, 2)
    assert env.stats["teacher_groups_enriched"] >= 2 and env.stats["teacher_groups_failed"] == 0
