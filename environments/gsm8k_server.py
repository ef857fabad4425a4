r"""GSM8K grade-school math: chat prompt asking for ``\boxed{}``, scored with math-verify.

Each item is a GSM8K training question; the policy samples ``group_size`` answers through the
managed server (exact token ids + sampler log-probs), each scored ``+1.0`` when math-verify finds
the gold number in the final ``\boxed{}`` (after the last ``</think>``, if any) and ``-1.0``
otherwise. When every answer is right, longer answers are penalised (Atropos 0.4's length
penalty) so the group still carries a signal; a group whose scores are all equal is dropped.
``evaluate`` reports ``eval/percent_correct`` on the test split (``--env.eval_limit N`` for the
first N shuffled questions). The data is the hub dataset ``openai/gsm8k`` (config ``main``) or a
local directory with ``train.jsonl`` / ``test.jsonl`` (fields ``question``, ``answer`` with the
final answer after ``####``).

Run against a vLLM serving the bundled model (``python -m atroposlib.inference.vllm_process``)::

    python environments/gsm8k_server.py process --env.dataset_name ../shared/data/gsm8k \
        --env.total_steps 4 --env.group_size 4 --env.data_path_to_save_groups out.jsonl \
        --openai.base_url http://127.0.0.1:9100/v1 --openai.model_name smollm2
    python environments/gsm8k_server.py evaluate --env.dataset_name ../shared/data/gsm8k \
        --env.eval_limit 100 --openai.base_url http://127.0.0.1:9100/v1
    python environments/gsm8k_server.py serve ...   # with run-api and a trainer

The bundled SmolLM2-135M-Instruct is weak at GSM8K (a few percent): the reward is real but
sparse. ``environments/arithmetic_server.py`` is the better task for seeing learning on a CPU.
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

if __package__ in (None, ""):  # run as `python environments/gsm8k_server.py ...`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.api.models import IGNORE_INDEX  # noqa: E402
from atroposlib.defaults import (  # noqa: E402
    DEFAULT_API_URL,
    DEFAULT_INFERENCE_MODEL,
    DEFAULT_INFERENCE_URL,
)
from atroposlib.envs.base import (  # noqa: E402
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from atroposlib.inference.bundled import bundled_model_dir  # noqa: E402

#: Atropos 0.4's GSM8K system prompt, paraphrased: think, then answer in \boxed{}.
SYSTEM_PROMPT = (
    "You are a deep thinking AI. You may use long chains of thought to consider the problem and "
    "deliberate with yourself via systematic reasoning before answering; put your thoughts "
    "inside <think> </think> tags.\n\n"
    "You are allocated a maximum of {max_tokens} tokens, please strive to use less.\n\n"
    "End your answer with \\boxed{your answer here}, e.g. \\boxed{42}. Put only the final "
    "number inside \\boxed{}: an answer without it gets no credit."
)
#: A number as written in prose: optional sign, digits with thousands commas, decimals.
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
#: Rollouts with fewer generated tokens than this are skipped (as in Atropos 0.4).
MIN_COMPLETION_TOKENS = 10


def gold_answer(answer_field: str) -> str:
    r"""The final answer of a GSM8K ``answer`` field: the text after the last ``#``, no commas.

    Args:
        answer_field: e.g. ``"... so she has 1,200 left.\n#### 1,200"``.

    Returns:
        e.g. ``"1200"``.
    """
    return answer_field.split("#")[-1].strip().replace(",", "")


def _math_verify_kwargs() -> tuple[dict[str, Any], dict[str, Any]]:
    """Timeout kwargs for math-verify: its timeouts use signal.alarm (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        return {}, {}
    return {"parsing_timeout": None}, {"timeout_seconds": None}


def parse_gold(gold: str) -> list[Any]:
    r"""Parse a gold number as ``\boxed{gold}`` with math-verify (first match, LaTeX only).

    Returns:
        math-verify's parse result; empty when it could not be parsed.
    """
    from math_verify import LatexExtractionConfig, parse

    parse_kw, _ = _math_verify_kwargs()
    return parse(
        "\\boxed{" + gold + "}",
        extraction_mode="first_match",
        extraction_config=[LatexExtractionConfig()],
        **parse_kw,
    )


def score_answer(completion: str, gold_parsed: list[Any], answer_format: str = "boxed") -> bool:
    r"""Whether the completion's final ``\boxed{}`` (after the last ``</think>``) equals the gold.

    Parsed with math-verify's ``LatexExtractionConfig`` (boxed answers preferred, basic LaTeX,
    units and equations normalised, no extraction without an anchor) and compared with
    ``verify``.

    With ``answer_format="last_number"`` a reply without any ``\boxed{}`` is judged by its last
    number instead (for small models that never write ``\boxed{}``, e.g. the bundled
    SmolLM2-135M); a ``\boxed{}`` answer, when present, still decides.

    Args:
        completion: the model's reply.
        gold_parsed: :func:`parse_gold` of the gold answer.
        answer_format: ``"boxed"`` (Atropos 0.4) or ``"last_number"``.

    Returns:
        True when math-verify finds them equal.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.parser import NormalizationConfig

    parse_kw, verify_kw = _math_verify_kwargs()
    answer = parse(
        completion.split("</think>")[-1],
        extraction_config=[
            LatexExtractionConfig(
                normalization_config=NormalizationConfig(
                    nits=False,
                    malformed_operators=False,
                    basic_latex=True,
                    boxed="all",
                    units=True,
                ),
                boxed_match_priority=0,
                try_extract_without_anchor=False,
            )
        ],
        extraction_mode="first_match",
        **parse_kw,
    )
    if not answer and answer_format == "last_number":
        numbers = _NUMBER.findall(completion.split("</think>")[-1])
        if numbers:
            answer = parse(
                numbers[-1].replace(",", "").rstrip("."),
                extraction_config=[ExprExtractionConfig()],
                **parse_kw,
            )
    return bool(answer) and bool(verify(answer, gold_parsed, **verify_kw))


def length_penalised(scores: list[float], lengths: list[int], max_token_length: int) -> list[float]:
    """Atropos 0.4's GSM8K length penalty, applied only when every score is 1.0.

    With ``threshold = 0.5 * max_token_length``, a sequence of ``L`` tokens keeps 1.0 when
    ``L <= threshold`` and gets ``1 - min(1, (L - threshold) / (max_token_length - threshold))``
    otherwise, so among all-correct groups shorter answers are preferred.

    Args:
        scores: ``[G]`` scores in {-1.0, 1.0}.
        lengths: ``[G]`` full sequence lengths (prompt + completion) in tokens.
        max_token_length: the env's ``max_token_length`` (> 0).

    Returns:
        ``[G]`` new scores (the input when not all are 1.0).

    Raises:
        ValueError: ``max_token_length`` <= 0 or the lists differ in length.
    """
    if max_token_length <= 0:
        raise ValueError(
            f"max_token_length must be > 0 for the length penalty, got {max_token_length}"
        )
    if len(scores) != len(lengths):
        raise ValueError(f"{len(scores)} scores but {len(lengths)} lengths")
    if not scores or any(s != 1.0 for s in scores):
        return list(scores)
    threshold = 0.5 * max_token_length
    return [
        1.0
        if length <= threshold
        else 1.0 - min(1.0, (length - threshold) / (max_token_length - threshold))
        for length in lengths
    ]


class GSM8kEnvConfig(BaseEnvConfig):
    """Settings of :class:`GSM8kEnv` (plus everything in ``BaseEnvConfig``)."""

    dataset_name: str = Field(
        default="openai/gsm8k",
        description="Hub dataset id (with dataset_config), or a local directory holding "
        "train.jsonl and test.jsonl (fields question, answer with '#### <number>').",
    )
    dataset_config: str = Field(default="main", description="Hub dataset configuration.")
    eval_limit: int | None = Field(
        default=None,
        ge=1,
        description="Evaluate on the first N questions of the (seed-42 shuffled) test split; "
        "null = all 1319.",
    )
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature of rollouts.")
    eval_temperature: float = Field(
        default=0.6, ge=0, description="Sampling temperature of evaluation answers."
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Completion budget per answer in tokens; null = max_token_length minus "
        "the prompt (never more than fits in max_token_length).",
    )
    system_prompt: str = Field(
        default=SYSTEM_PROMPT,
        description="System prompt; '{max_tokens}' is replaced by the completion budget. "
        "An empty string sends no system message.",
    )
    answer_format: Literal["boxed", "last_number"] = Field(
        default="boxed",
        description="boxed: only a \\boxed{} answer counts (Atropos 0.4). last_number: a reply "
        "without \\boxed{} is judged by its last number (gives tiny models like the bundled "
        "SmolLM2-135M, which never writes \\boxed{}, a non-zero reward).",
    )
    seed: int = Field(default=42, description="Shuffling seed of both splits.")


class GSM8kEnv(BaseEnv):
    """GSM8K with math-verify rewards (+1 right, -1 wrong) and Atropos 0.4's length penalty."""

    name = "gsm8k"
    env_config_cls = GSM8kEnvConfig

    @classmethod
    def config_init(cls) -> tuple[GSM8kEnvConfig, list[APIServerConfig]]:
        """Defaults: bundled tokenizer, groups of 8, stock vLLM at 127.0.0.1:9100 (managed mode)."""
        config = GSM8kEnvConfig(
            tokenizer_name=str(bundled_model_dir()),
            group_size=8,
            use_wandb=False,
            rollout_server_url=DEFAULT_API_URL,
            total_steps=1000,
            steps_per_eval=100,
            max_token_length=2048,
            wandb_name="gsm8k",
        )
        server = APIServerConfig(
            model_name=DEFAULT_INFERENCE_MODEL,
            base_url=DEFAULT_INFERENCE_URL,
            api_key="x",
            server_type="vllm",
            num_requests_for_eval=256,
        )
        return config, [server]

    async def setup(self) -> None:
        """Load and shuffle (seed 42) both splits; start at item 0."""
        train, test = await asyncio.to_thread(self._load_splits)
        random.Random(self.config.seed).shuffle(train)
        random.Random(self.config.seed).shuffle(test)
        self.train = train
        self.test = [
            {"question": r["question"], "gold_answer": gold_answer(r["answer"])} for r in test
        ]
        if self.config.eval_limit is not None:
            self.test = self.test[: self.config.eval_limit]
        self.iter = 0
        self.percent_correct_buffer: list[float] = []
        self.eval_metrics: list[tuple[str, float]] = []

    def _load_splits(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Read the train and test rows from a local directory or the hub.

        Raises:
            ConfigError: the dataset cannot be read or lacks the question/answer fields.
        """
        import datasets

        from atroposlib.errors import ConfigError

        name = self.config.dataset_name
        path = Path(name).expanduser()
        try:
            if path.is_dir():
                files = {s: path / f"{s}.jsonl" for s in ("train", "test")}
                missing = [str(f) for f in files.values() if not f.is_file()]
                if missing:
                    raise ConfigError(
                        f"--env.dataset_name {name}: a local GSM8K directory needs train.jsonl and "
                        f"test.jsonl; missing {', '.join(missing)}"
                    )
                ds = datasets.load_dataset("json", data_files={s: str(f) for s, f in files.items()})
            elif name.startswith((".", "/", "~")) or path.exists():
                raise ConfigError(
                    f"--env.dataset_name {name}: no such directory (resolved to "
                    f"{path.resolve()}); relative paths are taken from the current directory"
                )
            else:
                ds = datasets.load_dataset(name, self.config.dataset_config)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with the fix
            raise ConfigError(
                f"cannot load GSM8K from {name!r}: {type(exc).__name__}: {exc}. Pass a local "
                "directory with train.jsonl/test.jsonl (--env.dataset_name DIR), or run once "
                "online so the hub dataset is cached (HF_DATASETS_OFFLINE=1 blocks downloads)"
            ) from exc
        splits = []
        for split in ("train", "test"):
            rows = [dict(r) for r in ds[split]]
            if rows and not {"question", "answer"} <= rows[0].keys():
                raise ConfigError(
                    f"GSM8K {split} rows need 'question' and 'answer' fields; {name!r} has "
                    f"{sorted(rows[0])}"
                )
            splits.append(rows)
        return splits[0], splits[1]

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Checkpoint the position in the training split (``iter``)."""
        super().save_checkpoint(step, {**(data or {}), "iter": self.iter})

    async def get_next_item(self) -> dict[str, Any]:
        """The next training question (cycling through the shuffled split)."""
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return {"question": row["question"], "gold_answer": gold_answer(row["answer"])}

    def messages(self, question: str, max_tokens: int) -> list[dict[str, str]]:
        """Chat prompt: the system prompt (if any) and the question."""
        msgs = []
        if self.config.system_prompt:
            msgs.append(
                {
                    "role": "system",
                    "content": self.config.system_prompt.replace("{max_tokens}", str(max_tokens)),
                }
            )
        msgs.append({"role": "user", "content": question})
        return msgs

    def _budget(self, question: str) -> tuple[list[dict[str, str]], int]:
        """Messages and a completion budget that fits ``max_token_length`` with the prompt.

        Raises:
            ValueError: the prompt alone fills ``max_token_length``.
        """
        wanted = self.config.max_tokens or self.config.max_token_length
        messages = self.messages(question, wanted)
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        prompt_len = len(self.tokenizer.encode(text, add_special_tokens=False))
        room = self.config.max_token_length - prompt_len
        if room < 1:
            raise ValueError(
                f"the prompt is {prompt_len} tokens, which fills max_token_length "
                f"({self.config.max_token_length}); raise --env.max_token_length"
            )
        return messages, min(wanted, room)

    async def collect_trajectories(
        self, item: dict[str, Any]
    ) -> tuple[ScoredDataGroup | None, list[Any]]:
        """Sample ``group_size`` answers in one request (managed: exact tokens), then score them."""
        messages, max_tokens = self._budget(item["question"])
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages,
                n=self.config.group_size,
                max_tokens=max_tokens,
                temperature=self.config.temperature,
            )
            nodes = managed.get_state()["nodes"]
        rollouts = [
            {
                "text": choice.message.content or "",
                "finish_reason": choice.finish_reason,
                "node": node,
                "messages": messages
                + [{"role": "assistant", "content": choice.message.content or ""}],
            }
            for choice, node in zip(completion.choices, nodes, strict=True)
        ]
        return self.score(rollouts, item["gold_answer"]), []

    def score(self, rollouts: list[dict[str, Any]], gold: str) -> ScoredDataGroup | None:
        """Score one group (the env's ``score`` hook).

        Args:
            rollouts: dicts with ``text``, ``finish_reason``, ``node`` (a managed-server
                ``SequenceNode``) and ``messages``.
            gold: the gold answer, e.g. ``"18"``.

        Returns:
            The group (tokens / masks / inference_logprobs / scores / messages), or None when
            the gold cannot be parsed, fewer than ``group_size`` rollouts are usable, or all
            scores end up equal (no GRPO signal) while ``ensure_scores_are_not_same`` is on.
        """
        gold_parsed = parse_gold(gold)
        if not gold_parsed:
            return None
        group = ScoredDataGroup(
            tokens=[],
            masks=[],
            scores=[],
            inference_logprobs=[],
            messages=[] if self.config.include_messages else None,
            generation_params={"temperature": self.config.temperature},
        )
        for rollout in rollouts:
            node = rollout["node"]
            generated = sum(1 for m in node.masked_tokens if m != IGNORE_INDEX)
            if generated < MIN_COMPLETION_TOKENS:
                continue
            correct = score_answer(rollout["text"], gold_parsed, self.config.answer_format)
            group["tokens"].append(list(node.tokens))
            group["masks"].append(list(node.masked_tokens))
            group["inference_logprobs"].append(list(node.logprobs))
            group["scores"].append(1.0 if correct else -1.0)
            if group["messages"] is not None:
                group["messages"].append(rollout["messages"])
            if len(group["tokens"]) >= self.config.group_size:
                break
        self.percent_correct_buffer.extend(max(s, 0.0) for s in group["scores"])
        if len(group["tokens"]) < self.config.group_size:
            return None
        group["scores"] = length_penalised(
            group["scores"], [len(t) for t in group["tokens"]], self.config.max_token_length
        )
        if self.config.ensure_scores_are_not_same and len(set(group["scores"])) == 1:
            return None
        return group

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Accuracy on the test split (``eval_limit`` questions), one answer each.

        Returns:
            ``{"eval/percent_correct", "eval/finished_fraction", "eval/num_questions"}``.
        """
        start = time.time()
        sem = asyncio.Semaphore(max(1, self.config.max_eval_workers))

        async def one(item: dict[str, Any]) -> dict[str, Any]:
            messages, max_tokens = self._budget(item["question"])
            async with sem:
                completion = await self.server.chat_completion(
                    messages=messages,
                    n=1,
                    max_tokens=max_tokens,
                    temperature=self.config.eval_temperature,
                    split="eval",
                )
            choice = completion.choices[0]
            text = choice.message.content or ""
            gold_parsed = parse_gold(item["gold_answer"])
            correct = bool(gold_parsed) and score_answer(
                text, gold_parsed, self.config.answer_format
            )
            return {
                "question": item["question"],
                "gold_answer": item["gold_answer"],
                "response": text,
                "finish_reason": choice.finish_reason,
                "score": 1 if correct else 0,
            }

        samples = await asyncio.gather(*(one(item) for item in self.test))
        n = max(1, len(samples))
        metrics = {
            "eval/percent_correct": sum(s["score"] for s in samples) / n,
            "eval/finished_fraction": sum(s["finish_reason"] == "stop" for s in samples) / n,
            "eval/num_questions": float(len(samples)),
        }
        self.eval_metrics = [("eval/percent_correct", metrics["eval/percent_correct"])]
        self.evaluate_log(
            metrics,
            start_time=start,
            end_time=time.time(),
            samples=samples,
            generation_parameters={
                "temperature": self.config.eval_temperature,
                "max_tokens": self.config.max_tokens or self.config.max_token_length,
            },
        )
        return metrics

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Add ``train/percent_correct`` (since the last call) and the latest eval metrics."""
        metrics = dict(metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(
                self.percent_correct_buffer
            )
            self.percent_correct_buffer = []
        for key, value in self.eval_metrics:
            metrics[key] = value
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    GSM8kEnv.cli()
