"""The node's gate, routes and atomic updates, around a stand-in vLLM engine (no vLLM needed)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from atroposlib.inference.node.models import POLICY_VERSION_HEADER, content_digest
from tests.inference.node.conftest import KEY, FakeServer, base_tensors, fingerprint, push_body

AUTH = {"Authorization": f"Bearer {KEY}"}


def client(server: FakeServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=server.app), base_url="http://node")


def layer1(value: float) -> dict[str, np.ndarray]:
    return {"model.layers.1.w": np.full((2, 3), value, np.float32)}


async def complete(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/completions", json={"prompt": [1, 2]}, headers=AUTH)


async def serve_v1_and_hold_a_completion(server: FakeServer, http: httpx.AsyncClient) -> asyncio.Task:
    """Push version 1, then start a completion the stand-in engine holds; return its task once it runs."""
    await push(http, layer1(1.0), 1)
    server.hold.clear()
    task = asyncio.create_task(complete(http))
    while server.started < 1:
        await asyncio.sleep(0.01)
    return task


async def push(http: httpx.AsyncClient, tensors, version: int, **kw) -> httpx.Response:
    body, headers = push_body(tensors)
    headers.update(kw.pop("headers", {}))
    return await http.put(f"/atropos/weights?version={version}", content=kw.pop("content", body),
                          headers=headers)


async def test_completions_get_503_with_retry_after_until_a_trainer_pushed_weights(fake_node):
    async with client(fake_node) as http:
        refused = await complete(http)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert "not received weights from a trainer" in refused.json()["error"]["message"]
        assert (await http.get("/atropos/status", headers=AUTH)).json()["state"] == "awaiting_weights"
        assert (await push(http, layer1(1.0), 1)).status_code == 200
        served = await complete(http)
    assert served.status_code == 200 and served.headers[POLICY_VERSION_HEADER] == "1"


async def test_serve_base_serves_the_starting_model_as_version_0(tmp_path):
    server = FakeServer(tmp_path, serve_base=True)
    async with client(server) as http:
        served = await complete(http)
    assert served.headers[POLICY_VERSION_HEADER] == "0"
    assert served.json()["weights"] == fingerprint(base_tensors())


async def test_every_route_but_health_needs_the_key(fake_node):
    async with client(fake_node) as http:
        assert (await http.get("/health")).status_code == 200
        for method, path in (("GET", "/atropos/status"), ("POST", "/v1/completions"),
                             ("PUT", "/atropos/weights?version=1")):
            answer = await http.request(method, path, headers={"Authorization": "Bearer wrong"})
            assert answer.status_code == 401, path
            assert answer.headers["www-authenticate"] == "Bearer"
    assert fake_node.engine.calls == []


async def test_a_push_is_applied_paused_and_whole_then_tags_every_completion(fake_node):
    async with client(fake_node) as http:
        applied = await push(http, layer1(2.0), 7)
        assert applied.status_code == 200, applied.text
        assert applied.json()["policy_version"] == 7
        assert applied.json()["update"]["tensors"] == 1 and applied.json()["update"]["source"] == "http"
        served = await complete(http)
        status = (await http.get("/atropos/status", headers=AUTH)).json()
    expected = {**base_tensors(), **layer1(2.0)}  # the other tensors keep their values
    assert served.json()["weights"] == fingerprint(expected)
    assert served.headers[POLICY_VERSION_HEADER] == "7"
    assert fake_node.engine.calls == ["pause:wait", "reload", "atropos_delta_seed", "reset_prefix_cache", "resume"]
    assert fake_node.engine.version == "7"  # vLLM's own weight version follows
    assert status["policy_version"] == 7 and status["state"] == "serving"
    assert status["dtype"] == "float32" and status["boot_id"]


async def test_a_damaged_push_is_refused_and_the_old_weights_keep_serving(fake_node):
    async with client(fake_node) as http:
        await push(http, layer1(1.0), 1)
        calls = list(fake_node.engine.calls)
        good, _ = push_body(layer1(5.0))
        damaged = good[:-1] + bytes([good[-1] ^ 1])
        refused = await push(http, layer1(5.0), 2, content=damaged)
        assert refused.status_code == 400
        assert "does not match the body" in refused.json()["detail"]
        assert "Nothing changed (policy version 1)" in refused.json()["detail"]
        served = await complete(http)
    assert served.headers[POLICY_VERSION_HEADER] == "1"
    assert served.json()["weights"] == fingerprint({**base_tensors(), **layer1(1.0)})
    assert fake_node.engine.calls == calls  # vLLM never touched
    assert [p.name.startswith("v1-") for p in fake_node.settings.weights_dir.iterdir()] == [True]


@pytest.mark.parametrize(("tensors", "message"), [
    ({"model.layers.9.w": np.zeros((2, 3), np.float32)}, "not in this node's model"),
    ({"model.layers.1.w": np.zeros((3, 3), np.float32)}, "wrong shape: model.layers.1.w [3, 3] (model: [2, 3])"),
    ({"model.layers.1.w": np.zeros((2, 3), np.int32)}, "push floating-point weights"),
])
async def test_tensors_vllm_could_not_load_whole_are_refused_before_it_sees_them(fake_node, tensors, message):
    async with client(fake_node) as http:
        refused = await push(http, tensors, 1)
    assert refused.status_code == 422 and message in refused.json()["detail"]
    assert fake_node.engine.calls == []


async def test_a_body_cut_short_is_refused_even_with_a_matching_digest(fake_node):
    from atroposlib.inference.node.models import content_digest

    body, _ = push_body(layer1(1.0))
    async with client(fake_node) as http:
        refused = await push(http, layer1(1.0), 1, content=body[:-4],
                             headers={"Content-Digest": content_digest(body[:-4])})
        missing = await http.put("/atropos/weights?version=1", content=body, headers=AUTH)
    assert refused.status_code == 400 and "truncated" in refused.json()["detail"]
    assert missing.status_code == 400 and "Content-Digest" in missing.json()["detail"]


async def test_an_update_waits_for_completions_in_flight_and_holds_new_ones(fake_node):
    async with client(fake_node) as http:
        old = await serve_v1_and_hold_a_completion(fake_node, http)
        update = asyncio.create_task(push(http, layer1(2.0), 2))
        await asyncio.sleep(0.2)
        assert fake_node.engine.calls.count("reload") == 1  # still draining: v2 not loaded
        new = asyncio.create_task(complete(http))
        await asyncio.sleep(0.2)
        assert fake_node.started == 1  # held at the gate, not sent to vLLM
        fake_node.hold.set()
        old, update, new = await old, await update, await new
    assert old.headers[POLICY_VERSION_HEADER] == "1"
    assert old.json()["weights"] == fingerprint({**base_tensors(), **layer1(1.0)})
    assert update.json()["update"]["drain_seconds"] >= 0.2
    assert new.headers[POLICY_VERSION_HEADER] == "2"
    assert new.json()["weights"] == fingerprint({**base_tensors(), **layer1(2.0)})


async def test_completions_still_running_after_the_drain_timeout_are_aborted(tmp_path):
    server = FakeServer(tmp_path, drain_timeout_s=0.2)
    original = server.engine.pause_generation

    async def pause(mode: str = "abort", clear_cache: bool = True) -> None:
        await original(mode)
        if mode == "abort":
            server.hold.set()  # vLLM ends the aborted requests

    server.engine.pause_generation = pause
    async with client(server) as http:
        stuck = await serve_v1_and_hold_a_completion(server, http)
        applied = await push(http, layer1(2.0), 2)
        await stuck
    assert applied.status_code == 200
    assert server.engine.calls[-6:] == ["pause:abort", "pause:wait", "reload", "atropos_delta_seed", "reset_prefix_cache", "resume"]


async def test_a_failed_load_puts_the_last_push_back_and_keeps_serving_it(fake_node):
    async with client(fake_node) as http:
        await push(http, layer1(1.0), 1)
        fake_node.engine.fail_reload = 1
        failed = await push(http, layer1(2.0), 2)
        served = await complete(http)
        status = (await http.get("/atropos/status", headers=AUTH)).json()
    assert failed.status_code == 500
    assert "keeps serving version 1" in failed.json()["detail"]
    assert served.headers[POLICY_VERSION_HEADER] == "1"
    assert served.json()["weights"] == fingerprint({**base_tensors(), **layer1(1.0)})  # no NaN left
    assert status["state"] == "serving" and "worker crashed" in status["last_error"]
    # the failed reload's leftovers discarded, then the starting model and the last push reloaded
    assert fake_node.engine.calls[-7:] == ["reload", "discard", "atropos_delta_reset", "reload",
                                           "reload", "reset_prefix_cache", "resume"]


async def test_pushed_directories_are_replaced_not_accumulated(fake_node):
    async with client(fake_node) as http:
        for version in (1, 2, 3):
            assert (await push(http, layer1(float(version)), version)).status_code == 200
    assert [p.name.split("-")[0] for p in fake_node.settings.weights_dir.iterdir()] == ["v3"]


async def test_load_from_a_directory_on_this_host_leaves_it_in_place(fake_node, tmp_path):
    shared = tmp_path / "trainer_run" / "vllm_weights"
    shared.mkdir(parents=True)
    save_file(layer1(4.0), shared / "model.safetensors")
    async with client(fake_node) as http:
        loaded = await http.post("/atropos/weights/load", headers=AUTH,
                                 json={"path": str(shared), "version": 4})
        missing = await http.post("/atropos/weights/load", headers=AUTH,
                                  json={"path": str(tmp_path / "nowhere"), "version": 5})
        served = await complete(http)
    assert loaded.status_code == 200 and loaded.json()["update"]["source"] == "path"
    assert served.headers[POLICY_VERSION_HEADER] == "4"
    assert (shared / "model.safetensors").exists()
    assert missing.status_code == 422 and "this node can read" in missing.json()["detail"]


async def test_probe_tells_whether_the_node_reads_the_trainers_file(fake_node, tmp_path):
    probe = tmp_path / ".atropos-probe-abc"
    probe.write_text("token-1")
    async with client(fake_node) as http:
        same = await http.post("/atropos/probe", headers=AUTH, json={"path": str(probe), "content": "token-1"})
        hidden = await http.post("/atropos/probe", headers=AUTH,
                                 json={"path": str(tmp_path / ".atropos-probe-x"), "content": "t"})
        other = await http.post("/atropos/probe", headers=AUTH, json={"path": "/etc/passwd", "content": "t"})
    assert same.json() == {"readable": True, "matches": True}
    assert hidden.json() == {"readable": False, "matches": False}
    assert other.status_code == 422


async def test_an_adapter_push_is_loaded_in_place_only_where_vllm_runs_with_lora(tmp_path):
    from atroposlib.inference.node.models import ADAPTER_CONFIG_KEY

    adapter = {"base_model.model.model.layers.1.q.lora_A.weight": np.ones((2, 3), np.float32)}
    body, headers = push_body(adapter, {ADAPTER_CONFIG_KEY: '{"r": 2, "lora_alpha": 4}'})
    answers = {}
    for lora in (False, True):
        server = FakeServer(tmp_path / str(lora), lora=lora)
        async with client(server) as http:
            answers[lora] = await http.put("/atropos/weights?version=3&kind=lora&lora_name=p-lora",
                                           content=body, headers=headers)
            if lora:
                served = await complete(http)
                no_config, _ = push_body(adapter)
                missing = await http.put("/atropos/weights?version=4&kind=lora&lora_name=p-lora",
                                         content=no_config, headers={**headers, "Content-Digest":
                                                                     content_digest(no_config)})
    assert answers[False].status_code == 409 and "--enable-lora" in answers[False].json()["detail"]
    assert answers[True].status_code == 200 and answers[True].json()["update"]["kind"] == "lora"
    [load] = server.models.loads
    assert (load["name"], load["inplace"], load["config"]) == ("p-lora", True, '{"r": 2, "lora_alpha": 4}')
    assert served.headers[POLICY_VERSION_HEADER] == "3"
    assert missing.status_code == 422 and ADAPTER_CONFIG_KEY in missing.json()["detail"]


async def test_metrics_follow_the_version_and_count_updates_by_outcome(fake_node):
    from prometheus_client.parser import text_string_to_metric_families

    def parse(text: str) -> dict[tuple[str, tuple], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async with client(fake_node) as http:
        assert (await http.get("/atropos/metrics")).status_code == 401  # behind the key
        before = parse((await http.get("/atropos/metrics", headers=AUTH)).text)
        await push(http, layer1(1.0), 1)
        fake_node.engine.fail_reload = 1
        await push(http, layer1(2.0), 2)
        after = parse((await http.get("/atropos/metrics", headers=AUTH)).text)
    assert before[("atropos_inference_policy_version", ())] == -1
    assert before[("atropos_inference_state", (("state", "awaiting_weights"),))] == 1
    assert after[("atropos_inference_policy_version", ())] == 1
    assert after[("atropos_inference_state", (("state", "serving"),))] == 1
    assert after[("atropos_inference_weight_updates_total", (("outcome", "applied"),))] == 1
    assert after[("atropos_inference_weight_updates_total", (("outcome", "failed"),))] == 1
    assert after[("atropos_inference_weight_bytes_received_total", ())] > 0


async def test_a_delta_on_another_base_is_refused_with_409_and_changes_nothing(fake_node):
    import torch

    from atroposlib.inference.node.state import DeltaRefused
    from atroposlib.inference.weights import delta
    from atroposlib.inference.weights.delta import DeltaError

    # one error family: ``except DeltaError`` also catches the node's refusal
    assert issubclass(DeltaRefused, DeltaError) and not issubclass(DeltaError, DeltaRefused)
    async with client(fake_node) as http:
        await push(http, layer1(1.0), 1)  # the node's delta base: version 1
        old = {"model.layers.1.w": torch.from_numpy(layer1(1.0)["model.layers.1.w"])}
        new = {"model.layers.1.w": torch.from_numpy(layer1(3.0)["model.layers.1.w"])}
        body, _ = delta.encode(old, new, base_version=5, version=6)
        refused = await http.put("/atropos/weights/delta?version=6", content=body, headers={
            **AUTH, "Content-Digest": content_digest(body), "Content-Type": "application/octet-stream"})
        served = await complete(http)
    assert refused.status_code == 409, refused.text
    assert refused.json()["reason"] == "base" and "push the full weights" in refused.json()["detail"]
    assert served.headers[POLICY_VERSION_HEADER] == "1"
    assert served.json()["weights"] == fingerprint({**base_tensors(), **layer1(1.0)})
