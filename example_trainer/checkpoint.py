"""Checkpoints the GRPO trainer can resume from: the weights plus the training state beside them.

A checkpoint is a directory ``<run_dir>/checkpoints/<name>/`` (``step_<k>`` or ``final``)::

    model.safetensors, config.json, tokenizer files   the policy as a HF model directory
    adapter/                                          with LoRA: the adapter (peft save_pretrained)
    training_state.pt                                 step, optimizer state, RNG states
    checkpoint.json                                   {"step": k, "lora": bool} (small, read first)

Every checkpoint is written into a hidden temporary directory and renamed into place, so a
process killed mid-save (SIGKILL, OOM) leaves only a hidden leftover that :func:`find_latest`
ignores; every visible checkpoint directory is complete.

Model and optimizer state go through ``torch.distributed.checkpoint.state_dict``
(``get/set_model_state_dict``, ``get/set_optimizer_state_dict`` with ``full_state_dict``): the
optimizer state is keyed by parameter name, and the same calls gather/scatter sharded (FSDP2)
tensors when the model is sharded; they also work in a single process.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atroposlib.errors import ConfigError

STATE_FILE = "training_state.pt"
META_FILE = "checkpoint.json"


class ResumeError(ConfigError):
    """``--resume`` points at something the trainer cannot resume from (message says the fix)."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk.

    Attributes:
        path: the checkpoint directory.
        step: optimizer steps done when it was saved.
        lora: whether it holds a LoRA adapter (``path / "adapter"``) rather than full weights.
    """

    path: Path
    step: int
    lora: bool

    @property
    def adapter_dir(self) -> Path:
        """Directory of the saved LoRA adapter."""
        return self.path / "adapter"


def list_checkpoints(run_dir: str | Path) -> list[Checkpoint]:
    """The complete checkpoints of ``run_dir``, in the order of their directory names.

    Hidden directories (unfinished saves) and directories without ``checkpoint.json`` and
    ``training_state.pt`` (e.g. checkpoints of older trainer versions) are left out.

    Args:
        run_dir: a run directory (holding ``checkpoints/``).
    """
    root = Path(run_dir) / "checkpoints"
    found: list[Checkpoint] = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.name.startswith(".") or not (path / STATE_FILE).is_file():
            continue
        try:
            meta = json.loads((path / META_FILE).read_text())
        except (OSError, ValueError):
            continue
        found.append(Checkpoint(path, int(meta["step"]), bool(meta.get("lora", False))))
    return found


def find_latest(run_dir: Path) -> Checkpoint | None:
    """The complete checkpoint of ``run_dir`` with the most steps (``final`` wins a tie).

    Args:
        run_dir: a run directory (holding ``checkpoints/``).

    Returns:
        The checkpoint (see :func:`list_checkpoints` for which count), or None when there is none.
    """
    found = list_checkpoints(run_dir)
    return max(found, key=lambda c: (c.step, c.path.name == "final")) if found else None


def require_checkpoint(run_dir: str | Path, lora: bool) -> Checkpoint:
    """Check ``--resume RUN_DIR`` before anything heavy is loaded; return what to resume from.

    Args:
        run_dir: the run directory given to ``--resume``.
        lora: whether this run trains a LoRA adapter (``--lora-r`` > 0).

    Returns:
        The latest complete checkpoint.

    Raises:
        ResumeError: no such directory, no complete checkpoint in it, or the checkpoint was
            made with/without LoRA while this run is the other way round.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResumeError(f"--resume {run_dir}: no such directory; pass the run directory of an "
                          "earlier run (the one holding checkpoints/ and metrics.jsonl)")
    ckpt = find_latest(run_dir)
    if ckpt is None:
        raise ResumeError(
            f"--resume {run_dir}: no complete checkpoint under {run_dir / 'checkpoints'} (each "
            f"needs {META_FILE} and {STATE_FILE}). The run saved none before it stopped: set "
            "--checkpoint-interval N so runs save every N steps, or start afresh without --resume")
    if ckpt.lora != lora:
        made, now = ("with", "without") if ckpt.lora else ("without", "with")
        raise ResumeError(
            f"--resume {run_dir}: {ckpt.path} was saved {made} LoRA but this run is {now} LoRA; "
            f"resume with the same --lora-r as the original run")
    return ckpt


def save_checkpoint(out_dir: Path, *, step: int, model: Any, optimizer: Any,
                    write_weights: Callable[[Path], None], lora: bool, is_main: bool = True) -> Path:
    """Atomically write a checkpoint: weights (by ``write_weights``) plus the training state.

    Args:
        out_dir: final checkpoint directory (e.g. ``run/checkpoints/step_4``); replaced if present.
        step: optimizer steps done.
        model: the policy (plain, peft-wrapped or FSDP2-sharded).
        optimizer: its optimizer.
        write_weights: writes the weights (HF model dir and/or ``adapter/``) into a directory.
        lora: whether the weights are a LoRA adapter.
        is_main: False on the FSDP ranks other than 0: they take part in gathering the
            optimizer state (every rank must call this together) and write nothing.

    Returns:
        ``out_dir``.
    """
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)  # collective
    out_dir = Path(out_dir)
    if not is_main:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_weights(tmp)
    torch.save({"step": step, "optimizer": optimizer_state, "rng": capture_rng()}, tmp / STATE_FILE)
    (tmp / META_FILE).write_text(json.dumps({"step": step, "lora": lora}) + "\n")
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete ``step_<k>`` checkpoints of ``run_dir``.

    ``final``, hidden (unfinished) directories and anything else are never touched.

    Args:
        run_dir: a run directory (holding ``checkpoints/``).
        keep: how many step checkpoints to keep (0: keep all, delete nothing).

    Returns:
        The deleted directories.
    """
    root = Path(run_dir) / "checkpoints"
    if keep <= 0 or not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        name = path.name
        if name.startswith("step_") and name[5:].isdigit() and (path / META_FILE).is_file():
            steps.append((int(name[5:]), path))
    doomed = [path for _, path in sorted(steps)[:-keep]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def load_full_weights(model: Any, ckpt: Checkpoint) -> None:
    """Load a checkpoint's full weights (``model.safetensors``) into ``model``.

    Raises:
        ResumeError: the checkpoint's weights do not fit the model (other architecture), apart
            from tied weights that ``save_pretrained`` leaves out.
    """
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    files = sorted(ckpt.path.glob("*.safetensors"))
    if not files:
        raise ResumeError(f"{ckpt.path} has no *.safetensors weights; the checkpoint is damaged")
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    result = set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    tied = _tied_names(model)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ResumeError(f"{ckpt.path} does not fit --model: missing {missing[:5]}, unexpected "
                          f"{list(result.unexpected_keys)[:5]}; resume with the run's own --model")


def load_training_state(model: Any, optimizer: Any, ckpt: Checkpoint) -> int:
    """Restore the optimizer state and the RNG states; return the step to continue after.

    Call after the weights are restored and the optimizer built (with no gradients set).
    """
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = torch.load(ckpt.path / STATE_FILE, map_location="cpu", weights_only=False)
    set_optimizer_state_dict(model, optimizer, state["optimizer"],
                             options=StateDictOptions(full_state_dict=True))
    restore_rng(state["rng"])
    return int(state["step"])


def capture_rng() -> dict[str, Any]:
    """RNG states of torch (CPU and every CUDA device), Python ``random`` and numpy."""
    import numpy as np
    import torch

    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the RNG states captured by :func:`capture_rng`."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def read_history(run_dir: Path, up_to_step: int) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` records a resumed run continues from: steps ``<= up_to_step``.

    The file is only ever appended to. Each resume writes a marker line
    ``{"event": "resume", "step": k}`` (:func:`append_resume_marker`); records of steps after
    ``k`` logged before that marker (by the interrupted process, after its last checkpoint) are
    superseded by the lines the resumed run writes for the same steps, and dropped here.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a kill
            continue
        if not isinstance(record, dict):
            continue
        if record.get("event") == "resume":
            records = [r for r in records if r.get("step", 0) <= record["step"]]
        else:
            records.append(record)
    return [r for r in records if r.get("step", 0) <= up_to_step]


def append_resume_marker(run_dir: Path, step: int) -> None:
    """Append ``{"event": "resume", "step": step}`` to ``metrics.jsonl`` (see :func:`read_history`)."""
    with open(Path(run_dir) / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "resume", "step": step}) + "\n")


def _tied_names(model: Any) -> set[str]:
    """Parameter names that share storage with an earlier parameter (e.g. a tied LM head)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if param.data_ptr() in seen:
            tied.add(name)
        seen.setdefault(param.data_ptr(), name)
    return tied
