"""What every weight transport offers a trainer: push a version of the weights, then close.

A trainer turns its model into ``{HF tensor name: tensor}`` (merging a LoRA adapter, leaving out
tied copies, keeping only what training changes) and hands that to one
:class:`WeightTarget`; the target owns everything after: casting, serializing, writing,
sending, asking vLLM to load, and what to do when a server is slow or gone.

The targets:

* :class:`~atroposlib.inference.weights.local_vllm.LocalVLLM`: a vLLM process this trainer
  launched (writes safetensors into a directory, asks vLLM to reload them).
* :class:`~atroposlib.inference.weights.external_vllm.ExternalVLLM`: stock vLLM servers that
  read the same directory (shared filesystem), reloaded over their dev-mode routes.
* :class:`~atroposlib.inference.weights.node_http.NodeFleet`: ``atropos-inference-node``
  nodes, sent the tensors over HTTP (or pointed at a local file), no shared disk needed.
* :class:`~atroposlib.inference.weights.nccl.NcclFleet`: the same nodes over vLLM's NCCL
  weight transfer (CUDA only).

Encodings. A push hands over the full current values of the tensors it names (any subset of
the model's tensors: the server keeps the others). What goes over the wire is the target's
choice: to a server that holds the version pushed last, the trainer's vLLM, stock servers and
inference nodes send only the elements that changed (a delta,
:mod:`~atroposlib.inference.weights.delta`, against the target's copy of that version,
:mod:`~atroposlib.inference.weights.delta_sync`), and the whole tensors to any other; the
``push`` signature and the trainer's side stay as they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class WeightTarget(ABC):
    """One place a trainer's weights go: a vLLM server, or a set of them, over one transport.

    Thread use: :meth:`push` may run in a background thread (one push at a time; the caller
    waits for one before starting the next), :meth:`close` runs after the last push returned.
    """

    @abstractmethod
    def push(self, tensors: dict[str, Any], version: int,
             metadata: dict[str, str] | None = None) -> dict[str, float]:
        """Make the server(s) serve ``tensors`` as policy version ``version``.

        Args:
            tensors: ``{HF name: torch.Tensor}``, any subset of the served model's tensors
                (shapes as in the model, e.g. ``[out_features, in_features]`` for a linear
                weight; any floating dtype, cast to the server's; any device). Tensors left
                out keep their current values on the server. The caller must not change them
                until ``push`` returns.
            version: the policy version (the trainer's step; an int >= 0) the servers tag
                the completions they serve with, where they do.
            metadata: strings carried with the tensors (a LoRA adapter push: its
                ``adapter_config.json``); None for model weights.

        Returns:
            Metrics named ``sync/...`` (seconds, bytes, node counts), ready to log.

        Raises:
            InferenceError: the server refused or failed the update (targets that track
                several servers report a failed one in the metrics instead).
        """

    def summary(self) -> dict[str, Any]:
        """Fields for a run summary (e.g. failed syncs); ``{}`` where the target keeps none."""
        return {}

    def close(self) -> None:  # noqa: B027 - a no-op by default: most targets hold nothing
        """Release what the target holds (threads, connections); it takes no push after."""


__all__ = ["WeightTarget"]
