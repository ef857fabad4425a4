"""Env files written the Atropos 0.4 way, unmodified, import, config_init and pass check_env.

The files are in ``tests/envs/upstream_style_envs/`` (one upstream idiom each: unmanaged chat
completions with undeclared config fields, ``collect_trajectory`` items scored with
``parse_tool_call``, the managed server through ``ManagedServerAdapter`` with best-of-n and
trimmed thinking, registry rewards combined with ``CombinedReward``). Nothing is downloaded:
the files generate their items and a scripted ``FakeServer`` answers.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.envs.base import BaseEnv
from atroposlib.envs.config import UnknownConfigFieldWarning
from atroposlib.testing.fake_server import FakeRequest, FakeServer

FILES = Path(__file__).parent / "upstream_style_envs"


def _echo(req: FakeRequest) -> str:
    word = re.search(r"Repeat the word (\w+)", req.prompt).group(1)
    return word if req.index == 0 else "no idea"


def _tool_call() -> object:
    calls = iter(range(10**6))  # collect_trajectory asks for n=1: alternate right and wrong

    def reply(req: FakeRequest) -> str:
        city = re.search(r"Weather in (\w+)", req.prompt).group(1)
        if next(calls) % 2:
            return "I cannot call tools."
        return f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>'
    return reply


def _sum(req: FakeRequest) -> str:
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", req.prompt)[-1])
    return f"<think>{'adding carefully ' * 5}</think>{a + b}" if req.index == 0 else "five"


def _color(req: FakeRequest) -> str:
    color = re.search(r"Name the color (\w+)", req.prompt).group(1)
    return f"<answer>{color}</answer>" if req.index == 0 else "<answer>grey</answer>"


SCRIPTS = {
    "echo_buffer_env.py": lambda: _echo,
    "tool_call_item_env.py": _tool_call,
    "best_of_n_managed_env.py": lambda: _sum,
    "combined_reward_env.py": lambda: _color,
}
#: The undeclared keyword fields each file's config_init passes (warned about, kept).
UNDECLARED = {"echo_buffer_env.py": ["dataset_path", "score_buffer_size"],
              "tool_call_item_env.py": ["start_tok_length"]}


def _load(path: Path) -> type[BaseEnv]:
    spec = importlib.util.spec_from_file_location(f"upstream_style_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [env_cls] = [c for c in vars(module).values() if inspect.isclass(c)
                 and issubclass(c, BaseEnv) and c.__module__ == module.__name__]
    return env_cls


def test_every_file_in_the_folder_is_checked():
    assert sorted(p.name for p in FILES.glob("*.py")) == sorted(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
async def test_upstream_style_file_imports_config_inits_and_passes_check_env(name, tiny_tokenizer):
    env_cls = _load(FILES / name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env_config, server_configs = env_cls.config_init()
    unknown = [w for w in caught if issubclass(w.category, UnknownConfigFieldWarning)]
    expected = UNDECLARED.get(name, [])
    assert len(unknown) == (1 if expected else 0), [str(w.message) for w in unknown]
    assert all(f in str(unknown[0].message) for f in expected) if expected else True
    assert all(getattr(env_config, f) is not None for f in expected)
    assert len(server_configs) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownConfigFieldWarning)
        groups = await check_env(env_cls, server=FakeServer(SCRIPTS[name](), tokenizer=tiny_tokenizer),
                                 tokenizer=tiny_tokenizer, num_groups=2,
                                 config_overrides={"tokenizer_name": "unused"})
    assert len(groups) == 2
    assert all(max(g["scores"]) > min(g["scores"]) for g in groups)


def test_upstream_style_file_runs_as_a_script():
    # `python FILE process --help` as upstream users run it; the undeclared fields are not flags.
    result = subprocess.run([sys.executable, str(FILES / "echo_buffer_env.py"), "process", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--env.group_size" in result.stdout and "--env.score_buffer_size" not in result.stdout
