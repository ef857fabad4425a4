"""Run bookkeeping: per-step metrics log, evaluations through a command, plot and summary.json."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import time
from collections.abc import Callable
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
    """Per-step metrics: console line, ``metrics.jsonl``, optional wandb and TensorBoard, plot.

    Attributes:
        run_dir: the run directory.
        history: one dict per logged step.
        evals: ``[(step, accuracy)]`` in order.
    """

    def __init__(self, run_dir: Path, use_wandb: bool = False, wandb_project: str | None = None,
                 wandb_group: str | None = None, config: dict[str, Any] | None = None,
                 plot_every: int = 0, tensorboard_dir: Path | None = None,
                 observers: list[Callable[[int, dict[str, Any]], None]] | None = None):
        """Open ``<run_dir>/metrics.jsonl`` (and a wandb run when ``use_wandb``).

        ``plot_every`` > 0 redraws ``<run_dir>/plot.png`` every that many trainer steps while
        training runs (0: only when :meth:`plot` is called). ``tensorboard_dir`` set: every
        numeric metric is also written there as a TensorBoard scalar (tag = metric key,
        global step = trainer step) through ``torch.utils.tensorboard.SummaryWriter``.
        ``observers`` are called with ``(step, metrics)`` for every record (e.g. the
        Prometheus metrics, :meth:`~example_trainer.metrics.TrainerMetrics.observe`).
        """
        self.observers = list(observers or [])
        self.run_dir = run_dir
        self.plot_every = plot_every
        self.history: list[dict[str, Any]] = []
        self.evals: list[tuple[int, float]] = []
        self._file = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._wandb = None
        if use_wandb:
            import wandb

            self._wandb = wandb.init(project=wandb_project, group=wandb_group, config=config,
                                     dir=str(run_dir), name=f"grpo-{run_dir.name}")
        self._tensorboard = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(tensorboard_dir))

    def log(self, step: int, metrics: dict[str, Any], progress: str | None = None) -> None:
        """Record ``metrics`` for ``step`` and print the main ones on one line.

        Args:
            step: the step the metrics belong to.
            metrics: name -> value.
            progress: the line's head (``step N/M (budget ..., ETA ...)``, see
                :func:`~example_trainer.progress.progress_text`); default ``step N``.
        """
        record = {"step": step, **metrics}
        self.history.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        for observer in self.observers:
            observer(step, metrics)
        if self._tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()
        keys = ("reward/mean", "loss", "kl", "grad_norm", "clip_fraction", "tokens_per_second",
                "step_seconds", "sync/update_seconds", "eval/accuracy")
        shown = " ".join(f"{k}={_fmt(metrics[k])}" for k in keys if k in metrics)
        print(f"[grpo] {progress or f'step {step}'}: {shown}", flush=True)
        self.maybe_plot(step)

    def maybe_plot(self, step: int) -> bool:
        """Redraw ``plot.png`` when ``step`` is a multiple of ``plot_every``; return whether it did.

        Called by :meth:`log` after every record, so a viewer watching the file sees the run
        progress; a failing redraw is reported on the console and never stops training.
        """
        if not self.plot_every or step % self.plot_every:
            return False
        try:
            self.plot(self.run_dir / "plot.png")
        except Exception as exc:  # noqa: BLE001 - a plot must never end a training run
            print(f"[grpo] could not redraw plot.png: {exc}", flush=True)
            return False
        return True

    def log_eval(self, step: int, metrics: dict[str, float], metric: str) -> None:
        """Record an evaluation (also as ``eval/accuracy`` in the step log)."""
        self.evals.append((step, metrics[metric]))
        self.log(step, {"eval/accuracy": metrics[metric],
                        **{f"eval_raw/{k}": v for k, v in metrics.items()}})

    def plot(self, path: Path) -> None:
        """Redraw the run's plot at ``path`` now (atomically; see :func:`write_plot`)."""
        write_plot(path, self.history, title=f"GRPO run {self.run_dir.name}")

    def close(self) -> None:
        """Close the metrics file, the TensorBoard writer and the wandb run."""
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


class NullRunLog:
    """A :class:`RunLog` that records nothing: what the ranks other than rank 0 log to."""

    def __init__(self) -> None:
        """No files, no wandb."""
        self.history: list[dict[str, Any]] = []
        self.evals: list[tuple[int, float]] = []

    def log(self, step: int, metrics: dict[str, Any], progress: str | None = None) -> None:
        """Ignore ``metrics``."""

    def log_eval(self, step: int, metrics: dict[str, float], metric: str) -> None:
        """Ignore the evaluation."""

    def plot(self, path: Path) -> None:
        """Draw nothing."""

    def close(self) -> None:
        """Nothing to close."""


# (title, [(metric key, legend label)]) per panel; a panel without data in the history is skipped.
PLOT_PANELS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("reward", (("reward/mean", "mean"), ("reward/max", "max"), ("reward/min", "min"))),
    ("held-out accuracy", (("eval/accuracy", "eval accuracy"),)),
    ("loss", (("loss", "loss"), ("pg_loss", "policy loss"))),
    ("KL to reference", (("kl", "kl"),)),
    ("clip fraction", (("clip_fraction", "clipped tokens"),)),
    ("completion length (tokens)", (("completion_len/mean", "mean"), ("max_len", "longest sequence, prompt included"))),
    ("step time (s)", (("step_seconds", "compute"), ("batch_wait_seconds", "batch wait"),
                       ("sync/update_seconds", "vLLM sync"))),
)


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the history; ``completion_len/mean`` is derived."""
    steps: list[int] = []
    values: list[float] = []
    for record in history:
        if key == "completion_len/mean" and record.get("sequences"):
            value = record.get("trained_tokens", math.nan) / record["sequences"]
        else:
            value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            steps.append(record["step"])
            values.append(float(value))
    return steps, values


def build_figure(history: list[dict[str, Any]], title: str = "GRPO run") -> Any:
    """Build the run's figure: one panel per metric group that has data.

    Panels (see ``PLOT_PANELS``): reward (mean/max/min per batch), held-out eval accuracy,
    loss, KL, clip fraction, completion length (trained tokens per sequence, longest sequence)
    and step time. Axes fit the data (rewards in [-1, 1] are not clipped). No pyplot state is
    touched, so this is safe in a training process and in threads.

    Args:
        history: the records of ``metrics.jsonl`` (each a dict with ``step``).
        title: the figure's title.

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas (``fig.axes`` are the drawn panels).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = []
    for name, keys in PLOT_PANELS:
        lines = [(label, *_series(history, key)) for key, label in keys]
        lines = [line for line in lines if line[1]]
        if lines:
            panels.append((name, lines))
    cols = 2 if len(panels) > 1 else 1
    rows = max(1, math.ceil(len(panels) / cols))
    fig = Figure(figsize=(6 * cols, 3 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    if not panels:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center")
        ax.set_axis_off()
        return fig
    for i, (name, lines) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for label, steps, values in lines:
            ax.plot(steps, values, "o-" if len(steps) < 30 else "-", label=label, markersize=3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("trainer step")
        ax.grid(alpha=0.3)
        ax.relim()
        ax.autoscale_view()
        if len(lines) > 1:
            ax.legend(loc="best", fontsize=8)
    return fig


def write_plot(path: Path, history: list[dict[str, Any]], title: str = "GRPO run") -> None:
    """Render :func:`build_figure` to a PNG at ``path`` atomically.

    The image is written to a temporary file beside ``path`` and renamed over it, so a viewer
    reloading the file never sees a half-written PNG.
    """
    fig = build_figure(history, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
