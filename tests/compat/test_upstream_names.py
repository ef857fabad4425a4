"""Every public name of Atropos 0.4.0 imports from the same module path here (issue 11 sec. 1).

``upstream_names.txt`` beside this file is upstream's list of (module, public name) pairs, made
offline from upstream's wheel by ``benchmarks/upstream_names.py UPSTREAM/atroposlib --write``
(a ``def`` is defined in upstream's module; ``from:HOME`` was imported there from HOME). Nothing is
downloaded here: each pair is looked up with ``getattr`` on our module, except the documented
exclusions below.
"""

from __future__ import annotations

import importlib
import pathlib
import warnings

import pytest

LIST = pathlib.Path(__file__).with_name("upstream_names.txt")

_NO_PYDANTIC_CLI = ("pydantic_cli is not a dependency of ours: our command lines are argparse "
                    "(atroposlib.utils.cli.ArgumentParser) and raise ConfigError/SystemExit")
_CLI_SCRIPT = ("an internal of upstream's console script, hard-wired to http://localhost:8000 "
               "(register_to_api resets the API's queue); ours is a different command with its "
               "own options, and `main` is kept at this path")

#: (module, name) -> why it is not provided at that path.
EXCLUDED: dict[tuple[str, str], str] = {
    ("atroposlib.envs.base", "Cmd"): _NO_PYDANTIC_CLI,
    ("atroposlib.envs.base", "FailedExecutionException"): _NO_PYDANTIC_CLI,
    ("atroposlib.envs.base", "run_and_exit"): _NO_PYDANTIC_CLI,
    ("atroposlib.envs.server_handling.openai_server", "FailedExecutionException"): _NO_PYDANTIC_CLI,
    ("atroposlib.envs.server_handling.sglang_server", "FailedExecutionException"): _NO_PYDANTIC_CLI,
    ("atroposlib.envs.server_handling.vllm_server", "FailedExecutionException"): _NO_PYDANTIC_CLI,
    ("atroposlib.utils.message_history_utils", "ScoredDataGroup"): (
        "utils/ must not import envs/ (issue 11 sec. 2); import it from atroposlib.envs.base"),
    **{("atroposlib.cli.dpo", n): _CLI_SCRIPT for n in (
        "AutoTokenizer", "check_for_batch", "dpo_data_grabber", "find_common_prefix",
        "grab_group_data", "parse_http_response", "register_to_api", "tqdm")},
    **{("atroposlib.cli.sft", n): _CLI_SCRIPT for n in (
        "AutoTokenizer", "check_for_batch", "find_common_prefix", "grab_group_data",
        "parse_http_response", "register_to_api", "sft_data_grabber", "tqdm")},
    **{("atroposlib.cli.view_run", n): _CLI_SCRIPT for n in (
        "AutoTokenizer", "build_interface", "check_for_batch", "find_common_prefix",
        "parse_http_response", "register_to_api")},
    **{("atroposlib.cli.view_run_multimodal", n): _CLI_SCRIPT for n in (
        "AutoTokenizer", "build_interface", "check_for_batch", "find_common_prefix",
        "register_to_api")},
}

#: Resolved from vLLM on first access (None without vLLM, as upstream); checked by name here so
#: the test does not import vLLM (seconds); ``test_vllm_names_are_none_without_vllm`` runs them.
VLLM_RESOLVED = "atroposlib.envs.server_handling.tool_call_translator"


def _pairs() -> list[tuple[str, str, str]]:
    return [tuple(line.split()) for line in LIST.read_text().splitlines() if line.strip()]


def test_list_is_upstreams_whole_public_surface():
    pairs = _pairs()
    assert len(pairs) == 369 and len({(m, n) for m, n, _ in pairs}) == 369
    assert len({m for m, _, _ in pairs}) == 49
    stale = set(EXCLUDED) - {(m, n) for m, n, _ in pairs}
    assert not stale, f"exclusions of names upstream does not have: {sorted(stale)}"


def test_every_upstream_name_imports_from_upstreams_path():
    missing = []
    modules: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module, name, _kind in _pairs():
            if (module, name) in EXCLUDED:
                continue
            if module not in modules:
                modules[module] = importlib.import_module(module)
            ours = modules[module]
            if module == VLLM_RESOLVED and name in ours._VLLM_NAMES:
                continue
            if not hasattr(ours, name):
                missing.append(f"{module}.{name}")
    assert not missing, f"{len(missing)} upstream names missing: {missing}"


def test_vllm_names_are_none_without_vllm(monkeypatch):
    translator = importlib.import_module(VLLM_RESOLVED)
    monkeypatch.setattr(translator, "_vllm_available", lambda: False)
    for name in translator._VLLM_NAMES:
        monkeypatch.delitem(vars(translator), name, raising=False)
        assert getattr(translator, name) is None
        monkeypatch.delitem(vars(translator), name, raising=False)  # not cached for other tests


@pytest.mark.parametrize("pair", sorted(EXCLUDED))
def test_excluded_names_are_really_absent(pair):
    """An exclusion that became importable must leave the list (the list stays honest)."""
    module, name = pair
    try:
        ours = importlib.import_module(module)
    except ImportError:
        return
    assert not hasattr(ours, name), f"{module}.{name} now exists: drop it from EXCLUDED"


# --- the helpers written for these names (not re-exports) ------------------------------------


def test_utils_cli_helpers_of_atropos_04():
    from atroposlib.utils.cli import (
        adjust_model_defaults,
        extract_namespace,
        get_double_dash_flags,
        get_prefixed_pydantic_model,
        merge_dicts,
    )
    from pydantic import BaseModel, Field

    class Cfg(BaseModel):
        size: int = Field(default=2, description="how many")
        tags: list[str] = Field(default_factory=list)

    assert merge_dicts({"a": {"b": 1, "c": 2}, "x": 1}, {"a": {"c": 3}}, {"x": {"y": 1}}) == {
        "a": {"b": 1, "c": 3}, "x": {"y": 1}}
    assert merge_dicts() == {}
    assert extract_namespace({"env.size": 3, "openai.x": 1}, "env.") == {"size": 3}
    assert extract_namespace(Cfg(size=5), "si") == {"ze": 5}
    with pytest.raises(TypeError):
        extract_namespace(42, "env.")
    prefixed = get_prefixed_pydantic_model(Cfg, "env.")
    assert prefixed.__name__ == "Env.Cfg"
    assert prefixed.model_fields["env.size"].description == "how many"
    assert prefixed().model_dump() == {"env.size": 2, "env.tags": []}
    derived = adjust_model_defaults(Cfg, {"size": 7, "tags": None, "nope": 1})
    assert derived.__name__ == "CfgWithDefaults" and issubclass(derived, Cfg)
    assert derived().size == 7 and derived().tags == []
    assert get_double_dash_flags(["run", "--user=admin", "--port", "8080", "--verbose", "-o", "x",
                                  "--input-file", "a.csv", "--none", "None"]) == {
        "user": "admin", "port": "8080", "verbose": True, "input-file": "a.csv", "none": None}


def test_server_harness_completion_builders():
    from atroposlib.envs.server_handling.server_harness import (
        create_chat_completion,
        create_completion,
    )

    chat = create_chat_completion(["a", "b"], n=2, finish_reason=["stop", "length"])
    assert [c.message.content for c in chat.choices] == ["a", "b"]
    assert [c.finish_reason for c in chat.choices] == ["stop", "length"]
    assert [c.text for c in create_completion("x", n=3).choices] == ["x", "x", "x"]
    with pytest.raises(ValueError):
        create_chat_completion(["only one"], n=2)


def test_gzip_request_middleware_and_openai_error():
    import gzip
    import json

    from atroposlib.envs.server_handling.managed_server_proxy import openai_error
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from atroposlib.api.server import GZipRequestMiddleware

    async def echo(request):
        return JSONResponse(await request.json())

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    app.add_middleware(GZipRequestMiddleware, max_decompressed_bytes=1000)
    client = TestClient(app)
    body = gzip.compress(json.dumps({"a": 1}).encode())
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    assert client.post("/echo", content=body, headers=headers).json() == {"a": 1}
    assert client.post("/echo", json={"b": 2}).json() == {"b": 2}
    assert client.post("/echo", content=b"not gzip", headers=headers).status_code == 400
    bomb = gzip.compress(b"[" + b"0," * 2000 + b"0]")
    assert client.post("/echo", content=bomb, headers=headers).status_code == 413

    response = openai_error(404, "no such session", "not_found_error")
    assert response.status_code == 404
    assert json.loads(response.body) == {
        "error": {"message": "no such session", "type": "not_found_error", "code": 404}}


def test_view_run_multimodal_helpers():
    import base64
    import io
    import json

    from PIL import Image

    from atroposlib.cli.view_run_multimodal import extract_image_from_chat, extract_text_from_chat

    buf = io.BytesIO()
    Image.new("RGB", (3, 2)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [{"type": "text", "text": "How many?"}, {"type": "image_url", "image_url": {"url": url}}]
    assert extract_image_from_chat(json.dumps(parts)).size == (3, 2)
    assert extract_image_from_chat("no image") is None
    assert extract_image_from_chat("data:image/png;base64,AAAA") is None
    assert extract_text_from_chat(json.dumps(parts)) == "How many?"
    assert extract_text_from_chat("[Image] count the dots") == "count the dots"
    assert extract_text_from_chat("plain") == "plain"


def test_inference_node_watcher_logs_health_when_the_step_advances(monkeypatch):
    import httpx
    import wandb

    from atroposlib.cli import inference_node_wandb_watcher as watcher

    steps = iter([0, 3, 3])

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/wandb_info":
            return httpx.Response(200, json={"project": "p", "group": "g"})
        if request.url.path == "/status":
            return httpx.Response(200, json={"current_step": next(steps), "queue_size": 0})
        return httpx.Response(200 if request.url.port == 9000 else 503)

    real_client = httpx.Client
    monkeypatch.setattr(watcher.httpx, "Client", lambda **kw: real_client(
        transport=httpx.MockTransport(answer), **kw))
    inits, logs = [], []
    monkeypatch.setattr(wandb, "init", lambda **kw: inits.append(kw))
    monkeypatch.setattr(wandb, "log", lambda data, step=None: logs.append((step, dict(data))))
    monkeypatch.setattr(watcher.time, "sleep", lambda s: None)
    watcher.run("http://api", tp=4, node_num=1, max_polls=3)
    assert inits == [{"project": "p", "group": "g", "name": "inf_node_1"}]
    assert logs == [(3, {"server/server_health_1_0": 1.0, "server/server_health_1_1": 0.0})]
    with pytest.raises(ValueError):
        watcher.run("http://api", tp=16, node_num=1)
