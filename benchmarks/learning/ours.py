"""Our contender: ``atropos-launch`` on the quickstart config, its policy copied at the wall points."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.learning.procs import read
from benchmarks.process_tree import ROOT, Tree

QUICKSTART = ROOT / "configs" / "quickstart-cpu.yaml"  # LoRA adapters on the top layers
QUICKSTART_FULL = ROOT / "configs" / "quickstart-cpu-full.yaml"  # the same, fully fine-tuned
LOSSES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
OURS = (*(f"ours-{loss}" for loss in LOSSES), "ours-grpo-tis", "ours-grpo-lora", "ours-gspo-lora", "ours-gspo-node")
#: the bearer token of the ``-node`` contender's inference node (127.0.0.1 only)
NODE_KEY = "bench-node-key"
POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # wall points, as fractions of the budget
#: seconds a contender may take beyond its budget (model load, vLLM start, final save)
STARTUP_ALLOWANCE = 900.0


def task_shape() -> dict[str, int]:
    """The task's shape every contender trains with, read from the quickstart config (its one home).

    Returns:
        ``{"group_size", "max_tokens", "batch_size", "trainable_layers"}``: rollouts per group,
        reply tokens at most, sequences per step, and the top layers trained. TRL gets these
        same values, so the two sides cannot drift apart.

    Raises:
        KeyError: the config lacks one of them (``env.group_size``, ``env.max_tokens``,
            ``trainer.batch_size``, ``trainer.train_last_layers``).
    """
    from atroposlib.utils.yaml_file import load_yaml

    config = load_yaml(QUICKSTART)
    env_args, trainer = config["envs"][0]["args"], config["trainer"]
    return {"group_size": int(env_args["env.group_size"]), "max_tokens": int(env_args["env.max_tokens"]),
            "batch_size": int(trainer["batch_size"]), "trainable_layers": int(trainer["train_last_layers"])}


def lora_placement(rank: int) -> dict[str, Any]:
    """Where and how our quickstart puts LoRA adapters, at rank ``rank``: :func:`apply_lora`'s keywords.

    Read from the quickstart config (its ``lora_alpha / lora_r`` ratio kept at ``rank``), with
    the trainer's own defaults for what the config leaves out, so the benchmarks' adapters (TRL's
    LoRA contender, bench_delta_sync's LoRA policy) cannot drift from the quickstart's.

    Returns:
        ``{"r", "alpha", "dropout", "target_modules", "last_layers"}``.
    """
    from atroposlib.utils.yaml_file import load_yaml
    from example_trainer.config import TrainerConfig

    ours = TrainerConfig(**load_yaml(QUICKSTART)["trainer"])
    return {"r": rank, "alpha": ours.lora_alpha * rank / ours.lora_r, "dropout": ours.lora_dropout,
            "target_modules": list(ours.lora_target_modules), "last_layers": ours.train_last_layers}


def run_ours(name: str, minutes: float, out: Path, difficulty: int, lr: float | None = None,
             env_args: dict[str, str] | None = None,
             trainer_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``atropos-launch`` on the quickstart config with the contender's objective.

    Args:
        name: an entry of :data:`OURS` (``ours-<loss>[-tis|-lora|-node]``). ``-node``: the
            trainer launches no vLLM; it trains through an ``atropos-inference-node`` in its own
            mount namespace (:func:`hidden_node`), which cannot see the run directory or /tmp,
            so every weight update travels over HTTP. The trainer then writes no weights file,
            so only the policy at the end of the budget (its final checkpoint) is evaluated.
        minutes: the training wall budget.
        out: the directory that gets the run directory ``<out>/<name>``.
        difficulty: the arithmetic difficulty (``env.difficulty``).
        lr: replaces the config's learning rate when given.
        env_args: added to (or replacing) every env's ``args`` (e.g.
            ``{"env.item_filter.enabled": "true"}``).
        trainer_args: added to (or replacing) the ``trainer:`` section.

    Returns:
        ``{"points": {fraction: model path}, "steps", "sequences", "train_seconds",
        "peak_rss_bytes", "peak_rss_by_part", "batch_wait_seconds", "lr", "env_args",
        "trainer_args", "groups"}``: ``batch_wait_seconds`` is the time the trainer spent waiting
        for batches within the budget (a loop bound by sampling waits long), ``trainer_args`` the
        overrides given here (``{}`` if none), ``groups`` the env's count of sampled and dropped
        groups when its log has them.

    Raises:
        RuntimeError: the launch failed (message names its log).
    """
    import yaml

    from atroposlib.utils.yaml_file import load_yaml

    loss = name.removeprefix("ours-").removesuffix("-tis").removesuffix("-lora").removesuffix("-node")
    node = name.endswith("-node")
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "points").mkdir(parents=True)
    config = load_yaml(QUICKSTART if name.endswith("-lora") else QUICKSTART_FULL)
    budget = 60.0 * minutes
    config["trainer"].update(training_steps=100_000, max_train_seconds=budget, loss_type=loss,
                             is_correction="tis" if name.endswith("-tis") else "none",
                             eval_interval=0, checkpoint_interval=0, **(trainer_args or {}))
    if lr is not None:
        config["trainer"]["lr"] = lr
    config.pop("eval_env", None)  # evaluation happens after the run, with one evaluator
    config["run_dir"] = str(run_dir)
    env_args = {"env.difficulty": str(difficulty), **(env_args or {})}
    for env in config["envs"]:
        env["script"] = str((ROOT / env["script"]).resolve())
        env["args"] = {**env.get("args", {}), **env_args}
    cfg_path = run_dir / "launch.yaml"
    with contextlib.ExitStack() as stack:
        if node:
            url = stack.enter_context(hidden_node(run_dir, out / f"{name}-node-logs", config["trainer"]))
            config["trainer"].update(vllm_url=f"{url}/v1", vllm_api_key=NODE_KEY)
            for env in config["envs"]:
                env["args"]["openai.api_key"] = NODE_KEY
        cfg_path.write_text(yaml.safe_dump(config))
        result = _launch(name, cfg_path, run_dir, budget, points_wanted=POINTS[1:] if not node else ())
    result.update(lr=config["trainer"]["lr"], env_args=env_args, trainer_args=dict(trainer_args or {}))
    return result


def _launch(name: str, cfg_path: Path, run_dir: Path, budget: float,
            points_wanted: tuple[float, ...]) -> dict[str, Any]:
    """Run ``atropos-launch cfg_path``, copying the synced weights at ``points_wanted``."""
    argv = [sys.executable, "-m", "atroposlib.cli.launch", str(cfg_path)]
    with Tree(argv, run_dir / "bench.log") as tree:
        trainer_log = run_dir / "logs" / "trainer.log"
        deadline = time.monotonic() + STARTUP_ALLOWANCE
        while "[grpo] registered with" not in read(trainer_log):
            if tree.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the trainer never registered; see {trainer_log}")
            time.sleep(0.5)
        start = time.monotonic()
        reached: dict[float, tuple[str | None, int]] = {}
        for frac in points_wanted:
            while time.monotonic() - start < frac * budget and tree.proc.poll() is None:
                time.sleep(0.2)
            if tree.proc.poll() is None:
                snapshot = snapshot_sync_weights(run_dir, run_dir / "points" / f"{frac:.2f}")
                # no weights although steps were logged: the trainer has just finished and
                # removed them, so the final checkpoint (the default below) is the policy
                if snapshot[0] is not None or not read(run_dir / "metrics.jsonl").strip():
                    reached[frac] = snapshot
        code = tree.wait(budget + STARTUP_ALLOWANCE)
    if code != 0:
        raise RuntimeError(f"{name}: atropos-launch exited with {code}; see {run_dir}/logs")
    summary = json.loads((run_dir / "summary.json").read_text())
    history = [json.loads(line) for line in read(run_dir / "metrics.jsonl").splitlines() if line]
    final = str(run_dir / "checkpoints" / "final")
    # a point after the trainer had stopped holds the final policy; a step that ended past the
    # budget (its length misjudged) is not counted: the point M is the policy at M
    points = {0.0: None, **{f: reached[f][0] if f in reached else final for f in points_wanted}, 1.0: final}
    if 1.0 in reached:
        points[1.0] = reached[1.0][0]
    if 1.0 in reached:
        history, seconds = history[:reached[1.0][1]], budget
    else:
        seconds = min(summary["train_loop_seconds"], budget)
    return {"points": points, "steps": len(history),
            "sequences": sum(h.get("sequences", 0) for h in history),
            "batch_wait_seconds": sum(h.get("batch_wait_seconds") or 0.0 for h in history),
            "train_seconds": seconds, "peak_rss_bytes": tree.peak_rss,
            "peak_rss_by_part": dict(tree.peak_rss_by_part), "peak_pss_bytes": tree.peak_pss,
            "rss_by_part_at_peak": dict(tree.rss_by_part_at_peak), "other_cmdlines": dict(tree.other_cmdlines),
            "groups": env_group_counts(run_dir / "logs"), "ledger": summary.get("ledger")}


@contextlib.contextmanager
def hidden_node(run_dir: Path, log_dir: Path, trainer: dict[str, Any]) -> Iterator[str]:
    """``atropos-inference-node`` under ``unshare -m`` with tmpfs over ``run_dir`` and /tmp.

    Served like the trainer's own vLLM (its dtype and context length); the node's logs go to
    ``log_dir``, outside what it cannot see. Yields its URL once healthy; stops it on exit.

    Raises:
        RuntimeError: not root / no ``unshare``, or the node did not become healthy in 300 s.
    """
    import shutil as sh

    import httpx

    from atroposlib.inference.vllm_process import find_free_port
    from example_trainer.precision import vllm_dtype_for

    if os.geteuid() != 0 or sh.which("unshare") is None:
        raise RuntimeError("the -node contender needs root and unshare(1) for a private mount namespace")
    log_dir.mkdir(parents=True, exist_ok=True)
    port = find_free_port()
    node = [sys.executable, "-m", "atroposlib.cli.inference_node", "--port", str(port),
            "--dtype", vllm_dtype_for(str(trainer.get("vllm_dtype", "auto"))),
            "--max-model-len", str(trainer.get("vllm_max_model_len", 2048)),
            "--log", str(log_dir / "vllm.log")]
    script = (f"mount -t tmpfs tmpfs {shlex.quote(str(run_dir))} && mount -t tmpfs tmpfs /tmp && "
              f"exec {shlex.join(node)}")
    with Tree(["unshare", "-m", "sh", "-c", script], log_dir / "node.log",
              env={"ATROPOS_API_KEY": NODE_KEY}) as tree:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if tree.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the inference node did not become healthy; see {log_dir}/node.log")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield url


def env_group_counts(log_dir: Path) -> dict[str, Any]:
    """The env's cumulative group counters over the run, from its progress log lines.

    The serve loop logs ``step N: ... ; {stats}`` about once a minute and ``serve stopped;
    stats: {stats}`` at the end (:meth:`atroposlib.env_runtime.serve.ServeLoop.log_progress`).

    Returns:
        ``{"series": [{"step", "accepted", "dropped_same_scores", "sampled"}, ...], "final":
        the last of them}`` (``step`` None for the line logged when the env stopped; ``{}``
        when no log has a line).
    """
    import ast

    series: list[dict[str, int]] = []
    for log in sorted(log_dir.glob("*.log")):
        for line in read(log).splitlines():
            step = re.search(r"step (\d+): \d+ rollout group", line)
            if not (step or "serve stopped; stats:" in line) or "{" not in line:
                continue
            try:
                stats = ast.literal_eval(line[line.index("{"):line.rindex("}") + 1])
            except (ValueError, SyntaxError):
                continue
            accepted = int(stats.get("groups_accepted", 0))
            dropped = {k: int(v) for k, v in stats.items() if k.startswith("groups_dropped_")}
            series.append({"step": int(step.group(1)) if step else None,  # None: the final line
                           "accepted": accepted,
                           "dropped_same_scores": dropped.get("groups_dropped_same_scores", 0),
                           "sampled": accepted + sum(dropped.values())})
    return {"series": series, "final": series[-1]} if series else {}


def snapshot_sync_weights(run_dir: Path, dest: Path) -> tuple[str | None, int]:
    """Copy what the trainer last pushed to vLLM, never a half-written file.

    The trainer pushes one of two things after each step, by its ``weight_sync`` path:

    * ``reload``: it rewrites ``vllm_weights/model.safetensors`` in place (in a background
      thread with ``--weight-sync-overlap``), which takes well under a second; the file may hold
      only the trained tensors (the frozen ones never change).
    * ``lora`` (a LoRA run's ``auto``): it saves the adapter alone into a new folder
      ``vllm_weights/adapters/push_<n>`` (peft's ``save_pretrained``: ``adapter_model.safetensors``
      first, ``adapter_config.json`` last) and keeps the newest two. ``push_0`` is the starting
      adapter vLLM serves before the first step.

    The newest complete push is copied: the newest adapter folder that holds its
    ``adapter_config.json`` or ``model.safetensors``, whichever was written last. A copy is
    kept only if the push was last written at least a second before the copy began and did
    not change during it; the steps finished are the lines of ``metrics.jsonl`` when it began
    (each step's line is written right after its push starts). Before the first step the
    starting model is the policy, so nothing is copied (the evaluator then uses the bundled
    model). ``dest/point.json`` records the point's kind (``{"kind": "adapter"|"weights",
    "source": path under the run directory, "steps"}``); ``dest`` holds the adapter folder's
    files or ``model.safetensors``.

    Returns:
        ``(dest, steps)``: the model directory (None when no step has finished yet, the
        starting model is the policy) and the steps finished when it was copied.

    Raises:
        RuntimeError: no consistent copy within about two minutes.
    """
    metrics = run_dir / "metrics.jsonl"
    for _ in range(480):
        source = last_push(run_dir / "vllm_weights")
        if source is None or not metrics.exists():
            return None, 0
        before = _stamp(source)
        if before and time.time_ns() - max(mtime for _, _, mtime in before) >= 1_000_000_000:
            steps = len(read(metrics).splitlines())
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            with contextlib.suppress(FileNotFoundError, shutil.Error):  # pruned meanwhile: retry
                if source.is_dir():
                    shutil.copytree(source, dest, dirs_exist_ok=True)
                else:
                    shutil.copy2(source, dest / source.name)
                if _stamp(source) == before:
                    kind = "adapter" if source.is_dir() else "weights"
                    (dest / "point.json").write_text(json.dumps(
                        {"kind": kind, "source": str(source.relative_to(run_dir)), "steps": steps}))
                    return str(dest), steps
        time.sleep(0.25)
    raise RuntimeError(f"could not take a consistent copy of what the trainer pushed in {run_dir}/vllm_weights")


def last_push(weights_dir: Path) -> Path | None:
    """The trainer's newest complete push in ``weights_dir``: an adapter folder or the weights file.

    Returns:
        The newest ``adapters/push_<n>`` folder holding ``adapter_config.json`` (peft writes it
        last) or ``model.safetensors``, whichever was modified last; None when neither exists.
    """
    folders = [p for p in (weights_dir / "adapters").glob("push_*")
               if p.name[5:].isdigit() and (p / "adapter_config.json").is_file()]
    candidates = [max(folders, key=lambda p: int(p.name[5:]))] if folders else []
    if (weights_dir / "model.safetensors").is_file():
        candidates.append(weights_dir / "model.safetensors")
    stamped = [(max((m for _, _, m in stamp), default=0), path) for path in candidates
               if (stamp := _stamp(path))]
    return max(stamped, key=lambda s: s[0])[1] if stamped else None


def _stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """``(name, size, mtime_ns)`` of the file ``path`` or of every file in the folder ``path``.

    Empty when it no longer exists (the trainer pruned it).
    """
    try:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        return tuple((p.name, (st := p.stat()).st_size, st.st_mtime_ns) for p in files)
    except FileNotFoundError:
        return ()
