"""What a policy gets wrong on the arithmetic env's held-out problems, by operator and kind of error.

The learning benchmark's evaluator (HF generate, greedy, fp32, the same held-out problems and
reply length) scores a policy directory, and each reply is put in one class:

* ``right``: scored 1 (the env's own ``score_reply``);
* ``truncated``: no end of turn within the reply length;
* ``no number``: the reply holds no number;
* ``sign``: the right magnitude with the wrong sign;
* ``carry``: off by exactly 1, 10 or 100 (a carry or borrow slipped);
* ``units digit``: otherwise off by less than 10;
* ``other``: any other wrong number.

Printed and written as counts per ``(operator, class)``, with accuracy per operator::

    python benchmarks/bench_arithmetic_errors.py --model runs/x/checkpoints/final --difficulty 4
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the classes of :func:`error_kind`, in report order
KINDS = ("right", "truncated", "no number", "sign", "carry", "units digit", "other")


def error_kind(answer: int, reply_number: str | None, finish_reason: str, score: float) -> str:
    """The class of one reply (see the module docstring).

    Args:
        answer: the true result.
        reply_number: the reply's final number as written (``final_number``), or None.
        finish_reason: ``"stop"`` or ``"length"``.
        score: the env's score of the reply (1.0 right, 0.0 wrong).

    Returns:
        One of :data:`KINDS`.
    """
    if score >= 1.0:
        return "right"
    if finish_reason == "length":
        return "truncated"
    if reply_number is None:
        return "no number"
    try:
        value = float(reply_number)
    except ValueError:
        return "no number"
    if answer != 0 and value == -answer:
        return "sign"
    off = abs(value - answer)
    if off in (1, 10, 100):
        return "carry"
    if off < 10:
        return "units digit"
    return "other"


def tally(problems: list[dict[str, Any]], kinds: list[str]) -> dict[str, Any]:
    """Counts per operator and class, and accuracy per operator.

    Args:
        problems: ``[N]`` held-out problems (``op`` each).
        kinds: ``[N]`` their classes (:func:`error_kind`).

    Returns:
        ``{"counts": {op: {kind: n}}, "accuracy": {op: share right}, "n": {op: problems}}``.
    """
    counts: dict[str, Counter] = {}
    for problem, kind in zip(problems, kinds, strict=True):
        counts.setdefault(problem["op"], Counter())[kind] += 1
    return {"counts": {op: {k: c[k] for k in KINDS if c[k]} for op, c in sorted(counts.items())},
            "accuracy": {op: round(c["right"] / sum(c.values()), 3) for op, c in sorted(counts.items())},
            "n": {op: sum(c.values()) for op, c in sorted(counts.items())}}


def main(argv: list[str] | None = None) -> int:
    """Score the policy, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="policy directory (HF format)")
    parser.add_argument("--difficulty", type=int, default=4, help="arithmetic difficulty")
    parser.add_argument("--eval-size", type=int, default=200, help="held-out problems scored")
    parser.add_argument("--eval-batch", type=int, default=25, help="prompts per generate call")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_arithmetic_errors_<date>.json)")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atroposlib.environments.arithmetic_server import (
        ArithmeticEnv,
        ArithmeticEnvConfig,
        final_number,
        heldout_problems,
        score_reply,
    )
    from benchmarks.learning.evaluate import greedy_replies

    cfg = ArithmeticEnvConfig(difficulty=args.difficulty, eval_size=args.eval_size)
    problems = heldout_problems(args.difficulty, cfg.heldout_fraction, cfg.eval_size, cfg.eval_seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    prompts = [tokenizer.apply_chat_template(ArithmeticEnv.messages(p), tokenize=False,
                                             add_generation_prompt=True) for p in problems]
    replies = greedy_replies(model, tokenizer, prompts, args.eval_batch)
    kinds = [error_kind(p["answer"], final_number(text), finish, score_reply(text, p["answer"], finish))
             for p, (text, finish) in zip(problems, replies, strict=True)]
    result = {"model": args.model, "difficulty": args.difficulty, "problems": len(problems),
              "accuracy_overall": round(kinds.count("right") / len(problems), 3), **tally(problems, kinds),
              "examples": [{"question": p["question"], "reply": text, "kind": kind}
                           for p, (text, _), kind in list(zip(problems, replies, kinds, strict=True))[:20]]}
    print(f"{result['accuracy_overall']:.1%} of {len(problems)} held-out problems right")
    for op, counts in result["counts"].items():
        print(f"{op}: {result['n'][op]} problems, {result['accuracy'][op]:.1%} right; {counts}")
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_arithmetic_errors"), "bench_arithmetic_errors",
                 result, seeds={"heldout_problems": cfg.eval_seed, "decoding": "greedy"}, argv=command_argv(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
