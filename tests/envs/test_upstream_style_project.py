"""A user's own ``environments/`` tree, laid out as Atropos 0.4's repository, beside this package.

``upstream_style_envs/user_project/environments/`` has no ``__init__.py`` (a namespace package,
as upstream's) and its files import each other by full dotted path: a top-level env imports
``environments.eval_environments.eval_helpers``, a teacher-distill variant imports the top-level
env as ``environments.parity_server``, a community env imports its sibling data module as
``environments.community.word_games.word_list``, and a local runner imports that env. When this
package's wheel shipped a top-level ``environments`` package, every one of those imports failed
with ``No module named 'environments.<subfolder>'``. Nothing is downloaded: the files make
their items in code and a scripted ``FakeServer`` (or its HTTP front) answers.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.env_runtime.command_line import parse_args_with_namespaces
from atroposlib.envs.base import BaseEnv
from atroposlib.envs.teacher_distillation_env import TeacherDistillationConfig
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeRequest, FakeServer

REPO = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).parent / "upstream_style_envs" / "user_project"
#: Env modules of the tree (dotted, as the files import each other) -> their env class.
ENV_MODULES = {
    "environments.parity_server": "ParityEnv",
    "environments.parity_server_teacher_distill": "ParityTeacherDistillEnv",
    "environments.community.word_games.word_length_env": "WordLengthEnv",
}


def _purge() -> None:
    for name in [n for n in sys.modules if n == "environments" or n.startswith("environments.")]:
        del sys.modules[name]


@pytest.fixture
def user_project(monkeypatch):
    """The user's project root first on ``sys.path`` (as ``python -m`` from it would have it)."""
    _purge()
    monkeypatch.syspath_prepend(str(PROJECT))
    yield PROJECT
    _purge()


def _env_class(module_name: str) -> type[BaseEnv]:
    module = importlib.import_module(module_name)
    [cls] = [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, BaseEnv)
             and c.__module__ == module.__name__]
    return cls


def test_the_tree_has_no_init_files_like_upstreams():
    assert PROJECT.joinpath("environments").is_dir()
    assert not list(PROJECT.rglob("__init__.py"))


@pytest.mark.parametrize("module_name", sorted(ENV_MODULES))
def test_each_env_imports_by_dotted_path_and_config_inits(user_project, module_name):
    cls = _env_class(module_name)
    assert cls.__name__ == ENV_MODULES[module_name]
    assert Path(inspect.getfile(cls)).is_relative_to(user_project)  # the user's, not ours
    env_config, servers = cls.config_init()
    assert env_config.group_size in (2, 4)
    assert servers


def _parity(req: FakeRequest) -> str:
    number = int(re.search(r"Is (\d+) even or odd", req.prompt).group(1))
    right = "even" if number % 2 == 0 else "odd"
    return f"<answer>{right}</answer>" if req.index == 0 else "<answer>prime</answer>"


def _word_length(req: FakeRequest) -> str:
    word = re.search(r"letters are in the word (\w+)", req.prompt).group(1)
    return str(len(word)) if req.index == 0 else "12"


@pytest.mark.parametrize(("module_name", "script"), [
    ("environments.parity_server", _parity),
    ("environments.community.word_games.word_length_env", _word_length),
])
async def test_envs_of_the_tree_pass_check_env(user_project, tiny_tokenizer, module_name, script):
    groups = await check_env(_env_class(module_name), FakeServer(script, tokenizer=tiny_tokenizer),
                             tokenizer=tiny_tokenizer, num_groups=2,
                             config_overrides={"tokenizer_name": "unused"})
    assert all(max(g["scores"]) > min(g["scores"]) for g in groups)


async def test_teacher_distill_variant_of_a_sibling_env(user_project, tiny_tokenizer, tiny_tokenizer_dir):
    cls = _env_class("environments.parity_server_teacher_distill")
    assert cls.__mro__[1].__module__ == "environments.parity_server"
    env_config, _ = cls.config_init()
    assert isinstance(env_config, TeacherDistillationConfig) and env_config.teacher_enabled
    # Its teacher_config_init is the default teacher of `serve` (no --teacher flags needed).
    [teacher] = parse_args_with_namespaces(cls, ["serve"])[4]["teacher_server_configs"]
    assert (teacher.base_url, teacher.server_type) == ("http://localhost:9003/v1", "vllm")
    config = TeacherDistillationConfig(**{**env_config.model_dump(),
                                          "tokenizer_name": str(tiny_tokenizer_dir)})
    env = cls(config, [FakeServer(_parity, tokenizer=tiny_tokenizer)],
              teacher_server_configs=[FakeServer(tokenizer=tiny_tokenizer)])
    await env.setup()
    group, _ = await env.collect_trajectories(await env.get_next_item())
    [sent] = await env.handle_send_to_api(group, do_send_to_api=False)
    assert [len(ids) for ids in sent["distill_token_ids"]] == [len(t) for t in sent["tokens"]]
    assert all(len(row) == 2 for ids in sent["distill_token_ids"] for row in ids[1:])


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    # This checkout first on the path, as an editable install of it may put it: its own
    # environments/ launcher folder is a namespace portion too, and must not hide the user's.
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(PROJECT)]),
                "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, *args], cwd=PROJECT, env=full_env,
                          capture_output=True, text=True, timeout=180)


def test_a_nested_env_file_runs_as_a_script():
    result = _run(["environments/community/word_games/word_length_env.py", "process", "--help"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--env.group_size" in result.stdout


def test_a_local_runner_imports_the_env_by_dotted_path_and_plays_a_group(tiny_tokenizer, tiny_tokenizer_dir):
    with FakeOpenAIServer(FakeServer(_word_length, tokenizer=tiny_tokenizer)) as http:
        result = _run(["-m", "environments.community.word_games.word_length_local_server",
                       http.base_url, str(tiny_tokenizer_dir)])
    assert result.returncode == 0, result.stderr[-2000:]
    word, scores = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert scores == "[1.0, 0.0]" and word.isalpha()
