"""check_env drives real env code against the FakeServer and enforces the group contract."""

from __future__ import annotations

import pytest

from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB
from atroposlib.env_runtime.checks import check_env, check_group
from atroposlib.testing.fake_server import FakeServer, fake_logprob
from tests.fixtures.sample_envs import ArithmeticEnv, SingleRolloutEnv


def _answers(request):
    # Choice 0 is right, the others wrong, so scores differ within a group.
    return "The answer is 42." if request.index == 0 else "No idea."


@pytest.mark.parametrize("tokenizer", ["tiny", "bundled"])
async def test_check_env_managed_groups_align_tokens_masks_and_logprobs(tokenizer, request):
    if tokenizer == "tiny":
        tokenizer_dir = request.getfixturevalue("tiny_tokenizer_dir")
    else:
        tokenizer_dir = request.getfixturevalue("bundled_model_dir")  # real SmolLM2 vocab/template
    server = FakeServer(_answers)
    groups = await check_env(
        ArithmeticEnv, server=server, config_overrides={"tokenizer_name": str(tokenizer_dir)},
        num_groups=2,
    )
    assert len(groups) == 2
    group = groups[0]
    assert len(group["tokens"]) == 4
    for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"], strict=True):
        prompt_len = masks.index(next(m for m in masks if m != IGNORE_INDEX))
        assert prompt_len > 0
        assert all(m == IGNORE_INDEX for m in masks[:prompt_len])
        assert logprobs[:prompt_len] == [MASKED_LOGPROB] * prompt_len
        # Generated positions carry exactly the sampler's log-prob of that token.
        assert logprobs[prompt_len:] == [fake_logprob(t) for t in tokens[prompt_len:]]
        assert masks[prompt_len:] == tokens[prompt_len:]
    # The server got the rendered prompt as token ids, n=4 in ONE request.
    token_requests = [r for r in server.requests if r.kind == "tokens"]
    assert len(token_requests) == 2 and token_requests[0].n == 4


async def test_default_aggregation_carries_inference_logprobs(tiny_tokenizer_dir):
    groups = await check_env(
        SingleRolloutEnv, server=FakeServer(["ab", "abcd", "a", "abc"]),
        config_overrides={"tokenizer_name": str(tiny_tokenizer_dir), "group_size": 4},
    )
    group = groups[0]
    assert group["inference_logprobs"] is not None
    assert len(group["inference_logprobs"]) == 4
    assert sorted(group["scores"]) == [1.0, 2.0, 3.0, 4.0]
    # Optional fields nobody set stay None (upstream turned them into empty lists).
    assert group["advantages"] is None and group["ref_logprobs"] is None


def test_check_group_rejects_binary_masks():
    group = {"tokens": [[5, 6, 7], [5, 6, 8]], "masks": [[0, 1, 1], [0, 1, 1]], "scores": [1.0, 0.0]}
    with pytest.raises(AssertionError, match="label vector"):
        check_group(group, expected_size=2)


def test_check_group_rejects_wrong_size_and_bad_logprobs():
    good = {"tokens": [[5, 6, 7]], "masks": [[-100, 6, 7]], "scores": [1.0],
            "inference_logprobs": [[1.0, -0.5, -0.2]]}
    check_group(good, expected_size=1)
    with pytest.raises(AssertionError, match="group_size is 2"):
        check_group(good, expected_size=2)
    bad = {**good, "inference_logprobs": [[-0.3, -0.5, -0.2]]}
    with pytest.raises(AssertionError, match="masked position"):
        check_group(bad, expected_size=1)
    nan = {**good, "scores": [float("nan")]}
    with pytest.raises(AssertionError, match="finite"):
        check_group(nan, expected_size=1)


async def test_check_env_reports_exceptions_from_the_env(tiny_tokenizer_dir):
    class Broken(ArithmeticEnv):
        async def collect_trajectories(self, item):
            raise KeyError("answer")

    with pytest.raises(AssertionError, match="collect_trajectories raised KeyError"):
        await check_env(Broken, config_overrides={"tokenizer_name": str(tiny_tokenizer_dir)})
