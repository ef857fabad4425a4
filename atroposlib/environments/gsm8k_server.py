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

    python environments/gsm8k_server.py process --env.dataset_name openai/gsm8k \
        --env.total_steps 4 --env.group_size 4 --env.data_path_to_save_groups out.jsonl \
        --openai.base_url http://127.0.0.1:9100/v1 --openai.model_name smollm2
    python environments/gsm8k_server.py evaluate --env.dataset_name openai/gsm8k \
        --env.eval_limit 100 --openai.base_url http://127.0.0.1:9100/v1
    python environments/gsm8k_server.py serve ...   # with run-api and a trainer

The bundled SmolLM2-135M-Instruct is weak at GSM8K (a few percent): the reward is real but
sparse. ``environments/arithmetic_server.py`` is the better task for seeing learning on a CPU.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from typing import Any, Literal

from pydantic import Field

from atroposlib.envs.base import ScoredDataGroup
from atroposlib.envs.data import load_rows
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from atroposlib.errors import ConfigError, RolloutError

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


def length_penalised(scores: list[float], lengths: list[int], max_seq_len: int) -> list[float]:
    """Atropos 0.4's GSM8K length penalty, applied only when every score is 1.0.

    With ``threshold = 0.5 * max_seq_len``, a sequence of ``L`` tokens keeps 1.0 when
    ``L <= threshold`` and gets ``1 - min(1, (L - threshold) / (max_seq_len - threshold))``
    otherwise, so among all-correct groups shorter answers are preferred.

    Args:
        scores: ``[G]`` scores in {-1.0, 1.0}.
        lengths: ``[G]`` full sequence lengths (prompt + completion) in tokens.
        max_seq_len: the env's ``max_seq_len`` (> 0).

    Returns:
        ``[G]`` new scores (the input when not all are 1.0).

    Raises:
        ValueError: ``max_seq_len`` <= 0 or the lists differ in length.
    """
    if max_seq_len <= 0:
        raise ValueError(
            f"max_token_length must be > 0 for the length penalty, got {max_seq_len}"
        )
    if len(scores) != len(lengths):
        raise ValueError(f"{len(scores)} scores but {len(lengths)} lengths")
    if not scores or any(s != 1.0 for s in scores):
        return list(scores)
    threshold = 0.5 * max_seq_len
    return [
        1.0
        if length <= threshold
        else 1.0 - min(1.0, (length - threshold) / (max_seq_len - threshold))
        for length in lengths
    ]


class GSM8kEnvConfig(SingleTurnEnvConfig):
    """Settings of :class:`GSM8kEnv` (plus everything in ``SingleTurnEnvConfig``)."""

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
    max_token_length: int = Field(
        default=2048, ge=1, description="Longest sequence (prompt + completion) in tokens."
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


class GSM8kEnv(SingleTurnEnv):
    """GSM8K with math-verify rewards (+1 right, -1 wrong) and Atropos 0.4's length penalty."""

    name = "gsm8k"
    env_config_cls = GSM8kEnvConfig
    send_messages = False  # token-only groups unless --env.include_messages
    min_completion_tokens = MIN_COMPLETION_TOKENS
    server_defaults = {"num_requests_for_eval": 256}

    async def setup(self) -> None:
        """Load and shuffle (seed ``seed``) both splits; keep ``eval_limit`` test questions."""
        c = self.config
        train, test = await asyncio.to_thread(self._load_splits)
        random.Random(c.seed).shuffle(train)
        random.Random(c.seed).shuffle(test)
        self.train_items = train
        self.eval_items = test[: c.eval_limit] if c.eval_limit is not None else test

    def _load_splits(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """Train and test items ``{"question", "answer"}`` (the gold number).

        Raises:
            ConfigError: the dataset cannot be read or lacks the question/answer fields.
        """
        c = self.config
        splits = []
        for split in ("train", "test"):
            rows = load_rows(c.dataset_name, split, c.dataset_config)
            if rows and not {"question", "answer"} <= rows[0].keys():
                raise ConfigError(
                    f"GSM8K {split} rows need 'question' and 'answer' fields; "
                    f"{c.dataset_name!r} has {sorted(rows[0])}"
                )
            splits.append(
                [{"question": r["question"], "answer": gold_answer(r["answer"])} for r in rows]
            )
        return splits[0], splits[1]

    def prompt(self, item: dict[str, str]) -> list[dict[str, str]]:
        """The system prompt (if any; ``{max_tokens}`` = the wanted budget) and the question."""
        wanted = self.config.max_tokens or self.config.max_seq_len
        msgs = []
        if self.config.system_prompt:
            msgs.append(
                {"role": "system",
                 "content": self.config.system_prompt.replace("{max_tokens}", str(wanted))}
            )
        msgs.append({"role": "user", "content": item["question"]})
        return msgs

    def max_tokens_for(self, messages: list[dict[str, str]]) -> int:
        """``max_tokens`` (default: all the room), never more than fits in ``max_token_length``.

        Raises:
            ValueError: the prompt alone fills ``max_token_length``.
        """
        wanted = self.config.max_tokens or self.config.max_seq_len
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        prompt_len = len(self.tokenizer.encode(text, add_special_tokens=False))
        room = self.config.max_seq_len - prompt_len
        if room < 1:
            raise ValueError(
                f"the prompt is {prompt_len} tokens, which fills max_token_length "
                f"({self.config.max_seq_len}); raise --env.max_token_length"
            )
        return min(wanted, room)

    def score(self, item: dict[str, str], completion: str) -> float:
        """+1.0 when math-verify finds the gold number in the reply's final answer, else -1.0.

        Raises:
            RolloutError: the gold answer cannot be parsed (the group is dropped, an eval
                item is counted as failed, never as wrong).
        """
        gold = parse_gold(item["answer"])
        if not gold:
            raise RolloutError(f"cannot parse the gold answer {item['answer']!r}")
        return 1.0 if score_answer(completion, gold, self.config.answer_format) else -1.0

    def finish_group(self, item: dict[str, str], group: ScoredDataGroup) -> ScoredDataGroup:
        """Apply :func:`length_penalised` (all-correct groups prefer shorter answers)."""
        group["scores"] = length_penalised(
            group["scores"], [len(t) for t in group["tokens"]], self.config.max_seq_len
        )
        return group

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """SingleTurnEnv's metrics plus Atropos's names for two of them.

        ``eval/percent_correct`` (= ``eval/accuracy``) and ``eval/num_questions``
        (= ``eval/num_items``).
        """
        metrics = super().eval_metrics(samples)
        metrics["eval/percent_correct"] = metrics["eval/accuracy"]
        metrics["eval/num_questions"] = metrics["eval/num_items"]
        return metrics


if __name__ == "__main__":
    GSM8kEnv.cli()
