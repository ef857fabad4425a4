"""Replay bundles: every batch the trainer consumed, with what it got from it, in checksummed files.

One file per step, ``<run_dir>/bundles/step_<k:06d>.safetensors``, and its checksum beside it,
``step_<k:06d>.safetensors.sha256`` (``sha256sum`` format, so ``sha256sum -c`` checks it too).
The file is a safetensors file: its tensors are the bulky numeric parts, its header's
``__metadata__["bundle"]`` is a JSON object with the rest.

JSON (``__metadata__["bundle"]``):
    ``step``; ``batch`` (the groups exactly as ``GET /batch`` served them); ``dropped`` (indices
    of the groups the batch checks refused: the step trained the others); ``skipped`` (no
    update: nothing was left); ``progress`` (the LR schedule's progress the step used);
    ``policy_versions`` (each group's, null where it carried none); ``config`` (every trainer
    setting); ``torch_threads`` (``torch.get_num_threads()`` during the step); ``world_size``;
    ``device``; ``rng_python`` and ``rng_numpy`` (the Python and numpy RNG states before the
    step); ``metrics`` (the step's logged metrics: ``loss``, ``grad_norm``, ...);
    ``weights_fingerprint`` (``[sum, sum of squares]`` in float64 of the trainable parameters
    after the optimizer step; null under FSDP); ``versions`` (torch, transformers).

Tensors:
    ``advantages`` float64 ``[N]``: every trained sequence's per-target advantages, concatenated
    (sequence ``i`` is ``[offsets[i], offsets[i + 1])``); ``sampler_logprobs`` float64 ``[N]``,
    the same layout (``nan`` where unknown); ``offsets`` int64 ``[S + 1]``; ``rng_torch`` uint8
    (``torch.get_rng_state()`` before the step); ``rng_numpy_keys`` uint32 ``[624]``;
    ``rng_cuda_<i>`` uint8 per CUDA device.

Why a checksum file beside the bundle and not inside it: the digest then covers every byte
of the bundle (header and tensors) with nothing to leave out, standard tools check it, and
the bundle itself stays a plain safetensors file any safetensors reader opens. The bundle is
written to a hidden temporary file and renamed, then its checksum the same way: a bundle
without its ``.sha256`` is one whose writing was cut short, and verification says so.

Retention (``--replay-bundles K``): after writing step ``k`` the bundles of steps ``<= k - K``
are deleted; 0 keeps every bundle; null writes none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "atropos-replay-bundle"
VERSION = "1"
BUNDLE_DIR = "bundles"
_NAME = re.compile(r"^step_(\d+)\.safetensors$")


class BundleError(Exception):
    """A bundle cannot be trusted: ``stage`` names the check that failed.

    Attributes:
        step: the bundle's step.
        stage: ``bundle checksum`` (missing, unreadable or mismatched bytes) or ``advantages``.
    """

    def __init__(self, step: int, stage: str, detail: str):
        super().__init__(f"step {step}: {stage}: {detail}")
        self.step, self.stage, self.detail = step, stage, detail


@dataclass
class Bundle:
    """One step's bundle, read back (see the module docstring for the fields).

    Attributes:
        step: the step it recorded.
        header: the JSON object.
        tensors: name -> CPU tensor.
    """

    step: int
    header: dict[str, Any]
    tensors: dict[str, Any]

    @property
    def kept(self) -> list[dict[str, Any]]:
        """The groups the step trained on (the served batch less the dropped groups)."""
        dropped = set(self.header.get("dropped") or [])
        return [g for i, g in enumerate(self.header["batch"]) if i not in dropped]

    @property
    def skipped(self) -> bool:
        """True when the step made no update (every group refused, or a lost batch)."""
        return bool(self.header.get("skipped"))

    @property
    def loss(self) -> float | None:
        """The loss the trainer got (None for a skipped step)."""
        return (self.header.get("metrics") or {}).get("loss")

    @property
    def grad_norm(self) -> float | None:
        """The gradient norm (before clipping) the trainer got (None for a skipped step)."""
        return (self.header.get("metrics") or {}).get("grad_norm")


def bundle_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/bundles``."""
    return Path(run_dir) / BUNDLE_DIR


def bundle_path(run_dir: str | Path, step: int) -> Path:
    """The bundle file of ``step`` (``<run_dir>/bundles/step_<k:06d>.safetensors``)."""
    return bundle_dir(run_dir) / f"step_{step:06d}.safetensors"


def list_steps(run_dir: str | Path) -> list[int]:
    """Steps that have a bundle file in ``run_dir``, ascending (checksum files not looked at)."""
    root = bundle_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _NAME.match(p.name)))


def sequence_arrays(groups: Sequence[dict[str, Any]], scale_advantages: bool) -> dict[str, Any]:
    """The trained sequences' advantages and sampler log-probs as the trainer computes them.

    Uses :func:`example_trainer.data.batch_to_sequences` (the trainer's own path), so what is
    stored is what the loss got.

    Returns:
        ``{"advantages": float64 [N], "sampler_logprobs": float64 [N], "offsets": int64 [S+1]}``.
    """
    import torch

    from example_trainer.data import batch_to_sequences

    sequences, _ = batch_to_sequences(groups, scale_advantages) if groups else ([], None)
    offsets = [0]
    for seq in sequences:
        offsets.append(offsets[-1] + len(seq.advantages))
    return {"advantages": torch.tensor([a for s in sequences for a in s.advantages], dtype=torch.float64),
            "sampler_logprobs": torch.tensor([v for s in sequences for v in s.sampler_logprobs],
                                             dtype=torch.float64),
            "offsets": torch.tensor(offsets, dtype=torch.int64)}


def weights_fingerprint(params: Sequence[Any]) -> list[float]:
    """``[sum, sum of squares]`` of the parameters, accumulated in float64.

    A one-ulp change of one float32 weight changes the float64 sum, so equal fingerprints on
    the same machine mean equal weights in practice; it costs two reductions per parameter.
    """
    import torch

    total = torch.zeros((), dtype=torch.float64)
    squares = torch.zeros((), dtype=torch.float64)
    for p in params:
        d = p.detach()
        total += d.sum(dtype=torch.float64).cpu()
        squares += torch.linalg.vector_norm(d, dtype=torch.float64).cpu() ** 2
    return [float(total), float(squares)]


def write_bundle(run_dir: str | Path, step: int, header: dict[str, Any], tensors: dict[str, Any]) -> Path:
    """Write ``step``'s bundle and its checksum atomically (temporary file, then rename).

    Args:
        run_dir: the run directory.
        step: the step number.
        header: the JSON object (see the module docstring); ``step``, ``format`` and
            ``version`` are set here.
        tensors: name -> tensor (made contiguous and moved to the CPU).

    Returns:
        The bundle's path.
    """
    from safetensors.torch import save

    path = bundle_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {**header, "step": step}
    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                metadata={"format": FORMAT, "version": VERSION,
                          "bundle": json.dumps(header, allow_nan=True)})
    _atomic_write(path, data)
    digest = hashlib.sha256(data).hexdigest()
    _atomic_write(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n".encode())
    return path


def read_bundle(run_dir: str | Path, step: int) -> Bundle:
    """Read ``step``'s bundle after checking its bytes against its ``.sha256``.

    Raises:
        BundleError: stage ``bundle checksum``: no bundle, no checksum file, bytes that do not
            match it, or a file that is not a bundle of this format.
    """
    from safetensors.torch import load

    path = bundle_path(run_dir, step)
    if not path.is_file():
        raise BundleError(step, "bundle checksum", f"no bundle {path} (deleted by --replay-bundles "
                          "retention, or the run did not record one)")
    sums = path.with_name(path.name + ".sha256")
    if not sums.is_file():
        raise BundleError(step, "bundle checksum", f"{sums} is missing: the bundle's writing was cut "
                          "short, or the file was removed")
    data = path.read_bytes()
    expected = sums.read_text().split()[0] if sums.read_text().split() else ""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise BundleError(step, "bundle checksum", f"{path.name} has sha256 {actual[:16]}... but "
                          f"{sums.name} says {expected[:16]}...: the bundle changed after it was written")
    try:
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + size])["__metadata__"]
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
        header = json.loads(meta["bundle"])
        tensors = load(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(step, "bundle checksum", f"{path.name} is not a replay bundle ({exc})") from exc
    return Bundle(step, header, tensors)


def check_advantages(bundle: Bundle) -> None:
    """Recompute the step's advantages (and sampler log-probs) from its batch and settings.

    The trainer's scale setting comes from the bundle's ``config``; the comparison is exact
    (``nan`` equals ``nan`` for log-probs the sampler did not send).

    Raises:
        BundleError: stage ``advantages``, naming the first sequence and position that differ.
    """
    import torch

    if bundle.skipped:  # no update, nothing computed from the batch
        return
    config = replay_config(bundle.header)
    again = sequence_arrays(bundle.kept, config.scale_advantages)
    for name in ("offsets", "advantages", "sampler_logprobs"):
        stored = bundle.tensors.get(name)
        ours = again[name]
        if stored is None or stored.shape != ours.shape:
            raise BundleError(bundle.step, "advantages", f"{name}: the bundle holds shape "
                              f"{None if stored is None else tuple(stored.shape)}, the batch gives "
                              f"{tuple(ours.shape)}")
        same = (stored == ours) | (torch.isnan(stored) & torch.isnan(ours)) if stored.is_floating_point() \
            else stored == ours
        if not bool(same.all()):
            k = int((~same).nonzero()[0])
            seq = int(torch.searchsorted(again["offsets"], torch.tensor(k), right=True)) - 1
            raise BundleError(bundle.step, "advantages", f"{name}[{k}] (sequence {seq}) is "
                              f"{float(stored[k])!r} in the bundle but {float(ours[k])!r} recomputed "
                              f"from its batch")


def replay_config(header: dict[str, Any], **overrides: Any) -> Any:
    """The :class:`~example_trainer.config.TrainerConfig` a bundle was recorded with.

    ``resume`` and ``run_dir`` are cleared (replay never writes into the run) and
    ``torch_threads`` is the thread count the step ran with, so the replay computes alike.

    Raises:
        BundleError: stage ``bundle checksum`` when the settings no longer validate (a
            bundle from another trainer version).
    """
    from pydantic import ValidationError

    from example_trainer.config import TrainerConfig

    settings = {**header["config"], "resume": None, "run_dir": None,
                "torch_threads": header.get("torch_threads") or header["config"].get("torch_threads"),
                **overrides}
    try:
        return TrainerConfig.model_validate(settings)
    except ValidationError as exc:
        raise BundleError(int(header.get("step", 0)), "bundle checksum",
                          f"its trainer settings no longer validate: {exc}") from exc


def prune_bundles(run_dir: str | Path, newest: int, keep: int) -> list[int]:
    """Delete the bundles of steps ``<= newest - keep`` (``keep`` 0: delete nothing).

    Returns:
        The steps whose bundles were deleted.
    """
    if keep <= 0:
        return []
    doomed = [s for s in list_steps(run_dir) if s <= newest - keep]
    for step in doomed:
        path = bundle_path(run_dir, step)
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".sha256").unlink(missing_ok=True)
    return doomed


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class BundleRecorder:
    """The trainer's side: one bundle per step (rank 0), with retention.

    The loop calls :meth:`rng` just before a step and :meth:`write` once it knows the loss and
    gradient norm (or, for a step without an update, :meth:`write` alone). A recorder of a run
    with ``--replay-bundles null``, and on ranks other than 0, does nothing.
    """

    def __init__(self, config: Any, run_dir: Path, policy: Any, dist: Any):
        """Args: the run's TrainerConfig, run directory, Policy and Distributed."""
        self.config, self.run_dir, self.policy, self.dist = config, Path(run_dir), policy, dist
        self.enabled = bool(dist.is_main and config.replay_bundles is not None)

    def rng(self) -> dict[str, Any] | None:
        """The RNG states before a step (:func:`example_trainer.checkpoint.capture_rng`); None when off."""
        from example_trainer.checkpoint import capture_rng

        return capture_rng() if self.enabled else None

    def write(self, step: int, served: list[dict[str, Any]], kept: list[dict[str, Any]], progress: float,
              rng: dict[str, Any] | None, metrics: dict[str, Any] | None) -> Path | None:
        """Write ``step``'s bundle and prune old ones; the bundle's path (None when off).

        Args:
            step: the step.
            served: the batch as ``GET /batch`` served it.
            kept: the groups the step trained on (``[]``: no update).
            progress: the LR schedule's progress passed to the step.
            rng: from :meth:`rng` before the step (None for a step without an update).
            metrics: the step's metrics (None for a step without an update).
        """
        if not self.enabled:
            return None
        import numpy as np
        import torch
        import transformers

        kept_ids = {id(g) for g in kept}
        header: dict[str, Any] = {
            "batch": served, "dropped": [i for i, g in enumerate(served) if id(g) not in kept_ids],
            "skipped": not kept, "progress": progress,
            "policy_versions": [g.get("policy_version") for g in served],
            "config": self.config.model_dump(mode="json"), "torch_threads": torch.get_num_threads(),
            "world_size": self.dist.world_size, "device": str(self.policy.load_device),
            "metrics": metrics,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
        tensors: dict[str, Any] = {}
        if kept:
            tensors.update(sequence_arrays(kept, self.config.scale_advantages))
            header["weights_fingerprint"] = None if self.dist.enabled else weights_fingerprint(
                self.policy.trainable)
        if rng is not None:
            kind, keys, pos, has_gauss, gauss = rng["numpy"]
            header["rng_python"] = _jsonable(rng["python"])
            header["rng_numpy"] = [kind, int(pos), int(has_gauss), float(gauss)]
            tensors["rng_torch"] = rng["torch"]
            tensors["rng_numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.uint32).copy())
            for i, state in enumerate(rng.get("cuda") or []):
                tensors[f"rng_cuda_{i}"] = state
        path = write_bundle(self.run_dir, step, header, tensors)
        prune_bundles(self.run_dir, step, self.config.replay_bundles)
        return path


def restore_bundle_rng(bundle: Bundle) -> None:
    """Put back the RNG states a bundle recorded before its step (a no-op for a skipped step)."""
    import numpy as np

    from example_trainer.checkpoint import restore_rng

    header, tensors = bundle.header, bundle.tensors
    if "rng_torch" not in tensors:
        return
    kind, pos, has_gauss, gauss = header["rng_numpy"]
    version, state, gauss_next = header["rng_python"]
    cuda = [tensors[k] for k in sorted(t for t in tensors if t.startswith("rng_cuda_"))]
    restore_rng({"torch": tensors["rng_torch"], "cuda": cuda or None,
                 "python": (version, tuple(state), gauss_next),
                 "numpy": (kind, tensors["rng_numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, gauss)})


def _jsonable(value: Any) -> Any:
    """Tuples to lists, recursively (Python's ``random.getstate()`` is nested tuples of ints)."""
    return [_jsonable(v) for v in value] if isinstance(value, (tuple, list)) else value
