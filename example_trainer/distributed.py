"""Train one policy across processes (``torchrun``) with FSDP2; a no-op in a single process.

Launch::

    torchrun --nproc-per-node 8 -m example_trainer.grpo --batch-size 64 --micro-batch-size 4 ...

``torchrun`` (``torch.distributed.run``) sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; multi-node runs use its c10d rendezvous
(``--nnodes 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT``). How the ranks split the work:

* Rank 0 alone talks to run-api and vLLM: it registers, pulls each ``GET /batch`` and broadcasts
  it to the other ranks; it starts, reloads and evaluates vLLM; it writes ``metrics.jsonl``,
  ``plot.png``, ``summary.json`` and the checkpoints.
* Every rank turns the whole batch into the same length-sorted micro-batches as a single
  process would, and trains on micro-batches ``rank, rank + N, rank + 2N, ...``. The loss of a
  micro-batch is divided by the sequence count of the whole step and the ranks' gradients are
  summed (:attr:`Distributed.grad_scale`), so N processes compute the update one process
  computes.
* Parameters, gradients and the AdamW state are sharded with ``fully_shard`` (FSDP2), one unit
  per decoder layer plus the root (embeddings, final norm, LM head).
* Messages from rank 0 (batches, stop decisions) and the waits for its vLLM/eval work travel on a
  separate gloo group whose timeout covers those waits; training collectives time out after
  ``--collective-timeout`` seconds. Either way a rank that dies makes the others fail with an
  error naming it instead of hanging.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from atroposlib.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from example_trainer.config import TrainerConfig

T = TypeVar("T")

_STATE_KEY = "atropos_grpo/rank{}/state"


class DistributedError(RuntimeError):
    """A collective failed: another rank exited, crashed or stopped answering."""


def world_from_env(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """``(world_size, rank, local_rank)`` from the variables ``torchrun`` sets; ``(1, 0, 0)`` without them.

    Raises:
        ConfigError: a variable is set but not an integer.
    """
    env = os.environ if environ is None else environ
    try:
        return (int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0")),
                int(env.get("LOCAL_RANK", "0")))
    except ValueError as exc:
        raise ConfigError(f"WORLD_SIZE/RANK/LOCAL_RANK must be integers (torchrun sets them): {exc}") from exc


def check_batch_layout(batch_size: int, micro_batch_size: int, world_size: int) -> None:
    """Fail unless every rank gets the same whole number of full micro-batches per step.

    Args:
        batch_size: sequences per step.
        micro_batch_size: sequences per forward/backward.
        world_size: training processes.

    Raises:
        ConfigError: ``batch_size`` is not a multiple of ``world_size * micro_batch_size``; the
            message names the numbers to change and nearby values that work.
    """
    unit = world_size * micro_batch_size
    if world_size > 1 and batch_size % unit:
        lower, upper = (batch_size // unit) * unit, (batch_size // unit + 1) * unit
        options = " or ".join(str(v) for v in (lower, upper) if v > 0)
        raise ConfigError(
            f"--batch-size {batch_size} does not split evenly over {world_size} ranks x "
            f"--micro-batch-size {micro_batch_size} (= {unit} sequences per round): set "
            f"--batch-size to a multiple of {unit} (e.g. {options}), or change "
            "--micro-batch-size or the number of processes (--nproc-per-node)")


@dataclass
class Distributed:
    """Where this process stands in the run; every method is a no-op when ``enabled`` is False.

    Attributes:
        enabled: a process group is up and the model is sharded with FSDP2.
        world_size: training processes (1 when not enabled).
        rank: this process's global rank.
        local_rank: its rank on this node (picks the GPU).
        device: the training device of this rank (``cuda:LOCAL_RANK`` on GPUs).
        mesh: 1-D ``DeviceMesh`` over all ranks (None when not enabled).
        control: gloo group for rank 0's messages and waits (None when not enabled).
        collective_timeout: seconds a training collective may wait for a peer.
        control_timeout: seconds a rank may wait for rank 0's run-api/vLLM/eval work.
    """

    enabled: bool = False
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: Any = None
    mesh: Any = None
    control: Any = None
    collective_timeout: float = 300.0
    control_timeout: float = 300.0
    _store: Any = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        """True on the rank that talks to run-api and vLLM and writes the run files."""
        return self.rank == 0

    # ---------------------------------------------------------------- model
    def shard(self, model: Any) -> Any:
        """``fully_shard`` each decoder layer, then the root; gradients are summed over ranks.

        Call before building the optimizer (it must see the sharded parameters) and after
        freezing layers or enabling gradient checkpointing. The model may be on the CPU: FSDP
        moves each shard to this rank's device.

        A peft LoRA model is sharded the same way (apply LoRA first): each decoder layer's
        unit then holds its frozen base weights and its trainable adapter side by side, which
        FSDP2 allows (only parameters that received a gradient are reduced).

        Args:
            model: a HF causal LM (decoder layers in ``model.model.layers``), or a peft model
                wrapping one.

        Returns:
            The same module, now an ``FSDPModule`` (unchanged when not enabled).
        """
        if not self.enabled:
            return model
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        return model

    @property
    def grad_scale(self) -> float:
        """Factor on each rank's loss before ``backward()``: the world size (1 when off).

        Each rank's loss is already divided by the whole step's sequence count, so the per-rank
        gradients must be summed; FSDP averages them over ranks, and this factor undoes that
        (``set_gradient_divide_factor(1)`` would need PREMUL_SUM, which gloo lacks).
        """
        return float(self.world_size) if self.enabled else 1.0

    def full_state_dict(self, model: Any) -> dict[str, torch.Tensor] | None:
        """Gather the whole model on rank 0's CPU (every rank must call this together).

        Returns:
            None when not enabled (save the model as is); the full ``{name: tensor}`` on rank 0
            (CPU tensors, tied parameters under their first name only); an empty dict on the
            other ranks.
        """
        if not self.enabled:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        with self._guard("gathering the full state dict"):
            full = get_model_state_dict(
                model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # a tied parameter (e.g. the LM head sharing the embeddings) comes back under each name
        # as separate copies; keep its first name only, as save_pretrained does for the model
        first: dict[int, str] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            if first.setdefault(id(param), name) != name:
                full.pop(name, None)
        return full

    # ---------------------------------------------------------------- data
    def my_share(self, micro_batches: list[T]) -> list[T]:
        """This rank's micro-batches: ``rank, rank + N, ...`` of the step's list (all of them when off).

        Raises:
            DistributedError: the count is not a multiple of the world size (ranks would run
                different numbers of collectives); happens when run-api sent a batch whose size
                differs from the registered ``batch_size``.
        """
        if not self.enabled:
            return micro_batches
        if len(micro_batches) % self.world_size:
            raise DistributedError(
                f"the step has {len(micro_batches)} micro-batches, not a multiple of the "
                f"{self.world_size} ranks; run-api sent a batch of another size than the "
                "registered --batch-size")
        return micro_batches[self.rank::self.world_size]

    def from_main(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (pickled over the control group); ``obj`` when off."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        with self._guard("waiting for rank 0", self.control_timeout):
            dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def wait_for_main(self) -> None:
        """Block until every rank gets here (rank 0 after its vLLM/eval work)."""
        if self.enabled:
            import torch.distributed as dist

            with self._guard("waiting for rank 0", self.control_timeout):
                dist.barrier(group=self.control)

    # ---------------------------------------------------------------- metrics
    def sum_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Sum each metric over the ranks (every rank must pass the same keys)."""
        if not self.enabled:
            return sums
        import torch
        import torch.distributed as dist

        keys = sorted(sums)
        values = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=self.device)
        with self._guard("summing step metrics"):
            dist.all_reduce(values)
        return dict(zip(keys, values.tolist(), strict=True))

    @staticmethod
    def scalar(value: Any) -> float:
        """A float from a tensor, a ``DTensor`` (``clip_grad_norm_`` over FSDP2 parameters) or a number."""
        full = getattr(value, "full_tensor", None)
        return float(full() if full is not None else value)

    # ---------------------------------------------------------------- lifetime
    def close(self, error: BaseException | None = None) -> None:
        """Record how this rank ended (so peers can name it); after a clean end, leave the group.

        Args:
            error: the exception that ends this rank, or None when it finished. After an error
                the process group is left as is (tearing it down could wait on dead peers).
        """
        if not self.enabled:
            return
        import torch.distributed as dist

        if error is not None:
            self._set_state(f"failed: {type(error).__name__}: {str(error)[:200]}")
            return
        self._set_state("finished")
        self.wait_for_main()
        dist.destroy_process_group()
        self.enabled = False

    def _set_state(self, state: str) -> None:
        try:
            self._store.set(_STATE_KEY.format(self.rank), state)
        except Exception:  # noqa: BLE001 - the store may be gone with rank 0; nothing to tell then
            pass

    def _peer_report(self) -> str:
        """Which other ranks said they ended, and which said nothing (crashed or hung)."""
        ended, silent = [], []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                state = self._store.get(_STATE_KEY.format(r)).decode()
            except Exception:  # noqa: BLE001 - the store lives on rank 0's node; it may be gone
                return "the rendezvous store is unreachable (rank 0's node is down?)"
            (silent if state == "running" else ended).append(f"rank {r} ({state})" if state != "running" else f"rank {r}")
        parts = []
        if ended:
            parts.append("ended early: " + ", ".join(ended))
        if silent:
            parts.append("still marked running (crashed, killed or hung; see torchrun's summary "
                         "and their logs): " + ", ".join(silent))
        return "; ".join(parts)

    def _guard(self, what: str, timeout: float | None = None) -> Any:
        """Turn a failed collective into a :class:`DistributedError` that names the peers."""
        import contextlib

        dist_self = self
        limit = self.collective_timeout if timeout is None else timeout

        @contextlib.contextmanager
        def guard() -> Any:
            try:
                yield
            except DistributedError:
                raise
            except Exception as exc:
                if not _is_collective_failure(exc):
                    raise
                raise DistributedError(
                    f"rank {dist_self.rank}: {what} failed (a peer exited, crashed or did not "
                    f"answer within {limit:.0f}s): {dist_self._peer_report()}. "
                    f"Cause: {type(exc).__name__}: {str(exc)[:300]}") from exc
        return guard()


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a HF causal LM (``model.model.layers``), also inside a peft model; [] if none."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(getattr(getattr(base, "model", None), "layers", None) or [])


def _is_collective_failure(exc: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(exc, (dist.DistBackendError, dist.DistError, RuntimeError, TimeoutError))


def setup(config: TrainerConfig, device: Any, environ: dict[str, str] | None = None) -> Distributed:
    """Resolve ``--fsdp``, check the batch layout, and join the process group when sharding.

    Runs before anything else in the trainer (no model, vLLM or run-api yet), so a bad layout
    fails at once. NCCL on CUDA (each rank on ``cuda:LOCAL_RANK``), gloo on the CPU.

    Args:
        config: the trainer config (``fsdp``, ``collective_timeout``, ``batch_size``,
            ``micro_batch_size`` and the timeouts of rank 0's lone work are read).
        device: the device the single-process trainer would use.
        environ: environment to read (default ``os.environ``).

    Returns:
        A :class:`Distributed`; not enabled for ``--fsdp off`` or ``auto`` in one process.

    Raises:
        ConfigError: ``--fsdp on`` outside torchrun, ``--fsdp off`` under a multi-process
            torchrun, a batch layout that does not split evenly over the ranks.
    """
    world, rank, local_rank = world_from_env(environ)
    env = os.environ if environ is None else environ
    launched = "RANK" in env and "MASTER_ADDR" in env
    mode = config.fsdp
    if mode == "off" and world > 1:
        raise ConfigError(f"--fsdp off trains in one process but WORLD_SIZE={world}: drop torchrun "
                         "or use --fsdp on (the default under torchrun)")
    if mode == "on" and not launched:
        raise ConfigError("--fsdp on needs the variables torchrun sets (RANK, WORLD_SIZE, "
                         "MASTER_ADDR): run `torchrun --nproc-per-node N -m example_trainer.grpo`")
    if mode == "off" or (mode == "auto" and world == 1):
        return Distributed(device=device)
    check_batch_layout(config.batch_size, config.micro_batch_size, world)

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    collective = config.collective_timeout
    # rank 0 alone waits for a batch, (re)starts vLLM and evaluates; the others wait this long
    lone_work = max(config.batch_timeout, config.vllm_start_timeout + 2 * config.eval_timeout)
    control_timeout = collective + lone_work
    dist.init_process_group(backend, timeout=timedelta(seconds=collective),
                            device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=control_timeout))
    mesh = init_device_mesh(device.type, (world,))
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=30))
    ctx = Distributed(enabled=True, world_size=world, rank=rank, local_rank=local_rank,
                      device=device, mesh=mesh, control=control, collective_timeout=collective,
                      control_timeout=control_timeout, _store=store)
    ctx._set_state("running")
    return ctx
