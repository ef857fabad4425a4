"""Code generation (MBPP/HumanEval style): the model writes Python, sandboxed tests score it."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import secrets
from typing import Any, Literal

from pydantic import Field

from atroposlib.envs.data import load_rows, maybe_json
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from atroposlib.utils.sandbox import (
    NONE_RISK,
    SandboxError,
    SandboxLimits,
    arun_python,
    isolation_support,
    resolve_backend,
)

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Write a correct, self-contained solution. Reply with "
    "the complete code in one ```python code block."
)

#: Small offline problem set in the MBPP schema (written for this package).
BUILTIN_PROBLEMS: list[dict[str, Any]] = [
    {"text": "Write a function add(a, b) that returns the sum of two numbers.",
     "test_list": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"]},
    {"text": "Write a function is_even(n) that returns True when the integer n is even.",
     "test_list": ["assert is_even(4) is True", "assert is_even(7) is False", "assert is_even(0) is True"]},
    {"text": "Write a function reverse_string(s) that returns s reversed.",
     "test_list": ["assert reverse_string('abc') == 'cba'", "assert reverse_string('') == ''",
                   "assert reverse_string('racecar') == 'racecar'"]},
    {"text": "Write a function max_of_list(xs) that returns the largest element of a non-empty list.",
     "test_list": ["assert max_of_list([1, 5, 3]) == 5", "assert max_of_list([-4, -2]) == -2",
                   "assert max_of_list([7]) == 7"]},
    {"text": "Write a function count_vowels(s) that counts the vowels (a, e, i, o, u, any case) in s.",
     "test_list": ["assert count_vowels('hello') == 2", "assert count_vowels('SKY') == 0",
                   "assert count_vowels('AEiou') == 5"]},
    {"text": "Write a function factorial(n) that returns n! for n >= 0.",
     "test_list": ["assert factorial(0) == 1", "assert factorial(5) == 120", "assert factorial(10) == 3628800"]},
    {"text": "Write a function fizzbuzz(n) returning 'Fizz' for multiples of 3, 'Buzz' for multiples "
             "of 5, 'FizzBuzz' for multiples of both, else str(n).",
     "test_list": ["assert fizzbuzz(9) == 'Fizz'", "assert fizzbuzz(10) == 'Buzz'",
                   "assert fizzbuzz(30) == 'FizzBuzz'", "assert fizzbuzz(7) == '7'"]},
    {"text": "Write a function square_list(xs) that returns a list of the squares of xs.",
     "test_list": ["assert square_list([1, 2, 3]) == [1, 4, 9]", "assert square_list([]) == []"]},
    {"text": "Write a function is_palindrome(s) that returns True when s reads the same backwards.",
     "test_list": ["assert is_palindrome('level') is True", "assert is_palindrome('ab') is False",
                   "assert is_palindrome('') is True"]},
    {"text": "Write a function sum_digits(n) that returns the sum of the decimal digits of n >= 0.",
     "test_list": ["assert sum_digits(123) == 6", "assert sum_digits(0) == 0", "assert sum_digits(9999) == 36"]},
    {"text": "Write a function unique_sorted(xs) that returns the distinct elements of xs in "
             "ascending order.",
     "test_list": ["assert unique_sorted([3, 1, 3, 2]) == [1, 2, 3]", "assert unique_sorted([]) == []"]},
    {"text": "Write a function gcd(a, b) returning the greatest common divisor of two positive integers.",
     "test_list": ["assert gcd(12, 18) == 6", "assert gcd(7, 13) == 1", "assert gcd(100, 10) == 10"]},
]

# The harness runs as main.py; the solution and the tests are files next to it. A per-run nonce
# (read from stdin, never on disk or in the environment) marks the harness's verdict, so a
# program that prints a fake verdict or exits early does not pass. It raises the bar against
# reward hacking; it is not proof against code that digs the nonce out of the harness's frames
# (the sandbox protects the host, not the verdict, from deliberately adversarial code).
_HARNESS = r"""
import json, sys
def _run():
    nonce = sys.stdin.readline().strip()
    tests = json.load(open("tests.json"))
    namespace = {"__name__": "__solution__"}
    passed, error = 0, None
    try:
        exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
    except BaseException as exc:
        error = "solution: %s: %s" % (type(exc).__name__, exc)
    else:
        for test in tests:
            try:
                exec(compile(test, "test", "exec"), namespace)
                passed += 1
            except BaseException as exc:
                error = error or "%s -> %s: %s" % (test[:200], type(exc).__name__, exc)
    sys.stdout.flush()
    sys.stdout.write("\n" + nonce + json.dumps({"passed": passed, "total": len(tests),
                                                "error": error}) + "\n")
    sys.stdout.flush()
_run()
"""


def extract_code(text: str) -> str:
    """The last fenced code block (```python or bare ```), else the whole reply."""
    blocks = re.findall(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", text, re.DOTALL)
    if blocks:
        return blocks[-1]
    opened = re.split(r"```(?:python|py)?[ \t]*\n", text)
    return opened[-1] if len(opened) > 1 else text


def normalise_problem(row: dict[str, Any]) -> dict[str, Any]:
    """``{"prompt", "tests": [code], "setup": code}`` from an MBPP or HumanEval row.

    MBPP: ``text`` (or ``prompt``), ``test_list``, optional ``test_setup_code``.
    HumanEval: ``prompt`` (signature + docstring), ``test`` (defines ``check``),
    ``entry_point``.

    Raises:
        KeyError: neither schema matches; the message lists the row's fields.
    """
    if "test_list" in row:
        tests = [str(t) for t in maybe_json(row["test_list"])]
        prompt = str(row.get("text") or row.get("prompt"))
        prompt += "\nYour code should pass these tests:\n" + "\n".join(tests)
        return {"prompt": prompt, "tests": tests, "setup": str(row.get("test_setup_code") or "")}
    if "test" in row and "entry_point" in row:
        prompt = ("Complete this Python function; reply with the whole function.\n\n"
                  f"```python\n{row['prompt']}```")
        return {"prompt": prompt, "tests": [f"{row['test']}\ncheck({row['entry_point']})"],
                "setup": ""}
    raise KeyError(f"row fields {sorted(row)} match neither MBPP (text, test_list) nor "
                   "HumanEval (prompt, test, entry_point)")


async def run_tests(code: str, problem: dict[str, Any], limits: SandboxLimits,
                    backend: str | None = None) -> dict[str, Any]:
    """Run ``code`` against the problem's tests in the sandbox.

    Args:
        code: the model's program.
        problem: ``{"tests": [code], "setup": code}`` (:func:`normalise_problem`).
        limits: the sandbox's resource limits.
        backend: the sandbox backend (``atroposlib.utils.sandbox.resolve_backend``); None:
            the strongest isolating one.

    Returns:
        ``{"passed", "total", "error", "timed_out", "backend"}``; ``passed`` is 0 when the
        harness's verdict is missing (crash, kill, timeout, early exit); ``backend`` is the
        one that ran the code.

    Raises:
        SandboxError: the sandbox cannot run code here, or could not start this run (a fault
            of the host or the configuration, never a verdict on the code).
    """
    nonce = secrets.token_hex(16)
    solution = (problem.get("setup") or "") + "\n" + code
    result = await arun_python(
        _HARNESS, stdin=nonce + "\n", limits=limits, backend=backend,
        files={"solution.py": solution, "tests.json": json.dumps(problem["tests"])},
    )
    total = len(problem["tests"])
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce):
            verdict = json.loads(line[len(nonce):])
            return {**verdict, "timed_out": result.timed_out, "backend": result.backend}
    error = "timed out" if result.timed_out else (result.stderr.strip()[-300:] or "no verdict")
    return {"passed": 0, "total": total, "error": error, "timed_out": result.timed_out,
            "backend": result.backend}


#: The self-test every env runs at setup: a known-good program against its test.
CANARY_PROBLEM: dict[str, Any] = {"tests": ["assert canary() == 42"], "setup": ""}
CANARY_CODE = "def canary():\n    return 6 * 7\n"


class CodeExecutionConfig(SingleTurnEnvConfig):
    """Settings of :class:`CodeExecutionEnv`."""

    dataset_name: str = Field(
        default="google-research-datasets/mbpp",
        description="Hub id or local file with MBPP (text, test_list) or HumanEval (prompt, "
        "test, entry_point) rows, or 'builtin' for the small offline problem set.",
    )
    dataset_config: str | None = Field(default="full", description="Hub dataset configuration.")
    split: str = Field(default="train", description="Split used for training.")
    eval_split: str = Field(default="test", description="Split used by evaluate.")
    eval_limit: int = Field(default=100, ge=1, description="Evaluate on at most this many rows.")
    limit: int | None = Field(default=None, description="Use at most this many training rows.")
    seed: int = Field(default=42, description="Shuffle seed.")
    partial_credit: bool = Field(
        default=False,
        description="Score 2 x (fraction of tests passed) - 1 instead of +1 (all pass) / -1.",
    )
    cpu_seconds: int = Field(default=5, ge=1, description="CPU seconds per program.")
    wall_seconds: float = Field(default=10.0, gt=0, description="Wall-clock seconds per program.")
    memory_mb: int = Field(default=1024, ge=64, description="Address space per process, MiB.")
    max_processes: int = Field(default=16, ge=2, description="Processes per program.")
    max_concurrent_runs: int = Field(default=2, ge=1, description="Programs run at once.")
    sandbox: Literal["auto", "bwrap", "unshare", "none"] = Field(
        default="auto",
        description="Sandbox backend for the model's code: 'auto' = bubblewrap, else unshare, "
        "and refuse to start when neither works. 'none' is an explicit opt-in to NO isolation "
        "(only on a host that is itself a disposable sandbox): " + NONE_RISK + ".",
    )
    max_tokens: int = Field(default=512, ge=1, description="Completion budget per rollout.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")


class CodeExecutionEnv(SingleTurnEnv):
    """Generated code runs in ``atroposlib.utils.sandbox``; +1 when every test passes, else -1.

    ``setup`` picks the sandbox backend (``--env.sandbox``; it refuses to start when no
    isolating backend works and ``none`` was not asked for) and runs a known-good program
    through it: a sandbox that cannot start the interpreter stops the env with the cause,
    instead of scoring every rollout -1. Every group records the backend in
    ``group_overrides["sandbox_backend"]``, every score's details in ``sandbox_backend``.

    Metrics (``train/`` and ``eval/``): ``all_passed``, ``fraction`` (of tests passed) and
    ``timed_out``; ``evaluate`` adds ``eval/pass_at_1`` and ``eval/test_pass_rate``.
    """

    name = "code_execution"
    env_config_cls = CodeExecutionConfig
    #: The sandbox backend every run of this env uses; set by :meth:`check_sandbox` in setup.
    sandbox_backend: str | None = None

    def _load(self, split: str, limit: int | None) -> list[dict[str, Any]]:
        c = self.config
        if c.dataset_name == "builtin":
            rows = list(BUILTIN_PROBLEMS)
        else:
            rows = load_rows(c.dataset_name, split, c.dataset_config, limit)
        return [normalise_problem(r) for r in rows]

    async def setup(self) -> None:
        c = self.config
        self.limits = SandboxLimits(
            cpu_seconds=c.cpu_seconds, wall_seconds=c.wall_seconds,
            memory_bytes=c.memory_mb * 1024 * 1024, max_processes=c.max_processes,
        )
        self.train_items = self._load(c.split, c.limit)
        if not self.train_items:
            raise ValueError(f"dataset {c.dataset_name!r} has no training problems")
        random.Random(c.seed).shuffle(self.train_items)
        self.sandbox_slots = asyncio.Semaphore(c.max_concurrent_runs)
        await self.check_sandbox()

    async def check_sandbox(self) -> None:
        """Pick the sandbox backend and run a known-good program through it.

        Raises:
            SandboxError: no isolating backend works and ``sandbox`` is not ``none``
                (``SandboxUnavailableError``), the sandbox cannot start the interpreter
                (``SandboxStartError``), or the known-good program did not pass; each message
                names the cause and the fix.
        """
        self.sandbox_backend = resolve_backend(self.config.sandbox)
        verdict = await run_tests(CANARY_CODE, CANARY_PROBLEM, self.limits, self.sandbox_backend)
        if verdict["passed"] != verdict["total"]:
            raise SandboxError(
                f"the code sandbox (backend {self.sandbox_backend!r}) failed its self-test: a "
                f"known-good program did not pass ({verdict['error']}); check the limits "
                "(--env.memory_mb, --env.cpu_seconds, --env.wall_seconds, --env.max_processes)")
        layers = [k for k, on in isolation_support(self.sandbox_backend).items() if on]
        logger.info("code sandbox: backend %s (isolation: %s)", self.sandbox_backend,
                    ", ".join(layers))

    def load_eval_items(self) -> list[dict[str, Any]]:
        """The eval split's problems (at most ``eval_limit``), loaded on the first evaluate."""
        return self._load(self.config.eval_split, self.config.eval_limit)

    def prompt(self, item):
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": item["prompt"]}]

    async def score_code(self, item, text: str) -> tuple[float, dict[str, Any]]:
        """Run the reply's code against the item's tests; return ``(score, details)``.

        ``details``: the sandbox verdict (``passed``, ``total``, ``error``) with
        ``all_passed``, ``fraction`` and ``timed_out`` as numbers, and ``sandbox_backend``.

        Raises:
            SandboxError: the sandbox could not start this run (the group is dropped, not
                scored).
        """
        async with self.sandbox_slots:
            verdict = await run_tests(extract_code(text), item, self.limits, self.sandbox_backend)
        fraction = verdict["passed"] / verdict["total"] if verdict["total"] else 0.0
        details = {"all_passed": float(fraction == 1.0), "fraction": fraction,
                   "timed_out": float(verdict["timed_out"]), "passed": verdict["passed"],
                   "total": verdict["total"], "error": verdict["error"],
                   "sandbox_backend": verdict["backend"]}
        if self.config.partial_credit:
            return 2.0 * fraction - 1.0, details
        return (1.0 if fraction == 1.0 else -1.0), details

    score = score_code

    def finish_group(self, item, group):
        """Record the sandbox backend that ran the group's code (``group_overrides``)."""
        group["group_overrides"] = {**(group.get("group_overrides") or {}),
                                    "sandbox_backend": self.sandbox_backend}
        return group

    def details_metrics(self, details, prefix):
        """Means of ``all_passed``, ``fraction`` and ``timed_out``."""
        return {f"{prefix}/{key}": sum(d[key] for d in details) / len(details)
                for key in ("all_passed", "fraction", "timed_out")} if details else {}

    def eval_metrics(self, samples):
        """SingleTurnEnv's metrics plus ``eval/pass_at_1`` and ``eval/test_pass_rate``."""
        metrics = super().eval_metrics(samples)
        if samples:
            metrics["eval/pass_at_1"] = metrics["eval/all_passed"]
            metrics["eval/test_pass_rate"] = metrics["eval/fraction"]
        return metrics


if __name__ == "__main__":
    CodeExecutionEnv.cli()
