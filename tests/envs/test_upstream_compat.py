"""An env written the Atropos 0.4 way (gsm8k idioms) runs unchanged on atroposlib."""

from __future__ import annotations

import json
import random
import re

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.envs.base import (  # the exact upstream import surface
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    EvalHandlingEnum,
    OpenaiConfig,
    ScoredDataGroup,
)
from atroposlib.envs.run_state import RunState
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
    env2.bind_run_state(RunState(checkpoint_dir=str(tmp_path / "ck")))
    env2.save_checkpoint(5)
    assert json.loads((tmp_path / "ck/env_checkpoints/upstream_style/step-5.json").read_text()) == {
        "iter": env2.iter}


# ---------------------------------------------------------------------------------------------
# Names that upstream Atropos code imports, at upstream's import paths.
UPSTREAM_NAMES = [
    ("atroposlib.envs.server_handling.server_harness", "ServerHarness"),
    ("atroposlib.envs.server_handling.tool_call_translator", "ToolCallTranslator"),
    ("atroposlib.envs.server_handling.tool_call_translator", "VLLM_AVAILABLE"),
    ("atroposlib.frontend.jsonl2html", "create_html_for_group"),
    ("atroposlib.utils.tool_call_parser", "parse_tool_call"),
    ("atroposlib.utils.tool_call_parser", "extract_tool_call"),
    ("atroposlib.utils.best_of_n_selection", "select_best_index"),
    ("atroposlib.envs.constants", "ENV_NAMESPACE"),
    ("atroposlib.envs.constants", "OPENAI_NAMESPACE"),
    ("atroposlib.envs.constants", "NAMESPACE_SEP"),
    ("atroposlib.envs.constants", "SERVER_MANAGER_NAMESPACE"),
    # modules that were missing (issue 11 sec. 1), and the legacy function forms
    *[("atroposlib.envs.reward_fns.cascading_r1_math_reward", n) for n in (
        "cascading_r1_math_reward", "accuracy_reward", "format_reward", "get_completion_content",
        "parse", "verify", "LatexExtractionConfig", "NormalizationConfig")],
    *[("atroposlib.envs.reward_fns.chandas_meter_reward", n) for n in (
        "ChandasMeterReward", "iast_to_slp1", "resource_filename", "registry", "RewardFunction")],
    *[("atroposlib.envs.reward_fns.cosine_scaled_reward", n) for n in (
        "CosineScaledReward", "cosine_scaled_reward", "AutoModel", "AutoTokenizer")],
    *[("atroposlib.envs.reward_fns.crossword_format_reward", n) for n in (
        "CrosswordFormatReward", "crossword_format_reward")],
    ("atroposlib.envs.reward_fns.accuracy_reward", "accuracy_reward"),
    ("atroposlib.envs.reward_fns.format_reward", "format_reward"),
    ("atroposlib.envs.reward_fns.reasoning_steps_reward", "reasoning_steps_reward"),
    ("atroposlib.envs.reward_fns.repetition_penalty_reward", "repetition_penalty_reward"),
    ("atroposlib.envs.reward_fns.registry", "LegacyFunctionWrapper"),
    *[("atroposlib.envs.reward_fns.r1_reward", n) for n in (
        "r1_reward", "accuracy_reward", "format_reasoning_reward", "parse_reasoning_response")],
    ("atroposlib.utils.display", "display_metrics_table"),
    ("atroposlib.utils.force_diverse_samples", "generate_with_diverse_first_tokens"),
    ("atroposlib.utils.tokenizers.qwen_fixed_tokenizer", "QwenFixedTokenizer"),
    # envs.base's re-exports (loaded lazily)
    *[("atroposlib.envs.base", n) for n in (
        "AutoTokenizer", "retry", "stop_after_attempt", "wait_random_exponential", "rprint",
        "resolve_openai_configs", "get_std_min_max_avg", "parse_http_response", "generate_html",
        "ENV_NAMESPACE", "OPENAI_NAMESPACE", "NAMESPACE_SEP", "Message", "UUID", "BaseModel",
        "Field")],
]


def test_upstream_names_import_from_upstream_paths():
    import importlib

    for module, name in UPSTREAM_NAMES:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name} is missing"


async def test_server_harness_answers_managed_server_with_canned_tokens():
    from atroposlib.envs.server_handling.managed_server import ManagedServer
    from atroposlib.envs.server_handling.server_harness import ServerHarness

    class CharTokenizer:
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    harness = ServerHarness(tokenizer=CharTokenizer())
    harness.set_tokens_and_logprobs_response(
        prompt="2+2=", prompt_tokens=[50, 43, 50, 61], output_tokens_list=[[52]],
        output_logprobs_list=[[-0.25]], finish_reasons=["stop"])
    managed = ManagedServer(harness)  # the tokenizer comes from the server
    result = await managed.completion(prompt="2+2=")
    assert result.choices[0].text == "4"
    node = managed.get_state()["nodes"][0]
    assert node.tokens == [50, 43, 50, 61, 52] and node.masked_tokens == [-100] * 4 + [52]
    assert node.logprobs == [1.0] * 4 + [-0.25]
    assert len(harness.request_timings) == 1 and len(harness.eval_request_timings) == 0
    with pytest.raises(KeyError, match="set_tokens_and_logprobs_response"):
        await managed.completion(prompt="unknown")


def test_parse_tool_call_single_call_helper():
    from atroposlib.utils.tool_call_parser import parse_tool_call

    tools = [{"type": "function", "function": {"name": "search"}}]
    ok = '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
    assert parse_tool_call(ok, tools) == ("search", {"q": "cats"}, False)
    assert parse_tool_call(ok.replace("search", "delete"), tools) == ("-ERROR-", {}, True)
    assert parse_tool_call("<tool_call>not json</tool_call>") == ("-ERROR-", {}, True)
    assert parse_tool_call("no call") == ("-ERROR-", {}, True)
    assert parse_tool_call('<act>{"name": "a", "arguments": {}}</act>', preferred_tags=["act"]) == (
        "a", {}, False)


def test_select_best_index_breaks_ties_with_secondary_score():
    from atroposlib.utils.best_of_n_selection import select_best_index

    assert select_best_index([1, 3, 3], [5, 9, 4]) == 2  # best reward, then shortest
    assert select_best_index([1, 3, 3], [5, 9, 4], primary_higher_is_better=False) == 0
    with pytest.raises(ValueError, match="one entry per candidate"):
        select_best_index([1], [1, 2])


def test_create_html_for_group_renders_one_group():
    from atroposlib.frontend.jsonl2html import create_html_for_group

    block = create_html_for_group(
        {"messages": [[{"role": "user", "content": "hi <script>x</script>"}], "two"],
         "scores": [1.0]}, 3)
    assert "Group 3" in block and "User" in block and "<script>" not in block
    assert "two" not in block  # more messages than scores: only the scored ones
    assert create_html_for_group({"messages": [], "scores": []}, 1) == ""


def test_env_config_accepts_undeclared_fields_from_code_with_one_warning():
    from atroposlib.envs.config import UnknownConfigFieldWarning

    with pytest.warns(UnknownConfigFieldWarning) as record:
        config = BaseEnvConfig(score_buffer_size=5, dataset_path="d.jsonl", group_size=2)
    assert len(record) == 1
    message = str(record[0].message)
    assert "dataset_path, score_buffer_size" in message and "BaseEnvConfig" in message
    assert record[0].filename == __file__  # points at the caller, not pydantic
    assert config.score_buffer_size == 5 and config.dataset_path == "d.jsonl"
    assert config.model_dump()["score_buffer_size"] == 5 and config.group_size == 2

    class MyConfig(BaseEnvConfig):
        start_tok_length: int = 8

    with pytest.warns(UnknownConfigFieldWarning, match="MyConfig.*max_gen_per_turn"):
        sub = MyConfig(start_tok_length=4, max_gen_per_turn=3)
    assert (sub.start_tok_length, sub.max_gen_per_turn) == (4, 3)
    with pytest.raises(ValueError):  # declared fields are still validated
        BaseEnvConfig(group_size=0, score_buffer_size=5)


def test_message_history_utils_trim_thinking_and_long_steps(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from atroposlib.utils.message_history_utils import (
        ensure_trajectory_token_limit,
        strip_thinking,
        truncate_thinking,
    )

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    text = "<think>" + " ".join(f"step{i}" for i in range(50)) + "</think>The answer is 4."
    short = truncate_thinking(text, tok, 5)
    assert short.startswith("<think>...") and short.endswith("</think>The answer is 4.")
    kept = short[len("<think>...") : short.index("</think>")]
    assert len(tok.encode(kept, add_special_tokens=False)) <= 5 and kept.endswith("49")
    assert truncate_thinking(text, tok, 10_000) == text
    assert truncate_thinking("no block here", tok, 1) == "no block here"
    assert strip_thinking(text) == "The answer is 4."

    from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

    chat = [{"role": "system", "content": "sys"}]
    for turn in range(6):
        chat += [{"role": "user", "content": f"observation {turn} " * 5},
                 {"role": "assistant", "content": f"action {turn} " * 5}]
    full = tokenize_for_trainer(tok, chat)
    step = {"messages": [chat, chat], "tokens": [full["tokens"]] * 2, "masks": [full["masks"]] * 2,
            "scores": [1.0, 0.0]}
    fine = {"messages": [chat[:3]], "tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0]}
    limit = len(full["tokens"]) - 10
    out = ensure_trajectory_token_limit([fine, step], tok, limit)
    assert out[0] is fine and len(out) == 2
    trimmed = out[1]
    assert all(len(t) <= limit for t in trimmed["tokens"])
    assert trimmed["messages"][0][0] == chat[0] and trimmed["messages"][0][-2:] == chat[-2:]
    assert len(trimmed["messages"][0]) < len(chat)
    assert trimmed["masks"][0][-1] == trimmed["tokens"][0][-1]  # still trains on the last turn
    assert ensure_trajectory_token_limit([step], tok, 5) == []  # cannot fit: dropped


async def test_eval_base_runs_items_and_writes_metrics(tmp_path):
    from atroposlib.envs.eval import EvalBase, eval_runner, evaluate_log

    path = evaluate_log({"acc": 0.5}, eval_dir=tmp_path / "e", task_name="t", model_name="m",
                        start_time=1.0, end_time=3.0, samples=[{"x": 1}], verbose=False)
    payload = json.loads(path.read_text())
    assert payload["results"] == {"atropos|t|0": {"acc": 0.5}, "all": {"acc": 0.5}}
    assert payload["config_general"]["total_evaluation_time_seconds"] == "2.0"
    assert (tmp_path / "e" / "samples.jsonl").read_text().strip() == '{"x":1}'
    assert evaluate_log({"acc": 1.0}, verbose=False) is None

    class Doubling(EvalBase):
        def setup_data(self):
            return [1, 2, 3, 4]

        async def run_item(self, server, data_item):
            if data_item == 4:
                raise RuntimeError("broken item")
            return {"correct": float(data_item % 2)}, [{"item": data_item}]

    ev = Doubling(pass_at_n=2, eval_dir=str(tmp_path / "d"), verbose=False, temperature=0.7)
    assert ev.get_generation_params() == {"temperature": 0.7, "n": 2, "top_p": 1.0, "max_tokens": -1}
    metrics = await ev(server_manager=None)
    assert metrics == {"correct": pytest.approx(2 / 3), "failed_items": 1}
    assert (tmp_path / "d" / "metrics.json").exists()
    with pytest.raises(SystemExit):  # --model-name is required
        await eval_runner(ev, [])


async def test_managed_server_adapter_looks_like_async_openai():
    from atroposlib.envs.server_handling.managed_server import ManagedServerAdapter

    class Recorder:
        async def chat_completion(self, **kwargs):
            return ("chat", kwargs)

        async def completion(self, **kwargs):
            return ("completion", kwargs)

    adapter = ManagedServerAdapter(Recorder(), base_url="http://x/v1")
    assert await adapter.chat.completions.create(messages=[], n=2) == ("chat", {"messages": [], "n": 2})
    assert await adapter.completions.create(prompt="p") == ("completion", {"prompt": "p"})
    assert adapter.base_url == "http://x/v1"


def test_combined_reward_and_reasoning_flag_at_upstream_paths():
    from atroposlib.envs.reward_fns import CombinedReward, registry
    from atroposlib.envs.server_handling.server_baseline import ReasoningConfig

    assert isinstance(registry.create({"type": "combined", "rewards": ["format"]}), CombinedReward)
    assert not ReasoningConfig().is_reasoning_kwargs_active()
    assert ReasoningConfig(effort="high").is_reasoning_kwargs_active()
    assert ReasoningConfig(enabled=True).is_reasoning_kwargs_active()


def test_resolve_openai_configs_merges_yaml_and_flags():
    from atroposlib.envs.server_handling.openai_server import resolve_openai_configs
    from atroposlib.envs.server_handling.server_baseline import ServerBaseline
    from atroposlib.envs.server_handling.vllm_server import resolve_openai_configs as from_vllm

    from atroposlib.errors import ConfigError

    assert from_vllm is resolve_openai_configs
    default = APIServerConfig(model_name="m", base_url="http://a/v1", api_key="x")
    out = resolve_openai_configs(default, {"base_url": "http://flag/v1"},
                                 {"openai": {"model_name": "yaml-model"}},
                                 {"openai.base_url": "http://flag/v1"}, None)
    assert [(c.model_name, c.base_url) for c in out] == [("yaml-model", "http://flag/v1")]
    assert isinstance(resolve_openai_configs(ServerBaseline(), {}, {}, {}, None), ServerBaseline)
    with pytest.raises(ConfigError):
        resolve_openai_configs([default, default], {}, {}, {"openai.base_url": "http://f/v1"}, None)


async def test_teacher_distillation_upstream_helper_names(monkeypatch):
    from atroposlib.envs import teacher_distillation_env as module
    from atroposlib.envs.teacher_distillation_env import TeacherDistillationEnv

    class Env(TeacherDistillationEnv):
        async def get_next_item(self):
            return None

        async def evaluate(self, *args, **kwargs):
            return None

    class FakeTeacher:
        calls = 0

        async def get_logprobs(self, **kwargs):
            FakeTeacher.calls += 1
            seq = kwargs["input_ids"]
            return {"prompt_tokens": seq, "prompt_topk_token_ids": [[t, t + 1] for t in seq],
                    "prompt_topk_logprobs": [[-0.1, -0.2] for _ in seq]}

    env = object.__new__(Env)
    env.config = module.TeacherDistillationConfig(teacher_enabled=True, teacher_top_k=2,
                                                  use_wandb=False)
    assert env.teacher_server is None
    group = {"tokens": [[1, 2, 3]], "masks": [[-100, 2, 3]], "scores": [1.0]}
    assert await env._attach_teacher_distillation(group) is group  # no teacher: untouched
    assert "distill_token_ids" not in group
    env.teacher_server = FakeTeacher()
    out = await env._attach_teacher_distillation(group)
    assert len(out["distill_token_ids"][0]) == 3 and FakeTeacher.calls == 1

    class Tok:
        name_or_path = "student"
        bos_token_id = eos_token_id = pad_token_id = unk_token_id = None

        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    env.tokenizer = Tok({"a": 1})
    env._validate_teacher_tokenizer_compatibility("student")  # same name: no load
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: Tok({"b": 1}))
    with pytest.raises(ValueError, match="Cross-tokenizer distillation is not supported"):
        env._validate_teacher_tokenizer_compatibility("teacher")

    assert Env._resolve_teacher_server_configs(None, {}, {}) is None
    resolved = Env._resolve_teacher_server_configs(
        APIServerConfig(model_name="t", base_url="http://t/v1", api_key="x", server_type="vllm"),
        {"teacher": {"tokenizer_name": "teacher-tok"}},
        {"teacher.base_url": "http://override/v1"},
    )
    assert [(c.base_url, c.tokenizer_name, c.model_name) for c in resolved] == [
        ("http://override/v1", "teacher-tok", "t")]
