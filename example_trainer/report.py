"""Run bookkeeping: per-step metrics log, evaluations through a command, plot and summary.json."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any


def run_eval_command(template: str, *, base_url: str, model_name: str, out_dir: Path, step: int,
                     metric: str, timeout: float, log_path: Path) -> dict[str, float]:
    """Run an evaluation command and read its ``metrics.json``.

    The command is a shell template; ``{base_url}``, ``{model_name}``, ``{out_dir}`` and
    ``{step}`` are substituted (shell-quoted). It must write ``{out_dir}/metrics.json`` in the
    ``BaseEnv.evaluate_log`` format (``{"results": {"all": {metric: value}}}``), e.g.
    ``python environments/arithmetic_server.py evaluate --openai.base_url {base_url}
    --env.data_dir_to_save_evals {out_dir}``.

    Args:
        template: the command template.
        base_url: the vLLM OpenAI base URL.
        model_name: the served model name.
        out_dir: where the command writes metrics (created).
        step: the trainer step being evaluated (0 = before training).
        metric: key read from ``results.all``.
        timeout: seconds before the command is killed.
        log_path: file receiving the command's output (appended).

    Returns:
        Every numeric metric of ``results.all``, plus ``eval_seconds``.

    Raises:
        RuntimeError: the command failed, timed out, or wrote no ``metric`` (message has the
            tail of its output).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    command = template.format(base_url=shlex.quote(base_url), model_name=shlex.quote(model_name),
                              out_dir=shlex.quote(str(out_dir)), step=step)
    begin = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n$ {command}\n".encode())
        log.flush()
        try:
            proc = subprocess.run(command, shell=True, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"eval command timed out after {timeout:.0f}s: {command}\n"
                               f"{_tail(log_path)}") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"eval command exited with {proc.returncode}: {command}\n{_tail(log_path)}")
    path = out_dir / "metrics.json"
    if not path.exists():
        raise RuntimeError(f"eval command wrote no {path}; it must write metrics.json there "
                           f"(BaseEnv evaluate --env.data_dir_to_save_evals DIR does)\n{_tail(log_path)}")
    results = json.loads(path.read_text()).get("results", {}).get("all", {})
    if metric not in results:
        raise RuntimeError(f"{path} has no {metric!r} in results.all (keys: {sorted(results)}); "
                           "set --eval-metric to one of them")
    metrics = {k: float(v) for k, v in results.items() if isinstance(v, int | float)}
    metrics["eval_seconds"] = time.perf_counter() - begin
    return metrics


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


class RunLog:
    """Per-step metrics: console line, ``metrics.jsonl``, optional wandb, plot and summary.

    Attributes:
        run_dir: the run directory.
        history: one dict per logged step.
        evals: ``[(step, accuracy)]`` in order.
    """

    def __init__(self, run_dir: Path, use_wandb: bool = False, wandb_project: str | None = None,
                 wandb_group: str | None = None, config: dict[str, Any] | None = None):
        """Open ``<run_dir>/metrics.jsonl`` (and a wandb run when ``use_wandb``)."""
        self.run_dir = run_dir
        self.history: list[dict[str, Any]] = []
        self.evals: list[tuple[int, float]] = []
        self._file = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._wandb = None
        if use_wandb:
            import wandb

            self._wandb = wandb.init(project=wandb_project, group=wandb_group, config=config,
                                     dir=str(run_dir), name=f"grpo-{run_dir.name}")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record ``metrics`` for ``step`` and print the main ones on one line."""
        record = {"step": step, **metrics}
        self.history.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        keys = ("reward/mean", "loss", "kl", "grad_norm", "clip_fraction", "tokens_per_second",
                "step_seconds", "sync/update_seconds", "eval/accuracy")
        shown = " ".join(f"{k}={_fmt(metrics[k])}" for k in keys if k in metrics)
        print(f"[grpo] step {step}: {shown}", flush=True)

    def log_eval(self, step: int, metrics: dict[str, float], metric: str) -> None:
        """Record an evaluation (also as ``eval/accuracy`` in the step log)."""
        self.evals.append((step, metrics[metric]))
        self.log(step, {"eval/accuracy": metrics[metric],
                        **{f"eval_raw/{k}": v for k, v in metrics.items()}})

    def plot(self, path: Path) -> None:
        """Save a PNG of the mean reward per step and the eval accuracy per step."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [h["step"] for h in self.history if "reward/mean" in h]
        rewards = [h["reward/mean"] for h in self.history if "reward/mean" in h]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, rewards, label="train reward (mean per batch)", color="tab:blue", alpha=0.8)
        if self.evals:
            ax.plot([s for s, _ in self.evals], [a for _, a in self.evals], "o-",
                    label="held-out eval accuracy", color="tab:red")
        ax.set_xlabel("trainer step")
        ax.set_ylabel("reward / accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
        ax.set_title(f"GRPO run {self.run_dir.name}")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def close(self) -> None:
        """Close the metrics file and the wandb run."""
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


class NullRunLog:
    """A :class:`RunLog` that records nothing: what the ranks other than rank 0 log to."""

    def __init__(self) -> None:
        """No files, no wandb."""
        self.history: list[dict[str, Any]] = []
        self.evals: list[tuple[int, float]] = []

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Ignore ``metrics``."""

    def log_eval(self, step: int, metrics: dict[str, float], metric: str) -> None:
        """Ignore the evaluation."""

    def plot(self, path: Path) -> None:
        """Draw nothing."""

    def close(self) -> None:
        """Nothing to close."""


def write_summary(path: Path | None, **fields: Any) -> dict[str, Any]:
    """Write ``summary.json`` (NaN becomes null; nothing written when ``path`` is None) and return it."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in fields.items()}
    if path is not None:
        path.write_text(json.dumps(clean, indent=2) + "\n")
    return clean


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
