"""A group with failed or masked members trains its completed members exactly as a clean group.

Checked end to end: both groups go through run-api (``POST /scored_data``, ``GET /batch``) and
the trainer's :func:`example_trainer.data.batch_to_sequences`, for every advantage the trainer
computes from scores: GRPO (std-scaled) and Dr. GRPO (unscaled). The advantages must be equal
(``==``), not merely close.
"""

from __future__ import annotations

import httpx
import pytest

from atroposlib.api.factory import build_app
from atroposlib.api.settings import ApiSettings
from example_trainer.data import batch_to_sequences, group_advantages

REGISTRATION = {
    "wandb_group": "g", "wandb_project": "p", "batch_size": 10, "max_token_len": 256,
    "checkpoint_dir": "ckpt", "save_checkpoint_interval": 10, "starting_step": 0, "num_steps": 10,
}
# awkward values on purpose: sums and variances that round differently in another order
SCORES = [0.1, 0.7, 0.30000000000000004, 1e-3, 2.5]


def _members(n: int) -> tuple[list[list[int]], list[list[int]]]:
    tokens = [[1, 2, 10 + i, 20 + i] for i in range(n)]
    return tokens, [[-100, -100, 10 + i, 20 + i] for i in range(n)]


def _clean_group(env_id: int) -> dict:
    tokens, masks = _members(len(SCORES))
    return {"tokens": tokens, "masks": masks, "scores": SCORES, "env_id": env_id,
            "group_overrides": {"group_size": len(SCORES)}}


def _group_with_exclusions(env_id: int) -> dict:
    """The same 5 completed members, plus 2 failed and 1 masked member (a group of 8)."""
    tokens, masks = _members(len(SCORES))
    return {"tokens": tokens, "masks": masks, "scores": SCORES, "env_id": env_id,
            "rollout_ids": [f"g/{i}" for i in (0, 2, 3, 5, 7)], "attempts": [0, 1, 0, 0, 0],
            "excluded": [
                {"rollout_id": "g/1", "outcome": "failed", "kind": "timeout"},
                {"rollout_id": "g/4", "outcome": "failed", "kind": "env_error",
                 "message": "KeyError: 'answer'"},
                {"rollout_id": "g/6", "outcome": "masked", "reason": "truncated", "score": -9.0,
                 "tokens": [1, 2, 99, 98], "masks": [-100, -100, 99, 98]}]}


async def _served(group_fn) -> dict:
    """Post a group (twice) to a fresh run-api and return it as GET /batch serves it."""
    app = build_app(ApiSettings(allowed_hosts=["api"]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        assert (await c.post("/register", json=REGISTRATION)).status_code == 200
        await c.get("/batch")
        env = (await c.post("/register-env", json={
            "max_token_length": 256, "desired_name": "e", "weight": 1, "group_size": 8})).json()
        for _ in range(2):  # two groups of 5 completed members fill the batch of 10
            assert (await c.post("/scored_data", json=group_fn(env["env_id"]))).json() == {
                "status": "received"}
        batch = (await c.get("/batch")).json()["batch"]
    assert len(batch) == 2 and batch[0] == batch[1]
    return batch[0]


@pytest.mark.parametrize("scale", [True, False], ids=["grpo", "dr_grpo"])
async def test_surviving_members_get_bit_identical_advantages(scale: bool) -> None:
    clean = await _served(_clean_group)
    excluded = await _served(_group_with_exclusions)
    assert len(excluded["excluded"]) == 3 and "excluded" not in clean
    clean_seqs, clean_stats = batch_to_sequences([clean], scale_advantages=scale)
    seqs, stats = batch_to_sequences([excluded], scale_advantages=scale)
    assert [s.advantages for s in seqs] == [s.advantages for s in clean_seqs]  # ==, bit for bit
    assert [s.input_ids for s in seqs] == [s.input_ids for s in clean_seqs]
    assert stats.advantages == clean_stats.advantages and stats.scores == clean_stats.scores
    # the advantages are those of the completed members' scores alone
    assert [s.advantages[0] for s in seqs] == group_advantages(SCORES, scale=scale)
    # the masked member's sequence and score (-9.0) are nowhere in what is trained
    assert all(99 not in s.input_ids for s in seqs) and -9.0 not in stats.scores
    assert stats.num_sequences == 5 and clean_stats.excluded == {}
    assert stats.excluded == {"failed/timeout": 1, "failed/env_error": 1, "masked/truncated": 1}


def test_stock_trainer_view_sees_only_completed_members() -> None:
    """A trainer that reads only the 14 stock keys (Atropos 0.4) gets the completed members."""
    group = _group_with_exclusions(0)
    stock_keys = ("tokens", "masks", "scores")
    assert all(len(group[k]) == len(SCORES) for k in stock_keys)
    assert all(m["rollout_id"] not in group["rollout_ids"] for m in group["excluded"])
