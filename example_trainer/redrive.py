"""Re-drive recorded steps from replay bundles: no run-api, no inference server, no env.

A re-drive starts from a *base*: the checkpoint with the most steps at or before the step
before the first re-driven one (``checkpoints/step_<k>`` or ``final``), or the run's starting
model (``--model`` of the recorded settings) as the base of step 0. It loads the policy and
its optimizer as ``--resume`` does (:func:`example_trainer.policy.load_training_policy`), then
for each step puts back the RNG states the bundle recorded and runs the trainer's own step
(:class:`example_trainer.step.StepRunner`) on the bundle's batch with its LR progress.

:func:`verify` checks each step stage by stage, in this order, and stops at the first stage
that diverges: ``bundle checksum`` (the bytes against the ``.sha256``), ``advantages`` (and
sampler log-probs, recomputed from the batch), ``loss``, ``gradients`` (the gradient norm
before clipping) and ``weights`` (a fingerprint of the trainable parameters after the step,
and, where the run kept a checkpoint of that step, every trainable tensor against the
checkpoint's, element for element).
:func:`train` re-drives every recorded step and compares the loss trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from example_trainer.bundles import (
    Bundle,
    BundleError,
    check_advantages,
    list_steps,
    read_bundle,
    replay_config,
    restore_bundle_rng,
    weights_fingerprint,
)
from example_trainer.progress import step_ranges

#: The stages :func:`verify` checks, in order.
STAGES = ("bundle checksum", "advantages", "loss", "gradients", "weights")


class ReplayError(Exception):
    """Nothing to re-drive from (no bundles, no base that covers a step): the message says why."""


@dataclass
class StepCheck:
    """What a re-driven step gave, beside what the recording says.

    Attributes:
        step: the step.
        loss, grad_norm: what the re-drive got (None for a step without an update).
        recorded_loss, recorded_grad_norm: what the bundle recorded.
        stage: the first stage that diverged (None: none did).
        detail: what differed.
    """

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    recorded_loss: float | None = None
    recorded_grad_norm: float | None = None
    stage: str | None = None
    detail: str = ""


def bases(run_dir: str | Path) -> dict[int, Any]:
    """Step -> where a re-drive after that step starts: 0 -> None (the starting model), k -> checkpoint.

    Complete checkpoints only (:func:`example_trainer.checkpoint.list_checkpoints`).
    """
    from example_trainer.checkpoint import list_checkpoints

    found: dict[int, Any] = {0: None}
    for ckpt in list_checkpoints(run_dir):
        found.setdefault(ckpt.step, ckpt)
    return found


def base_for(run_dir: str | Path, first: int, available: Iterable[int]) -> int:
    """The base step a re-drive through ``first`` starts after: the largest base ``< first``.

    Args:
        run_dir: the run directory.
        first: the first step that must be re-driven.
        available: the steps with bundles.

    Raises:
        ReplayError: no base ``s < first`` whose following bundles ``s+1..first`` all exist.
    """
    have = set(available)
    for s in sorted((s for s in bases(run_dir) if s < first), reverse=True):
        if all(k in have for k in range(s + 1, first + 1)):
            return s
    raise ReplayError(
        f"step {first} cannot be re-driven: no checkpoint at or before step {first - 1} is followed "
        f"by bundles up to step {first} (bundles kept: {step_ranges(have)}; checkpoints: "
        f"{sorted(s for s in bases(run_dir) if s)}). Record with more --replay-bundles (0 keeps all) "
        "or more --checkpoint-keep")


class Redriver:
    """The policy and step runner of a re-drive, loaded from a base (see the module docstring)."""

    def __init__(self, run_dir: str | Path, base: int, first: Bundle, torch_threads: int | None = None):
        """Load the policy as of ``base`` with the settings ``first`` recorded, on the CPU.

        Args:
            run_dir: the run directory.
            base: the base step (0: the recorded ``--model``, else a checkpoint's step).
            first: the first bundle to re-drive (its settings build the policy).
            torch_threads: threads for torch (default: what the recorded step ran with).
        """
        import torch

        from example_trainer.distributed import Distributed
        from example_trainer.policy import load_training_policy
        from example_trainer.step import StepRunner

        self.overrides = {"device": "cpu", **({"torch_threads": torch_threads} if torch_threads else {})}
        config = replay_config(first.header, **self.overrides)
        device = torch.device("cpu")
        dist = Distributed(device=device)
        self.policy = load_training_policy(config, dist, bases(run_dir)[base], device)
        self.stepper = StepRunner(config, dist, self.policy, device)
        self.base = base
        self.checkpoints = {step: ckpt for step, ckpt in bases(run_dir).items() if ckpt is not None}

    def run(self, bundle: Bundle) -> dict[str, Any] | None:
        """Re-drive one step; its metrics (None for a step without an update)."""
        import torch

        if bundle.skipped:
            return None
        config = replay_config(bundle.header, **self.overrides)  # a resume may have changed some
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.stepper.config = config
        restore_bundle_rng(bundle)
        return self.stepper.run(bundle.step, bundle.kept, float(bundle.header["progress"]))

    def check(self, bundle: Bundle, metrics: dict[str, Any] | None, rtol: float = 0.0) -> StepCheck:
        """Compare a re-driven step with its bundle: loss, then gradients, then weights."""
        out = StepCheck(bundle.step, recorded_loss=bundle.loss, recorded_grad_norm=bundle.grad_norm)
        if metrics is None:
            return out
        out.loss, out.grad_norm = metrics["loss"], metrics["grad_norm"]
        if not same(out.loss, bundle.loss, rtol):
            out.stage, out.detail = "loss", f"re-driven {out.loss!r}, recorded {bundle.loss!r}"
        elif not same(out.grad_norm, bundle.grad_norm, rtol):
            out.stage, out.detail = "gradients", (f"grad norm re-driven {out.grad_norm!r}, recorded "
                                                  f"{bundle.grad_norm!r}")
        elif bundle.header.get("weights_fingerprint") is not None:
            ours, theirs = weights_fingerprint(self.policy.trainable), bundle.header["weights_fingerprint"]
            if not all(same(a, b, rtol) for a, b in zip(ours, theirs, strict=True)):
                out.stage, out.detail = "weights", (f"trainable-parameter fingerprint [sum, sum of "
                                                    f"squares] re-driven {ours}, recorded {theirs}")
        if out.stage is None and bundle.step in self.checkpoints and bundle.step != self.base:
            differs = checkpoint_difference(self.policy.model, self.checkpoints[bundle.step], rtol)
            if differs:
                out.stage, out.detail = "weights", differs
        return out


def _checkpoint_tensors(ckpt: Any) -> dict[str, Any]:
    """The tensors a checkpoint's weights files hold, by name (the adapter's for a LoRA one)."""
    from safetensors.torch import load_file

    folder = ckpt.adapter_dir if ckpt.lora else ckpt.path
    state: dict[str, Any] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def checkpoint_difference(model: Any, ckpt: Any, rtol: float = 0.0) -> str | None:
    """Compare the trainable parameters of ``model`` with the checkpoint of the same step.

    Each trainable parameter is looked up in the checkpoint by its name (a LoRA adapter's
    names without peft's adapter name, ``.default``) and compared element for element
    (``torch.equal``; with ``rtol > 0``, ``torch.allclose(rtol=rtol, atol=0)``), in the
    checkpoint's dtype.

    Returns:
        None when every trainable tensor the checkpoint holds is equal; else what differs
        (the first tensor, its largest absolute difference, the checkpoint's path). A
        checkpoint that holds none of the trainable parameters is reported too.
    """
    import torch

    state = _checkpoint_tensors(ckpt)
    compared = 0
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        saved = state.get(name.replace(".default.", ".")) if ckpt.lora else state.get(name)
        if saved is None and name.startswith("base_model.model."):
            saved = state.get(name[len("base_model.model."):])
        if saved is None:
            continue
        compared += 1
        ours = param.detach().to("cpu", saved.dtype)
        equal = torch.equal(ours, saved) if rtol <= 0 else torch.allclose(ours, saved, rtol=rtol, atol=0.0)
        if not equal:
            gap = (ours.double() - saved.double()).abs().max().item()
            return (f"{name} differs from the checkpoint {ckpt.path} (largest absolute "
                    f"difference {gap:.3g})")
    if not compared:
        return f"the checkpoint {ckpt.path} holds none of the trainable parameters by name"
    return None


def same(a: float | None, b: float | None, rtol: float = 0.0) -> bool:
    """``a == b`` (``nan`` equals ``nan``), or within ``rtol`` of the larger magnitude when ``rtol > 0``."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b if rtol <= 0 else abs(a - b) <= rtol * max(abs(a), abs(b))


def verify(run_dir: str | Path, steps: list[int] | None = None, rtol: float = 0.0,
           torch_threads: int | None = None, say: Callable[[str], None] = print) -> StepCheck | None:
    """Verify recorded steps: every stage of :data:`STAGES`, step after step.

    Args:
        run_dir: the run directory.
        steps: the steps to verify (None: every step with a bundle). Each is re-driven from the
            nearest base before it; the steps between the base and it are verified as well.
        rtol: relative tolerance of loss, gradient norm and weights (0: exact).
        torch_threads: override the recorded thread count.
        say: where progress lines go.

    Returns:
        The first :class:`StepCheck` that diverged, or None when every stage of every step held.

    Raises:
        ReplayError: no bundles, or a step no base covers.
    """
    available = list_steps(run_dir)
    if not available:
        raise ReplayError(f"{Path(run_dir) / 'bundles'} holds no bundles: record the run with "
                          "--replay-bundles (the default keeps the newest 100)")
    targets = sorted(set(steps)) if steps else available
    missing = [s for s in targets if s not in available]
    if missing:
        raise ReplayError(f"no bundle for step(s) {step_ranges(missing)}; the run has bundles for {step_ranges(available)}")
    if steps is None:  # every step: re-drive from the earliest base that reaches a kept bundle
        start = _earliest_start(run_dir, available)
        chain = list(range(start + 1, available[-1] + 1))  # a missing bundle fails its checksum stage
        unreached = [s for s in available if s <= start]
    else:
        start = base_for(run_dir, targets[0], available)
        chain, unreached = list(range(start + 1, targets[-1] + 1)), []
    # cheap stages first, over every bundle involved: checksum and advantages
    for step in unreached + chain:
        try:
            check_advantages(read_bundle(run_dir, step))
        except BundleError as exc:
            say(f"verify: step {exc.step}: {exc.stage} diverges: {exc.detail}")
            return StepCheck(exc.step, stage=exc.stage, detail=exc.detail)
    if unreached:
        say(f"verify: steps {step_ranges(unreached)}: bundle checksum and advantages hold; not re-driven "
            f"(no checkpoint before them is kept)")
    redriver: Redriver | None = None
    for step in chain:
        bundle = read_bundle(run_dir, step)
        if redriver is None:
            say(f"verify: re-driving steps {chain[0]}..{chain[-1]} from "
                f"{'the starting model' if start == 0 else f'checkpoint step {start}'}")
            redriver = Redriver(run_dir, start, bundle, torch_threads)
        result = redriver.check(bundle, redriver.run(bundle), rtol)
        if result.stage is not None:
            say(f"verify: step {step}: {result.stage} diverges: {result.detail}")
            return result
        say(f"verify: step {step}: ok" + ("" if result.loss is None else
                                         f" (loss {result.loss!r}, grad_norm {result.grad_norm!r})"))
    say(f"verify: {len(chain)} step(s) re-driven, every stage holds")
    return None


def train(run_dir: str | Path, torch_threads: int | None = None, out: str | Path | None = None,
          say: Callable[[str], None] = print) -> list[StepCheck]:
    """Re-drive every recorded step from the earliest base and compare the loss trace.

    Args:
        run_dir: the run directory.
        torch_threads: override the recorded thread count.
        out: write the re-driven trace here as JSON lines (``step``, ``loss``, ``grad_norm``,
            ``recorded_loss``, ``recorded_grad_norm``).
        say: where progress lines go.

    Returns:
        One :class:`StepCheck` per re-driven step (``stage`` ``loss`` where the loss differs
        from the recorded one, exact comparison).

    Raises:
        ReplayError: no bundles.
        BundleError: a bundle fails its checksum.
    """
    available = list_steps(run_dir)
    if not available:
        raise ReplayError(f"{Path(run_dir) / 'bundles'} holds no bundles: record the run with "
                          "--replay-bundles (the default keeps the newest 100)")
    start = _earliest_start(run_dir, available)
    chain = list(range(start + 1, available[-1] + 1))
    say(f"replay train: steps {chain[0]}..{chain[-1]} from "
        f"{'the starting model' if start == 0 else f'checkpoint step {start}'}")
    trace: list[StepCheck] = []
    redriver: Redriver | None = None
    for step in chain:
        bundle = read_bundle(run_dir, step)
        redriver = redriver or Redriver(run_dir, start, bundle, torch_threads)
        metrics = redriver.run(bundle)
        result = StepCheck(step, recorded_loss=bundle.loss, recorded_grad_norm=bundle.grad_norm)
        if metrics is not None:
            result.loss, result.grad_norm = metrics["loss"], metrics["grad_norm"]
            if not same(result.loss, bundle.loss):
                result.stage, result.detail = "loss", f"re-driven {result.loss!r}, recorded {bundle.loss!r}"
        trace.append(result)
        say(f"replay train: step {step}: " + ("no update" if metrics is None else
            f"loss {result.loss!r} ({'same as recorded' if result.stage is None else 'recorded ' + repr(bundle.loss)})"))
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("".join(json.dumps({
            "step": r.step, "loss": r.loss, "grad_norm": r.grad_norm, "recorded_loss": r.recorded_loss,
            "recorded_grad_norm": r.recorded_grad_norm}) + "\n" for r in trace))
    return trace


def _earliest_start(run_dir: str | Path, available: list[int]) -> int:
    """The base of the longest re-drive: the earliest kept bundle whose step a base precedes."""
    have = set(available)
    errors = []
    for first in available:
        try:
            return base_for(run_dir, first, have)
        except ReplayError as exc:
            errors.append(exc)
    raise errors[-1] if errors else ReplayError("no bundles")
