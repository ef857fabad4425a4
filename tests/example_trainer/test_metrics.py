"""--metrics-port: a Prometheus scrape of a real trainer run parses, and its counters move."""

from __future__ import annotations

import math
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from atroposlib.api.client import AtroposClient
from example_trainer.config import TrainerConfig
from example_trainer.grpo import train
from example_trainer.metrics import TrainerMetrics
from tests.example_trainer.test_grpo_loop import _group, needs_tokenizer, tiny_model  # noqa: F401
from tests.example_trainer.test_poison import _poison
from tests.fixtures.api_server import free_port


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of ``/metrics``, keyed by (name, sorted labels)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@needs_tokenizer
def test_a_scrape_parses_and_the_counters_move_over_a_real_run(tiny_model, run_api, tmp_path):  # noqa: F811
    port = free_port()
    result: dict = {}
    config = TrainerConfig(model=str(tiny_model), run_dir=str(tmp_path / "run"), api_url=run_api.url,
                           vllm_url="http://127.0.0.1:9/v1", weight_sync="none", training_steps=3,
                           batch_size=8, micro_batch_size=8, batch_timeout=120, metrics_port=port,
                           torch_threads=1)
    # The bad group goes in before the trainer registers its vocabulary size: run-api checks ids
    # against it only from then on, so this one reaches the trainer's own check (as it would from
    # an Atropos 0.4 run-api, which checks nothing).
    with AtroposClient(run_api.url) as client:
        client.post_scored_data(_poison("id 49159"))
    thread = threading.Thread(target=lambda: result.update(train(config)))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while True:  # the endpoint is up once the model is loaded
            try:
                before = _scrape(port)
                break
            except httpx.HTTPError:
                assert thread.is_alive() and time.monotonic() < deadline
                time.sleep(0.2)
        assert before[("atropos_trainer_step", ())] == 0
        assert ("atropos_trainer_steps_total", (("outcome", "trained"),)) not in before
        with AtroposClient(run_api.url) as client:
            # step 1: one group with an id outside the vocabulary (dropped) + a good one; step 2: good
            for group in (_group(0), _group(1), _group(2)):
                client.post_scored_data(group)
            while (after := _scrape(port))[("atropos_trainer_step", ())] < 2:
                assert thread.is_alive() and time.monotonic() < deadline
                time.sleep(0.2)
            assert after[("atropos_trainer_steps_total", (("outcome", "trained"),))] == 2
            assert after[("atropos_trainer_groups_dropped_total", (("reason", "token_range"),))] == 1
            assert after[("atropos_trainer_batch_wait_seconds_count", ())] == 2
            assert after[("atropos_trainer_compute_seconds_count", ())] == 2
            assert after[("atropos_trainer_trained_tokens_total", ())] == 3 * 4 * 6  # 3 good groups
            assert after[("atropos_trainer_tokens_per_second", ())] > 0
            assert math.isfinite(after[("atropos_trainer_loss", ())])
            assert after[("atropos_trainer_reward_mean", ())] == 0.375  # scores 1, 0, 0.5, 0
            assert after[("atropos_trainer_checkpoint_seconds_count", ())] == 0
            for seed in (3, 4):
                client.post_scored_data(_group(seed))
        thread.join(120)
    finally:
        thread.join(120)
    assert result["steps"] == 3


def test_metrics_are_off_by_default_and_closing_frees_the_port():
    assert TrainerConfig().metrics_port is None
    metrics = TrainerMetrics(0)
    port = metrics.port
    assert port and ("atropos_trainer_vllm_up", ()) in _scrape(port)
    metrics.close()
    try:
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the endpoint still answers after close()")
    except httpx.HTTPError:
        pass
