"""benchmarks/compat_upstream.py on a tiny fake upstream checkout: what it counts and records."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ENV_HEADER = """\
from typing import List, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
"""
CONFIG = """\
        env_config = BaseEnvConfig(tokenizer_name="unused", group_size=2, use_wandb=False,
                                   total_steps=10, batch_size=4, max_token_length=512)
"""

FILES = {
    # a data module that community envs import as environments.<...> (no env in it)
    "environments/community/word_games/word_list.py": "WORDS = ['cat', 'horse']\n",
    # a community env importing its sibling through upstream's package layout
    "environments/community/word_games/word_env.py": ENV_HEADER + textwrap.dedent("""\
        from environments.community.word_games.word_list import WORDS


        class WordEnv(BaseEnv):
            name = "word"

            @classmethod
            def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        """) + CONFIG + textwrap.dedent("""\
                return env_config, [APIServerConfig(model_name="m", api_key="x",
                                                    base_url="http://localhost:9001/v1")]


        if __name__ == "__main__":
            WordEnv.cli()
        """),
    # an env whose config_init returns the env config alone (not the pair)
    "environments/half_config_server.py": ENV_HEADER + textwrap.dedent("""\


        class HalfConfigEnv(BaseEnv):
            @classmethod
            def config_init(cls):
        """) + CONFIG + "        return env_config\n",
    # an env needing a module nobody declares
    "environments/game_environments/board_env.py": "import some_board_engine_xyz  # noqa\n",
    # upstream's tests beside its envs are counted too (every *.py file)
    "environments/community/word_games/test_word_env.py": "def test_nothing():\n    pass\n",
}


@pytest.fixture
def fake_upstream(tmp_path) -> tuple[Path, str]:
    """A git checkout holding an ``environments/`` tree in upstream's idioms; returns (path, sha)."""
    repo = tmp_path / "atropos"
    for rel, text in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "envs"], check=True)
    sha = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    return repo, sha


def test_counts_every_file_once_and_records_each_outcome(fake_upstream, tmp_path):
    from benchmarks.compat_upstream import main

    repo, sha = fake_upstream
    out = tmp_path / "result.json"
    assert main([str(repo), "--jobs", "2", "--timeout", "120", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())

    assert result["upstream_sha"] == sha and len(result["meta"]["git"]["sha"]) == 40
    assert result["meta"]["command"].startswith("python benchmarks/compat_upstream.py ")
    assert result["meta"]["seeds"] is None and result["upstream_files"] == 5
    ours = result["sides"]["ours"]
    assert Path(ours["atroposlib_file"]).is_relative_to(ROOT)  # this checkout, not another install
    records = {r["file"]: r for r in ours["files"]}
    assert sorted(records) == sorted(Path(f).relative_to("environments").as_posix() for f in FILES)
    assert len(ours["files"]) == 5  # the two shards together cover each file exactly once

    word = records["community/word_games/word_env.py"]
    assert word["import_ok"] and [e["class"] for e in word["envs"]] == ["WordEnv"]
    assert word["envs"][0]["config_init_ok"] and word["envs"][0]["env_config_type"] == "BaseEnvConfig"
    half = records["half_config_server.py"]["envs"][0]
    assert not half["config_init_ok"] and "not a 2-tuple" in half["error"]
    board = records["game_environments/board_env.py"]
    assert not board["import_ok"] and "some_board_engine_xyz" in board["import_error"]
    assert records["community/word_games/word_list.py"] == {
        "file": "community/word_games/word_list.py", "import_ok": True, "import_error": None,
        "envs": []}  # no traceback or package path kept in a record

    totals = ours["totals"]
    assert {k: totals[k] for k in ("files", "import_ok", "files_with_env", "env_classes",
                                   "config_init_ok", "files_config_init_ok")} == {
        "files": 5, "import_ok": 4, "files_with_env": 2, "env_classes": 2, "config_init_ok": 1,
        "files_config_init_ok": 1}
    assert totals["import_errors"] == {"ModuleNotFoundError": 1}
    assert totals["missing_modules"] == {"some_board_engine_xyz": 1}
    assert "compare" not in result  # one side only


def test_compare_names_what_works_on_upstream_only_and_here_only():
    from benchmarks.compat_upstream import compare

    def rec(file, ok, envs=()):
        return {"file": file, "import_ok": ok, "envs": [
            {"class": c, "config_init_ok": c_ok} for c, c_ok in envs]}

    upstream = [rec("a.py", True, [("A", True), ("B", True)]), rec("b.py", True), rec("c.py", False)]
    ours = [rec("a.py", True, [("A", True), ("B", False)]), rec("b.py", False), rec("c.py", True)]
    assert compare(upstream, ours) == {"import_lost": ["b.py"], "import_gained": ["c.py"],
                                       "config_init_lost": ["a.py:B"]}


def test_a_folder_without_environments_is_refused_with_the_fix(tmp_path, capsys):
    from benchmarks.compat_upstream import main

    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "no environments/ folder" in capsys.readouterr().err


def test_shard_splits_the_file_list_without_overlap():
    from benchmarks.compat_env_files import shard

    paths = [Path(f"{i}.py") for i in range(7)]
    parts = [shard(paths, f"{k}/3") for k in range(3)]
    assert sorted(p for part in parts for p in part) == sorted(paths)
    assert shard(paths, None) == paths
    with pytest.raises(ValueError, match="K/N"):
        shard(paths, "3/3")
