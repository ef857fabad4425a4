"""--env.metrics_port: a scrape of a real serve loop parses, and its counters move under load."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from atroposlib.testing.fake_server import FakeServer
from tests.env_runtime.test_serve_loop import MostlySameScoresEnv, _serving, _trainer


async def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(url, timeout=5)).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_env_metrics_parse_and_move_under_load(run_api, tiny_tokenizer, tmp_path):
    env, loop = _serving(run_api, tiny_tokenizer, FakeServer(latency=0.05), MostlySameScoresEnv,
                         {"status_interval": 0.1}, group_size=4, max_num_workers=4, metrics_port=0)
    trainer = await _trainer(run_api.url, tmp_path, batch_size=8)
    serving = asyncio.create_task(loop.run())
    async with asyncio.timeout(60):
        while loop.metrics is None:
            await asyncio.sleep(0.05)
        first = await _scrape(loop.metrics.url)
        while env.stats["groups_sent"] < 4 or env.stats["groups_dropped_same_scores"] < 4:
            if (await trainer.status())["queue_size"] >= 2:
                await trainer.get_batch()
            await asyncio.sleep(0.05)
        later = await _scrape(loop.metrics.url)
    sent = ("atropos_env_groups_sent_total", ())
    same = ("atropos_env_groups_dropped_total", (("reason", "same_scores"),))
    assert later[sent] >= 4 and later[sent] > first.get(sent, 0.0)
    assert later[same] >= 4 and later[same] > first.get(same, 0.0)
    assert ("atropos_env_rollouts_in_flight", ()) in later
    assert later[("atropos_env_trainer_step", ())] >= 0
    assert later[("atropos_env_rollout_cap", ())] >= 1  # the staleness window and its inputs
    assert later[("atropos_env_offpolicy_window_batches", ())] == 3  # no limit: the env's own
    assert later[("atropos_env_rollout_latency_seconds", ())] > 0
    url = loop.metrics.url
    loop.stop_event.set()
    await serving
    await trainer.aclose()
    try:  # the endpoint closes with the loop
        await _scrape(url)
        raise AssertionError("metrics endpoint still up after shutdown")
    except httpx.HTTPError:
        pass


def test_env_metrics_are_off_by_default():
    from atroposlib.envs.config import BaseEnvConfig

    assert BaseEnvConfig().metrics_port is None
