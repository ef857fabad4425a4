"""The trainer's batch poll survives lost /batch replies without skipping a batch."""

from __future__ import annotations

import httpx

from atroposlib.api.client import AtroposClient
from atroposlib.api.models import Registration
from example_trainer.grpo import wait_for_batch
from example_trainer.stopping import StopFlag
from tests.fixtures.api_server import RunApi
from tests.fixtures.lossy import LossyTransport


def group(seed: int) -> dict:
    return {"tokens": [[seed, 2, 3]], "masks": [[-100, 2, 3]], "scores": [1.0]}


def test_lost_batch_replies_are_fetched_again_by_step(run_api: RunApi) -> None:
    lossy = LossyTransport(1.0, max_lost=3, paths=("/batch",))
    client = AtroposClient(run_api.url, max_attempts=1, transport=lossy)  # every loss raises
    client.register(Registration(
        wandb_group="g", wandb_project="p", batch_size=1, max_token_len=64, checkpoint_dir="c",
        save_checkpoint_interval=10, starting_step=0, num_steps=10))
    for seed in (1, 2):
        assert httpx.post(run_api.url + "/scored_data", json=group(seed)).status_code == 200
    first = wait_for_batch(client, timeout=30, stop=StopFlag())
    assert lossy.lost_replies == lossy.lost_groups == 3  # the one-group batch of step 1, thrice
    assert first is not None and first[0]["tokens"] == group(1)["tokens"]
    second = wait_for_batch(client, timeout=30, stop=StopFlag())
    assert second is not None and second[0]["tokens"] == group(2)["tokens"]
    assert client.last_step == 2
    client.close()
