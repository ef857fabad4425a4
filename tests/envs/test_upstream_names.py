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
