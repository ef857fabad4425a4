"""Run environments published by the verifiers project through ``atropos-env verifiers:ID``.

Usage::

    python benchmarks/compat_verifiers.py VERIFIERS_CHECKOUT [--envs glossary scratchpad ...]
        [--groups 2] [--group-size 4] [--max-tokens 128] [--vllm-url URL] [--json-out OUT]

For each env folder ``VERIFIERS_CHECKOUT/environments/<env>``:

1. it is installed as a user would install it, with pip, into its own target directory
   under a temporary folder (``pip install --no-deps --no-build-isolation --target DIR
   FOLDER``; ``--no-deps``: verifiers itself is already installed, ``--no-build-isolation``:
   the build backend comes from this interpreter, so no package index is reached). The
   project's virtualenv is not touched; the env's CLI run gets ``PYTHONPATH=DIR``.
2. ``atropos-env verifiers:<id> process`` runs it as a subprocess (the real command line)
   against one real vLLM serving the bundled model (started here, or ``--vllm-url``),
   writing ``--groups`` groups of ``--group-size`` rollouts to JSONL (with messages).
3. Every rollout's score is checked against the environment's own reward, computed again
   by verifiers here and independently of the adapter: the recorded conversation becomes a
   ``verifiers.v1.Trace`` of the matching task (found by its prompt) and the task's own
   ``Task.score`` (its ``@vf.reward`` functions, weighted: the call verifiers' replay
   command re-scores with) sets ``trace.reward``. Envs whose reward is set by the
   environment's ``run`` (not by a rubric) have nothing to re-score offline; their rollouts
   are counted as ``not_rescorable``.

The result (per env: pass/fail, groups, rollouts, matches, the first mismatches, model
turns, tool calls and results, the error and the env's log tail when it failed) goes to ``benchmarks/results/compat_verifiers_<date>.json``.
Nothing reaches the network: installs are offline and the model is the bundled one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import default_result_path, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENVS = ("glossary", "scratchpad", "kuhn_poker", "color_codeword")
#: scores within this of the re-computed reward count as equal
TOLERANCE = 1e-6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring).

    Raises:
        SystemExit: a bad argument (argparse's message), or a checkout without ``environments/``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a work tree of the verifiers repository")
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS),
                        help="folders under environments/ (default: %(default)s)")
    parser.add_argument("--groups", type=int, default=2, help="groups per env (default 2)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per group (default 4)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="tokens per model turn (default 128)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per env run at most (default 900)")
    parser.add_argument("--vllm-url", help="use this running vLLM (serving the bundled model as "
                        "smollm2) instead of starting one")
    parser.add_argument("--json-out", type=Path, help="result file (default: "
                        "benchmarks/results/compat_verifiers_<date>.json)")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.group_size < 1:
        parser.error("--groups and --group-size must be at least 1")
    folder = args.checkout / "environments"
    if not folder.is_dir():
        parser.error(f"{args.checkout} has no environments/ folder: pass a verifiers checkout")
    missing = [e for e in args.envs if not (folder / e / "pyproject.toml").is_file()]
    if missing:
        parser.error(f"not an env package under {folder}: {', '.join(missing)}")
    return args


def env_id(folder_name: str) -> str:
    """The id verifiers loads an env folder by: its package name with ``-`` (``kuhn-poker``)."""
    return folder_name.replace("_", "-")


def compare(scores: list[float], expected: list[float | None]) -> dict[str, Any]:
    """Compare recorded scores with the re-computed rewards, rollout by rollout.

    Args:
        scores: the scores the adapter wrote, one per rollout.
        expected: the environment's own reward for each rollout, or None where it cannot be
            re-computed offline.

    Returns:
        ``{"rollouts", "matched", "mismatched", "not_rescorable", "mismatches"}`` (the first
        five mismatches as ``{"index", "score", "expected"}``).

    Raises:
        ValueError: the lists differ in length.
    """
    if len(scores) != len(expected):
        raise ValueError(f"{len(scores)} scores but {len(expected)} re-computed rewards")
    mismatches = [{"index": i, "score": s, "expected": e}
                  for i, (s, e) in enumerate(zip(scores, expected, strict=True))
                  if e is not None and abs(s - e) > TOLERANCE]
    unknown = sum(e is None for e in expected)
    return {"rollouts": len(scores), "matched": len(scores) - unknown - len(mismatches),
            "mismatched": len(mismatches), "not_rescorable": unknown,
            "mismatches": mismatches[:5]}


def verdict(record: dict[str, Any], groups_wanted: int) -> str:
    """``pass`` when every wanted group was written and every re-scored rollout matched.

    An env with no rollout that could be re-scored passes only on its written groups and
    says so (``pass (not re-scored)``); a run that wrote fewer groups fails.
    """
    if record.get("groups", 0) < groups_wanted:
        return "fail"
    if record.get("mismatched", 0):
        return "fail"
    if not record.get("matched"):
        return "pass (not re-scored)"
    return "pass"


# ------------------------------------------------------------------ re-scoring by verifiers
def _tasks(taskset_id: str, limit: int = 512) -> list[Any]:
    import verifiers.v1 as vf

    config = vf.taskset_config_type(taskset_id)(id=taskset_id)
    taskset = vf.load_taskset(config)
    return list(taskset.take(limit)) if hasattr(taskset, "take") else list(taskset)[:limit]


def _first_user_text(messages: list[dict[str, Any]]) -> str | None:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


def _prompt_text(task: Any) -> str | None:
    prompt = task.data.prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(getattr(prompt[0], "content", None), str):
        return prompt[0].content
    return None


def rescore(tasks: list[Any], messages: list[dict[str, Any]]) -> float | None:
    """The reward verifiers gives the conversation ``messages``, or None if it cannot tell.

    The task is the one whose prompt is the conversation's first user message; the
    conversation becomes a ``Trace`` (assistant messages marked sampled) and the task's
    ``Task.score`` fills its rewards. None: no task matches, or the task has no
    ``@vf.reward`` function (its env's ``run`` sets the reward).
    """
    import verifiers.v1 as vf
    from pydantic import TypeAdapter

    first = _first_user_text(messages)
    task = next((t for t in tasks if first is not None and _prompt_text(t) == first), None)
    if task is None or not task.hooks("reward"):
        return None
    parse = TypeAdapter(vf.Message).validate_python
    nodes = [vf.MessageNode(parent=i - 1 if i else None, message=parse(m),
                            sampled=m.get("role") == "assistant")
             for i, m in enumerate(messages)]
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data),
                     agent=vf.AgentInfo(config=vf.AgentConfig()), nodes=nodes)
    asyncio.run(task.score(trace))
    return float(trace.reward)


def conversation_counts(groups: list[dict[str, Any]], model_dir: Path) -> dict[str, int]:
    """What the rollouts did: model turns, tool calls and results, and how many rollouts'
    prompts declared tools to the model (``<tools>`` or the template's own form)."""
    messages = [m for g in groups for convo in g["messages"] for m in convo]
    counts = {
        "assistant_turns": sum(m.get("role") == "assistant" for m in messages),
        "tool_calls": sum(len(m.get("tool_calls") or []) for m in messages),
        "tool_results": sum(m.get("role") == "tool" for m in messages),
        "rollouts_with_tools_in_prompt": 0,
    }
    if groups:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        counts["rollouts_with_tools_in_prompt"] = sum(
            "<tools>" in tokenizer.decode(tokens) for g in groups for tokens in g["tokens"])
    return counts


# ------------------------------------------------------------------ running
def install(folder: Path, target: Path) -> None:
    """``pip install --no-deps --no-build-isolation --target target folder`` (offline)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target), str(folder)],
                   check=True, capture_output=True, text=True)


def run_env(name: str, site: Path, out: Path, args: argparse.Namespace, base_url: str,
            model_dir: Path) -> tuple[int, float]:
    """Run ``atropos-env verifiers:<id> process``; return (exit code, seconds)."""
    cmd = [sys.executable, "-m", "atroposlib.cli.env", f"verifiers:{env_id(name)}", "process",
           "--env.total_steps", str(args.groups), "--env.group_size", str(args.group_size),
           "--env.max_tokens", str(args.max_tokens), "--env.include_messages", "true",
           "--env.ensure_scores_are_not_same", "false", "--env.use_wandb", "false",
           "--env.max_consecutive_failures", "2", "--env.tokenizer_name", str(model_dir),
           "--env.data_path_to_save_groups", str(out / f"{name}.jsonl"),
           "--openai.base_url", base_url, "--openai.model_name", "smollm2",
           "--openai.server_type", "vllm"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    start = time.monotonic()
    with (out / f"{name}.log").open("wb") as log:
        try:
            code = subprocess.run(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = -1
    return code, time.monotonic() - start


def check_env(name: str, folder: Path, work: Path, args: argparse.Namespace, base_url: str,
              model_dir: Path) -> dict[str, Any]:
    """Install, run and check one env; its result record."""
    record: dict[str, Any] = {"env": name, "id": env_id(name)}
    site = work / "site" / name
    try:
        install(folder, site)
    except subprocess.CalledProcessError as exc:
        record.update(verdict="fail", error=f"pip install failed: {exc.stderr[-800:]}")
        return record
    code, seconds = run_env(name, site, work, args, base_url, model_dir)
    record.update(exit_code=code, seconds=round(seconds, 1))
    path = work / f"{name}.jsonl"
    groups = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    record["groups"] = len(groups)
    scores = [float(s) for g in groups for s in g["scores"]]
    sys.path.insert(0, str(site))
    try:
        tasks = _tasks(env_id(name)) if groups else []
        expected = [rescore(tasks, m) for g in groups for m in g["messages"]]
    except Exception as exc:  # noqa: BLE001 - a failed re-score is recorded, not fatal
        expected = [None] * len(scores)
        record["rescore_error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        sys.path.remove(str(site))
    record.update(compare(scores, expected))
    record["score_mean"] = sum(scores) / len(scores) if scores else None
    record.update(conversation_counts(groups, model_dir))
    record["verdict"] = verdict(record, args.groups)
    if record["verdict"] == "fail":
        log = (work / f"{name}.log").read_text(errors="replace").splitlines()
        record["log_tail"] = [line[:600] for line in log if "aiohttp.access" not in line][-8:]
        dropped = [line.split(": ", 2)[-1] for line in log if "dropping the group" in line]
        record["error"] = dropped[0][:600] if dropped else next(
            (line[:600] for line in reversed(log) if line.startswith("error:")), None)
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from atroposlib.inference.bundled import prepare_bundled_model

    model_dir = prepare_bundled_model()
    process = None
    base_url = args.vllm_url
    work = Path(tempfile.mkdtemp(prefix="compat-verifiers-"))
    if base_url is None:
        from atroposlib.inference.vllm_process import VLLMProcess

        process = VLLMProcess(model_dir, served_model_name="smollm2", dtype="float32",
                              max_model_len=2048, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                              log_path=work / "vllm.log", dev_mode=True)
        process.start(timeout=900)
        base_url = process.base_url
    records = []
    try:
        for name in args.envs:
            record = check_env(name, args.checkout / "environments" / name, work, args,
                               base_url, model_dir)
            records.append(record)
            print(f"{name}: {record['verdict']} groups={record.get('groups', 0)} "
                  f"rollouts={record.get('rollouts', 0)} matched={record.get('matched', 0)} "
                  f"mismatched={record.get('mismatched', 0)} "
                  f"not_rescorable={record.get('not_rescorable', 0)}", flush=True)
    finally:
        if process is not None:
            process.stop()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.checkout, capture_output=True,
                            text=True).stdout.strip() or None
    import verifiers

    payload = {"verifiers_commit": commit, "verifiers_version": verifiers.__version__,
               "groups": args.groups, "group_size": args.group_size,
               "max_tokens": args.max_tokens, "envs": records,
               "passed": [r["env"] for r in records if r["verdict"].startswith("pass")]}
    out = args.json_out or default_result_path("compat_verifiers")
    write_result(out, "compat_verifiers", payload, seeds=None, notes=(
        "Sampling is unseeded (temperature 1.0): rewards vary between runs; what is checked "
        "is that each score equals the reward verifiers re-computes for the same rollout."))
    print(f"wrote {out} (work dir {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
