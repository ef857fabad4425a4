"""Tests of the reward-function registry and the built-in rewards."""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import pytest

from atroposlib.errors import RolloutError
from atroposlib.rewards import RewardFunction, get_content, registry
from atroposlib.rewards.cosine_length_reward import cosine_schedule
from atroposlib.rewards.registry import RewardRegistry


def test_lazy_create_r1_in_fresh_process_yields_r1_reward():
    # Upstream's lazy loader registered AccuracyXReward under "r1" (alphabetical first class).
    code = (
        "from atroposlib.rewards import registry\n"
        "r = registry.create('r1')\n"
        "print(type(r).__name__, type(registry.create('accuracyx')).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["R1Reward", "AccuracyXReward"]


def test_registered_names_and_create_forms():
    names = registry.list_registered()
    for expected in ("accuracy", "format", "cosinelength", "repetitionpenalty",
                     "reasoningsteps", "formatreasoning", "accuracyx", "r1", "combined",
                     "cosinescaled", "crosswordformat", "chandasmeter", "cascadingr1math"):
        assert expected in names
    r = registry.create({"type": "format", "weight": 2.0, "params": {"preferred_tags": ["a"]}})
    assert r.weight == 2.0 and r.preferred_tags == ["a"]
    assert registry.create(r) is r


def test_unknown_names_and_bad_specs_explain_the_fix():
    with pytest.raises(KeyError, match="registered: accuracy"):
        registry.create("nope")
    with pytest.raises(ValueError, match="no 'type'"):
        registry.create({"weight": 1.0})
    with pytest.raises(TypeError, match="unknown options"):
        registry.create("format", bogus=1)


def test_private_registry_and_legacy_function():
    reg = RewardRegistry()

    @reg.register
    def length_reward(completions, **kw):
        return [len(get_content(c)) for c in completions]

    r = reg.create({"type": "length_reward", "weight": 0.5})
    assert r(["ab", {"role": "assistant", "content": "abcd"}]) == [1.0, 2.0]
    with pytest.raises(TypeError):
        reg.register(int)


def test_get_content_shapes():
    assert get_content("x") == "x"
    assert get_content({"message": {"content": "y"}}) == "y"
    assert get_content([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert get_content({"content": [{"type": "text", "text": "p"}, {"type": "text", "text": "q"}]}) == "pq"
    with pytest.raises(TypeError, match="cannot extract"):
        get_content(42)


class _Broken(RewardFunction):
    def compute(self, completions, **kw):
        raise ZeroDivisionError("boom")


class _WrongCount(RewardFunction):
    def compute(self, completions, **kw):
        return [1.0]


class _NaN(RewardFunction):
    def compute(self, completions, **kw):
        return [math.nan for _ in completions]


@pytest.mark.parametrize("cls,match", [(_Broken, "ZeroDivisionError: boom"),
                                        (_WrongCount, "returned 1 scores for 2"),
                                        (_NaN, "non-finite")])
def test_failing_reward_raises_rollout_error_never_zero(cls, match):
    with pytest.raises(RolloutError, match=match):
        cls()(["a", "b"])


def test_accuracy_math_verify():
    acc = registry.create("accuracy")
    scores = acc(["<think>1/2?</think> so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "\\boxed{3}",
                  "<think>\\boxed{0.5}</think> I give up"], solution="0.5")
    assert scores == [1.0, 1.0, 0.0, 0.0]
    assert acc.metrics["reward/accuracy/mean_raw"] == 0.5
    # per-completion solutions, and a length mismatch is a clear error
    assert acc(["\\boxed{2}", "\\boxed{3}"], solution=["2", "4"]) == [1.0, 0.0]
    with pytest.raises(RolloutError, match="one\\s+solution per completion"):
        acc(["\\boxed{2}"], solution=["2", "3"])
    with pytest.raises(RolloutError, match="needs solution"):
        acc(["\\boxed{2}"])
    # box-spamming is not rewarded
    spam = " ".join(f"\\boxed{{{i}}}" for i in range(10))
    assert acc([spam], solution="3") == [0.0]


def test_accuracy_works_off_the_main_thread():
    acc = registry.create("accuracy")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("s", acc(["\\boxed{7}"], solution="7")))
    t.start()
    t.join()
    assert out["s"] == [1.0]


def test_format_reward():
    fmt = registry.create("format")
    texts = ["<think>a</think><answer>b</answer>", "<THINK>a</THINK>", "<think></think>",
             "<think>a</think><think>b</think>"]
    assert fmt(texts) == [1.0, 0.5, 0.0, 0.0]
    strict = registry.create("format", require_all_tags=True, case_sensitive=True)
    assert strict(texts[:2]) == [1.0, 0.0]


def test_cosine_schedule_endpoints_and_shape():
    assert cosine_schedule(0, 100, 1.0, 0.5) == pytest.approx(1.0)
    assert cosine_schedule(100, 100, 1.0, 0.5) == pytest.approx(0.5)
    assert cosine_schedule(50, 100, 1.0, 0.5) == pytest.approx(0.75)


def test_cosine_length_reward_prefers_short_correct_and_long_wrong():
    r = registry.create("cosinelength", max_length=100)
    short_ok, long_ok, short_bad, long_bad, exceed = r(
        ["a"] * 5, correct=[True, True, False, False, True], lengths=[10, 90, 10, 90, 100])
    assert short_ok > long_ok > 0 > long_bad > short_bad
    assert exceed == -1.0
    # correctness through math-verify, length in words
    s = r(["\\boxed{4}", "\\boxed{5}"], solution="4")
    assert s[0] > 0.99 and s[1] < -0.99


def test_repetition_penalty():
    r = registry.create("repetitionpenalty")
    varied = "the quick brown fox jumps over the lazy dog near a river bank"
    loop = "I think so. " * 20
    a, b = r([varied, loop])
    assert a == 0.0
    assert -1.0 <= b < -0.8


def test_reasoning_steps():
    r = registry.create("reasoningsteps")
    stepped = "Step 1: read the problem.\nStep 2: add the numbers.\nStep 3: check the sum twice."
    flat = "The answer is obviously four because two and two make four when added."
    one = "Step 1: we add two and two together carefully to obtain the answer four."
    s, f, o = r([stepped, flat, one])
    assert s == 1.0 and f == pytest.approx(0.1) and f < o < s
    assert r(["Step 1: x"]) == [0.0]  # too short


def test_r1_and_accuracyx():
    r1 = registry.create("r1")
    assert r1(["<think>2+2</think> \\boxed{4}", "\\boxed{4}", "<think>x</think> \\boxed{5}",
               "<think>a</think><think>b</think> \\boxed{4}"], solution="4") == [1.5, 1.0, 0.5, 1.0]
    ax = registry.create("accuracyx")
    assert ax(["<think>..</think> It is Paris.", "London"], solution="paris") == [1.0, 0.0]
    exact = registry.create("accuracyx", exact_match=True)
    assert exact(["paris", "It is Paris"], solution="Paris") == [1.0, 0.0]
    fr = registry.create("formatreasoning")
    assert fr(["<think>a</think>b", "<think>a</think>"]) == [0.5, 0.0]


def test_combined_reward_sum_and_normalisation():
    spec = {"type": "combined",
            "rewards": [{"type": "format", "weight": 1.0}, {"type": "accuracy", "weight": 2.0}]}
    texts = ["<think>a</think><answer>\\boxed{4}</answer>", "\\boxed{4}", "nothing"]
    assert registry.create(spec)(texts, solution="4") == [3.0, 2.0, 0.0]
    c = registry.create({**spec, "normalization": "sum"})
    assert c(texts, solution="4") == pytest.approx([1.0, 2 / 3, 0.0])
    assert "reward/accuracy/mean_raw" in c.metrics and "reward/combined/mean_raw" in c.metrics
    mm = registry.create({**spec, "normalization": "minmax"})
    assert mm(texts, solution="4") == pytest.approx([1.0, 2 / 3, 0.0])
    with pytest.raises(ValueError, match="needs rewards"):
        registry.create("combined")
    # a failing sub-reward makes the whole combination raise
    with pytest.raises(RolloutError, match="accuracy"):
        registry.create(spec)(texts)


def test_load_required_functions():
    fns = registry.load_required_functions({"reward_funcs": ["format", {"type": "r1"}]})
    assert [f.name for f in fns] == ["format", "r1"]
    assert registry.load_required_functions(None) == []
