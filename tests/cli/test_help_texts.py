"""Every command line's ``--help`` reads cleanly and a mistyped flag is named with its fix first.

Each console script of pyproject's ``[project.scripts]``, the env command line
(``python environments/arithmetic_server.py [serve|process|evaluate] --help``),
``atropos-env`` and the ``python -m`` tools run as subprocesses, offline. Their help must not leak implementation
details: pydantic's ``{str,null}`` types or ``default factory: <lambda>``, reStructuredText
markup (double backticks, ``:class:`` roles), two defaults for one flag, or a flag without help.
Every ``docs/...md`` page that a help text or any other string of the code names must exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
ENV_ENTRY_POINTS = PYPROJECT["project"]["entry-points"]["atroposlib.environments"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
           "GRADIO_ANALYTICS_ENABLED": "False", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

#: What must never show in a help text, with why.
LEAKS = {
    r"\{[^{}\s]*,null\}": "pydantic's optional type ({str,null}); set a metavar",
    r"default factory": "pydantic-settings' default factory; give a plain default",
    r"<lambda>|<function |PydanticUndefined| object at 0x": "a Python repr",
    r"``": "reStructuredText double backticks",
    r":(?:class|func|meth|mod|attr|data|exc|obj|ref):`": "a reStructuredText role",
    # the pydantic-backed command lines (atropos-grpo, envs) spell "unset" null, as YAML does;
    # plain argparse tools cannot take null, so their help says what leaving a flag out does
    r"\(default: None\)|\bNone(?: \(the default\))?[:;,]|; None\b|\(None\b": "Python's None (write null, "
    "or say what leaving the flag out does)",
}


@pytest.fixture(scope="module")
def entry_points(tmp_path_factory) -> Path:
    """A ``*.dist-info`` declaring our environments, as ``pip install`` records them."""
    root = tmp_path_factory.mktemp("site")
    info = root / "atroposlib_help_check-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: atroposlib-help-check\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in ENV_ENTRY_POINTS.items())
    (info / "entry_points.txt").write_text(f"[atroposlib.environments]\n{lines}")
    return root


def _run(command: list[str], extra_path: Path | None = None) -> subprocess.CompletedProcess:
    paths = [str(extra_path)] if extra_path else []
    env = {**os.environ, **OFFLINE, "PYTHONPATH": os.pathsep.join([*paths, str(REPO)])}
    return subprocess.run([sys.executable, *command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _script(name: str, *args: str) -> list[str]:
    """Run console script ``name`` the way its installed wrapper does."""
    module, func = SCRIPTS[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; sys.exit({func}())"
    return ["-c", code, *args]


ENV_SCRIPT = ["environments/arithmetic_server.py"]
HELP_COMMANDS = {
    **{name: _script(name, "--help") for name in SCRIPTS},
    "env script": [*ENV_SCRIPT, "--help"],
    **{f"env script {mode}": [*ENV_SCRIPT, mode, "--help"] for mode in ("serve", "process", "evaluate", "config")},
    "atropos-grpo config": _script("atropos-grpo", "config", "--help"),
    "atropos-env arithmetic serve": _script("atropos-env", "arithmetic", "serve", "--help"),
    **{module: ["-m", module, "--help"] for module in (
        "atroposlib.compat.managed_server_proxy",
        "atroposlib.inference.vllm_process",
        "atroposlib.inference.throughput",
    )},
}


def help_problems(text: str) -> list[str]:
    """Everything wrong with one ``--help`` output, one line per problem."""
    problems = [f"{why}: {m.group(0)!r}" for pattern, why in LEAKS.items()
                for m in re.finditer(pattern, text)]
    # One entry per option: its first line starts with "  -"; the help follows on that
    # line (after two spaces) or on the more deeply indented lines below it.
    entries: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if re.match(r"^ {2}-", line):
            current = [line]
            entries.append(current)
        elif current is not None and re.match(r"^ {3,}\S", line):
            current.append(line)
        else:
            current = None
    for entry in entries:
        flag = entry[0].split()[0].rstrip(",")
        first_help = re.split(r"\S {2,}", entry[0].strip(), maxsplit=1)[1:] or [""]
        help_text = " ".join([first_help[0], *(line.strip() for line in entry[1:])]).strip()
        if not help_text:
            problems.append(f"{flag}: no help text")
        if len(re.findall(r"\(default[: ]", help_text)) > 1:
            problems.append(f"{flag}: two defaults in {help_text!r}")
    return problems


def test_help_problems_finds_each_kind_of_leak():
    text = """usage: x [-h]

options:
  -h, --help            show this help message and exit
  --a {str,null}        A (default factory: TrainerConfig.<lambda>)
  --b B                 See :class:`Foo` and ``bar``.
  --c C
  --d D                 D (default: a free one). (default: null)
  --e E                 bearer token; None falls back to $KEY (default: None)
"""
    found = "\n".join(help_problems(text))
    for expected in ("{str,null}", "default factory", "<lambda>", ":class:`", "``",
                     "--c: no help text", "--d: two defaults", "(default: None)", "; None"):
        assert expected in found
    assert "--b: no help" not in found and "-h" not in found


@pytest.mark.parametrize("name", HELP_COMMANDS)
def test_help_is_clean(name, entry_points):
    result = _run(HELP_COMMANDS[name], entry_points)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: "), result.stdout[:200]
    assert help_problems(result.stdout) == []
    # every docs page it points to exists (paths from the repository root)
    assert sorted(p for p in _docs_paths_in(result.stdout) if not (REPO / p).is_file()) == []


#: Metavars that spell a Python type instead of naming the value (``--port int``).
TYPE_METAVAR = re.compile(r"^ {2}--[\w.-]+ (str|int|float|bool|Path|SecretStr|list\[|dict\[|tuple\[)")


@pytest.mark.parametrize("name", HELP_COMMANDS)
def test_every_command_shows_one_style(name, entry_points):
    """Metavars name the value in capitals (or list the choices), defaults read ``(default: X)``,
    and a description line follows the usage."""
    text = _run(HELP_COMMANDS[name], entry_points).stdout
    assert [line for line in text.splitlines() if TYPE_METAVAR.match(line)] == []
    assert re.findall(r"\(default [^:)]", text) == []
    after_usage = text.split("\n\n", 1)[1] if "\n\n" in text else ""
    assert after_usage and not after_usage.startswith(("options:", "positional arguments:")), text[:600]


TYPOS = {
    "env script": ([*ENV_SCRIPT, "serve", "--env.group_sze", "8"],
                   "unknown flag --env.group_sze; did you mean --env.group_size?"),
    "env script openai": ([*ENV_SCRIPT, "process", "--openai.base-ur", "x"],
                          "unknown flag --openai.base-ur; did you mean --openai.base_url?"),
    "atropos-env": (_script("atropos-env", "arithmetic", "evaluate", "--env.eval_sise=5"),
                    "unknown flag --env.eval_sise; did you mean --env.eval_size?"),
    "atropos-grpo": (_script("atropos-grpo", "--trainng-steps", "3"),
                     "unknown flag --trainng-steps; did you mean --training-steps?"),
    "run-api": (_script("run-api", "--prot", "8000"), "unknown flag --prot; did you mean --port?"),
    "view-run": (_script("view-run", "--api-ulr", "x"),
                 "unknown flag --api-ulr; did you mean --api-url?"),
    "atropos-dpo-gen": (_script("atropos-dpo-gen", "--num-seq-to-save", "2"),
                        "unknown flag --num-seq-to-save; did you mean --num-seqs-to-save?"),
    "atropos-launch": (_script("atropos-launch", "missing.yaml", "--run-dr", "x"),
                       "unknown flag --run-dr; did you mean --run-dir?"),
    # a prefix of a flag is a typo, not the flag: argparse's abbreviation matching is off
    "run-api prefix": (_script("run-api", "--por", "8000"), "unknown flag --por; did you mean --port?"),
    "env script prefix": ([*ENV_SCRIPT, "serve", "--env.group_siz", "8"],
                          "unknown flag --env.group_siz; did you mean --env.group_size?"),
    "atropos-grpo prefix": (_script("atropos-grpo", "--training-step", "3"),
                            "unknown flag --training-step; did you mean --training-steps?"),
    # the output file is a positional argument: no flag is suggested for it, the positional is
    "atropos-sft-gen --output": (_script("atropos-sft-gen", "--output", "out.jsonl"),
                                 "unknown flag --output; the output JSONL file is the positional "
                                 "argument FILEPATH, given without a flag: atropos-sft-gen FILEPATH [flags]"),
    "atropos-dpo-gen --output-file": (_script("atropos-dpo-gen", "--output-file=out.jsonl"),
                                      "unknown flag --output-file; the output JSONL file is the positional "
                                      "argument FILEPATH, given without a flag: atropos-dpo-gen FILEPATH [flags]"),
}


@pytest.mark.parametrize("name", TYPOS)
def test_a_mistyped_flag_is_named_first_with_the_closest_flag(name, entry_points):
    command, message = TYPOS[name]
    result = _run(command, entry_points)
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.endswith(f"error: {message}"), result.stderr
    assert "usage:" in result.stderr and len(result.stderr.splitlines()) < 12


def test_only_close_flags_are_suggested():
    from atroposlib.utils.flags import ArgumentParser, closest_flag, unknown_flag_message

    known = ["-h", "--help", "--group-size", "--max-token-len", "--model", "--env.group_size",
             "--env.eval_size", "--env.tokenizer_name"]
    assert closest_flag("--grup-size", known) == "--group-size"
    assert closest_flag("--env.group_sze", known) == "--env.group_size"
    assert closest_flag("--group_size", known) == "--group-size"
    assert closest_flag("--model-name", known) == "--model"  # the one flag whose words it has
    # unrelated flags are not suggested, however much they share (dashes, an --env. prefix)
    assert closest_flag("--output-file", known) is None
    assert closest_flag("--env.bogus", known) is None
    assert closest_flag("--env.size", known) is None  # two --env. flags end in size: no guess
    parser = ArgumentParser(prog="tool")
    parser.add_argument("config", help="launch YAML, e.g. configs/x.yaml")
    parser.add_argument("--run-dir")
    assert unknown_flag_message(["--config-file", "c.yaml", "--bogus"], parser).splitlines() == [
        "unknown flag --config-file; the launch YAML is the positional argument CONFIG, "
        "given without a flag: tool CONFIG [flags]",
        "unknown flag --bogus; see --help for every flag"]


#: A docs page as the code names it for the user (help texts, descriptions, error messages).
DOCS_PATH = re.compile(r"\bdocs/[\w./-]*?\.md\b")
#: The code whose strings name docs pages to users.
SOURCE_DIRS = ("atroposlib", "example_trainer", "environments", "examples")


def _docs_paths_in(text: str) -> set[str]:
    return set(DOCS_PATH.findall(text))


def test_docs_path_pattern_finds_each_spelling():
    text = "see docs/guides/ecosystems.md), (docs/metrics.md. or `docs/a-b_c.md` but not docs/oauth2-redirect"
    assert _docs_paths_in(text) == {"docs/guides/ecosystems.md", "docs/metrics.md", "docs/a-b_c.md"}


def test_every_docs_path_in_the_code_exists():
    missing = sorted(f"{path.relative_to(REPO)}: {found}"
                     for folder in SOURCE_DIRS for path in (REPO / folder).rglob("*.py")
                     for found in _docs_paths_in(path.read_text(encoding="utf-8"))
                     if not (REPO / found).is_file())
    assert missing == []


def test_atropos_env_help_points_to_the_ecosystems_guide(entry_points):
    result = _run(_script("atropos-env", "--help"), entry_points)
    assert "docs/guides/ecosystems.md" in _docs_paths_in(result.stdout)
