"""atropos-env: environments registered through the ``atroposlib.environments`` entry points.

Entry points are found through ``*.dist-info/entry_points.txt`` on ``sys.path``; the tests
write such a directory into ``tmp_path`` and put it on a subprocess's PYTHONPATH (that is
exactly what ``pip install`` leaves behind), so nothing is installed into the venv.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
COLLECTION = PYPROJECT["project"]["entry-points"]["atroposlib.environments"]


def _dist_info(root: Path, dist: str, entries: dict[str, str]) -> Path:
    """Write ``root/<dist>-0.1.dist-info`` declaring ``entries`` in the env group."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[atroposlib.environments]\n{lines}")
    return root


def _run(args: list[str], *paths: Path, cwd: Path | None = None,
         code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), str(REPO)])}
    cmd = [sys.executable, "-c", code, *args] if code else [
        sys.executable, "-m", "atroposlib.cli.env", *args]
    return subprocess.run(cmd, cwd=cwd or REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def collection(tmp_path) -> Path:
    """Our pyproject's entry points, as ``pip install`` would record them."""
    return _dist_info(tmp_path / "site", "atroposlib-collection", COLLECTION)


THIRD_PARTY = '''
"""A third-party environment package (it only imports atroposlib)."""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup


class EchoEnv(BaseEnv):
    """Echo prompts back; score 1 when the reply is not empty.

    More text that the listing must not show.
    """

    name = "echo"

    @classmethod
    def config_init(cls):
        return (BaseEnvConfig(group_size=2, use_wandb=False, max_token_length=256),
                APIServerConfig(model_name="fake", base_url="http://127.0.0.1:9/v1"))

    async def setup(self):
        self.count = 0

    async def get_next_item(self):
        self.count += 1
        return f"Say {self.count}"

    async def collect_trajectories(self, item):
        from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

        messages = [{"role": "user", "content": item}]
        completion = await self.server.chat_completion(messages=messages, n=2, max_tokens=8)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for choice in completion.choices:
            chat = messages + [{"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if choice.message.content else 0.0)
            group["messages"].append(chat)
        return group, []

    async def evaluate(self, *args, **kwargs):
        samples = []
        for i, reference in enumerate(["a", "b", "c", "d"]):
            messages = [{"role": "user", "content": f"q{i}"}]
            completion = await self.server.chat_completion(messages=messages, n=1, max_tokens=8,
                                                           split="eval")
            text = completion.choices[0].message.content
            samples.append({"messages": messages + [{"role": "assistant", "content": text}],
                            "answer": reference, "score": 1.0 if i < 3 else -1.0})
        metrics = {"eval/accuracy": 0.75}
        self.evaluate_log(metrics, samples=samples)
        return metrics


class NotAnEnv:
    """Registered by mistake."""
'''


@pytest.fixture
def third_party(tmp_path) -> Path:
    """A package ``echo_envs`` registering ``echo`` and a broken ``broken`` entry."""
    root = tmp_path / "third_party"
    (root / "echo_envs").mkdir(parents=True)
    (root / "echo_envs" / "__init__.py").write_text("")
    (root / "echo_envs" / "envs.py").write_text(textwrap.dedent(THIRD_PARTY))
    return _dist_info(root, "echo-envs", {"echo": "echo_envs.envs:EchoEnv",
                                          "broken": "echo_envs.envs:NotAnEnv"})


# ----------------------------------------------------------------- what pyproject declares
def test_pyproject_registers_every_runnable_collection_env_and_ships_the_package():
    # The collection ships inside atroposlib: no top-level `environments` package that could
    # shadow a user's own environments/ folder (Atropos's layout).
    assert PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [
        "atroposlib", "example_trainer"]
    assert PYPROJECT["project"]["scripts"]["atropos-env"] == "atroposlib.cli.env:main"
    runnable = {}
    for path in sorted((REPO / "atroposlib" / "environments").glob("*.py")):
        source = path.read_text()
        if "__name__ == \"__main__\"" not in source or ".cli()" not in source:
            continue  # bases (gym_text.py)
        tree = ast.parse(source)
        launched = [n.func.value.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute) and n.func.attr == "cli"
                    and isinstance(n.func.value, ast.Name)]
        runnable[launched[-1]] = f"atroposlib.environments.{path.stem}:{launched[-1]}"
    assert sorted(COLLECTION.values()) == sorted(runnable.values())
    # Each name is the env's own `name`, so `atropos-env NAME` matches its wandb/eval names.
    for name, target in COLLECTION.items():
        module, cls = target.split(":")
        tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        declared = [a.value.value for a in node.body if isinstance(a, ast.Assign)
                    and any(getattr(t, "id", None) == "name" for t in a.targets)]
        assert declared == [name], (name, target)


# ----------------------------------------------------------------------------- listing
def test_list_shows_the_collection_without_importing_any_env(collection):
    code = ("import sys\nfrom atroposlib.cli.env import main\ntry:\n    main(['list'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('atroposlib.environments.')"
            " or m in ('torch', 'transformers'))\nprint('IMPORTED', loaded)\n")
    proc = _run([], collection, code=code)
    assert proc.returncode == 0, proc.stderr
    registered, _, prefixes = proc.stdout.partition("\n\n")
    assert proc.stdout.splitlines()[-1] == "IMPORTED []"
    rows = {line.split()[0]: line for line in registered.splitlines()}
    assert sorted(rows) == sorted(COLLECTION)
    # then the ecosystem prefixes, each with an example, still without importing an adapter
    forms = [line.split()[:2] for line in prefixes.splitlines()[1:-1]]
    assert forms == [["verifiers:SPEC", "verifiers:reverse-text"],
                     ["openenv:SPEC", "openenv:my_env.server.app:app"], ["gym:ID", "gym:Blackjack-v1"]]
    assert "atroposlib.environments.gsm8k_server:GSM8kEnv" in rows["gsm8k"]
    assert "GSM8K with math-verify rewards" in rows["gsm8k"]


def test_third_party_env_is_listed_with_the_first_docstring_line(collection, third_party):
    proc = _run(["list"], third_party, collection)
    assert proc.returncode == 0, proc.stderr
    echo = next(line for line in proc.stdout.splitlines() if line.startswith("echo "))
    assert echo.split()[1] == "echo_envs.envs:EchoEnv"
    assert echo.endswith("Echo prompts back; score 1 when the reply is not empty.")
    assert "More text" not in proc.stdout
    assert "gsm8k" in proc.stdout  # both distributions are seen


def test_list_check_imports_and_reports_the_broken_entry(third_party):
    proc = _run(["list", "--check"], third_party)
    assert proc.returncode == 1
    broken = next(line for line in proc.stdout.splitlines() if line.startswith("broken "))
    assert "FAILED" in broken and "not a BaseEnv subclass" in broken
    echo = next(line for line in proc.stdout.splitlines() if line.startswith("echo "))
    assert echo.endswith("Echo prompts back; score 1 when the reply is not empty.")


# ------------------------------------------------------------------------------ errors
def test_unknown_name_suggests_the_closest_registered(collection):
    proc = _run(["gsm8", "serve"], collection)
    assert proc.returncode == 2
    assert "unknown environment 'gsm8'; did you mean gsm8k?" in proc.stderr
    proc = _run(["zzz", "serve"], collection)
    assert proc.returncode == 2 and "run `atropos-env list`" in proc.stderr


def test_missing_mode_and_bad_flags_are_explained(collection):
    proc = _run(["text_reversal"], collection)
    assert proc.returncode == 2 and "give a mode: serve, process or evaluate" in proc.stderr
    # Flags go to the env's own command line, which names the closest flag.
    proc = _run(["text_reversal", "process", "--env.group_sise", "4"], collection)
    assert proc.returncode == 2
    assert "atropos-env text_reversal process: error" in proc.stderr
    assert "did you mean --env.group_size" in proc.stderr


def test_mode_help_is_the_envs_own_help(collection):
    proc = _run(["text_reversal", "process", "--help"], collection)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: atropos-env text_reversal process")
    assert "--env.group_size" in proc.stdout and "--openai.base_url" in proc.stdout


# ------------------------------------------------------------------------------- running
@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer

    path = tmp_path_factory.mktemp("tok")
    make_tiny_tokenizer(path)
    return path


def test_third_party_process_runs_by_name(third_party, tokenizer_dir, tmp_path):
    out = tmp_path / "groups.jsonl"
    proc = _run(["echo", "process", "--testing", "--env.tokenizer_name", str(tokenizer_dir),
                 "--env.total_steps", "2", "--env.data_path_to_save_groups", str(out)],
                third_party)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and groups[0]["messages"][0][0]["content"] == "Say 1"


def test_evaluate_by_name_writes_metrics_samples_table_and_summary(third_party, tokenizer_dir,
                                                                  tmp_path):
    evals = tmp_path / "evals"
    proc = _run(["echo", "evaluate", "--testing", "--env.tokenizer_name", str(tokenizer_dir),
                 "--env.data_dir_to_save_evals", str(evals)], third_party)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((evals / "metrics.json").read_text())["results"]["all"] == {
        "eval/accuracy": 0.75}
    assert len((evals / "samples.jsonl").read_text().splitlines()) == 4
    with open(evals / "samples.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["prompt"] for r in rows] == ["q0", "q1", "q2", "q3"]
    assert [r["reference"] for r in rows] == ["a", "b", "c", "d"]
    assert [float(r["score"]) for r in rows] == [1.0, 1.0, 1.0, -1.0]
    assert all(r["completion"] for r in rows)
    assert (f"4 samples, mean score 0.5, accuracy 75.0% (score > 0); samples written to "
            f"{evals / 'samples.jsonl'} and {evals / 'samples.csv'}") in proc.stdout
    assert f"metrics written to {evals / 'metrics.json'}" in proc.stdout


def test_unknown_env_message_without_any_registered():
    from atroposlib.env_runtime.entry_points import unknown_env_message

    assert "no environments are registered" in unknown_env_message("x", [])
    assert unknown_env_message("mcq", ["mcqa", "gsm8k"]).endswith("did you mean mcqa?")
