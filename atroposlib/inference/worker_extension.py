"""Methods our vLLM servers' workers gain (vLLM's ``--worker-extension-cls``), reached through ``/collective_rpc``.

:class:`~atroposlib.inference.vllm_process.VLLMProcess` starts vLLM with
:data:`WORKER_EXTENSION_CLS` unless its extra arguments name another class. vLLM mixes the class
into its worker, so ``POST /collective_rpc {"method": "atropos_release_free_heap"}`` runs the
method in every worker process (in the engine core when the worker runs there).

Why it exists: a hot reload reads the new tensors into freshly allocated memory, copies them into
the model and frees them, while requests keep allocating around them. glibc's malloc keeps the
freed space resident inside its heap, so without a trim the engine's resident memory grows over a
run. Measured on the quickstart (``benchmarks/bench_learning.py --minutes 2``): after 45 reloads
vLLM's engine held 320 MB of free heap, and its peak RSS fell from 1.73 to 1.59 GiB with a trim
after each reload, with no fewer training steps (a trim takes about 30 ms).

``atropos_delta_seed``, ``atropos_delta_apply`` and ``atropos_delta_reset`` apply weight deltas
in memory (:mod:`~atroposlib.inference.weights.delta_cache`): a full sync seeds the worker's copy
of the synced tensors, each delta is applied onto it, checked and loaded, never through a file.

``atropos_discard_partial_reload`` lets an inference node recover from a reload that vLLM
failed half-way (:func:`discard_partial_reload`), so it can put its last good weights back.
"""

from __future__ import annotations

from typing import Any

from atroposlib.utils.heap import release_free_heap, resident_bytes

#: The ``--worker-extension-cls`` value VLLMProcess passes to vLLM.
WORKER_EXTENSION_CLS = "atroposlib.inference.worker_extension.AtroposWorkerExtension"
#: The ``/collective_rpc`` method that returns free heap pages to the OS.
RELEASE_FREE_HEAP_RPC = "atropos_release_free_heap"
#: The ``collective_rpc`` method that clears what a failed ``reload_weights`` left behind.
DISCARD_PARTIAL_RELOAD_RPC = "atropos_discard_partial_reload"
#: ``collective_rpc`` method: take the just-reloaded ``*.safetensors`` of a directory as the delta base.
DELTA_SEED_RPC = "atropos_delta_seed"
#: ``collective_rpc`` method: apply a weight delta (bytes, or base64 text over vLLM's dev route).
DELTA_APPLY_RPC = "atropos_delta_apply"
#: ``collective_rpc`` method: forget the delta base.
DELTA_RESET_RPC = "atropos_delta_reset"


def discard_partial_reload(model: Any) -> int:
    """Undo what a ``reload_weights`` that raised half-way left in ``model``; return the layers put back.

    vLLM 0.32 reloads layer by layer: it first moves every layer's tensors to the meta device
    and buffers the tensors it reads, and a layer gets its new values only once all of its
    tensors have arrived. An error (a tensor of the wrong shape or name) ends the reload before
    its last step, which puts the untouched layers' tensors back. Those layers are left on the
    meta device with the bad tensor still buffered, and the next reload replays it and fails
    the same way, so the node could never restore its weights. Here each such layer gets its
    own tensors back (the values it served before the reload) and forgets the buffered ones.
    Layers the reload had completed keep their new values: the caller reloads the last good
    weights afterwards.

    Args:
        model: the worker's model (``worker.get_model()``).

    Returns:
        How many layers were put back (0 when no reload was pending).
    """
    from vllm.model_executor.model_loader.reload import layerwise

    restored = 0
    for layer in model.modules():
        info = layerwise.LAYERWISE_INFO.get(layer)
        if info is None or not info.can_load():
            continue
        if info.kernel_tensors is not None:
            layerwise._place_kernel_tensors(layer, info)
            restored += 1
        for tensor in layerwise.get_layer_tensors(layer).values():
            if hasattr(tensor, "weight_loader"):
                tensor.weight_loader = layerwise._get_original_loader(tensor)
        info.reset()
    if hasattr(model, "_original_do_torchao_reload"):
        model._do_torchao_reload = model._original_do_torchao_reload
    layerwise.LOADING_LAYERS.clear()
    return restored


class AtroposWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls`` (see the module docstring)."""

    def atropos_release_free_heap(self) -> int:
        """Run :func:`release_free_heap` in this worker; return the bytes its RSS shrank by."""
        return release_free_heap()

    def atropos_discard_partial_reload(self) -> int:
        """Run :func:`discard_partial_reload` on this worker's model; return the layers put back."""
        return discard_partial_reload(self.get_model())  # type: ignore[attr-defined]

    def _atropos_delta_cache(self) -> Any:
        from atroposlib.inference.weights.delta_cache import DeltaCache

        cache = getattr(self, "_atropos_delta", None)
        if cache is None:
            cache = self._atropos_delta = DeltaCache()
        return cache

    def atropos_delta_seed(self, path: str, version: int | str) -> dict[str, Any]:
        """Seed this worker's delta base with the ``*.safetensors`` in ``path`` (just reloaded) as ``version``.

        Returns:
            ``{"version", "tensors", "bytes"}`` (bytes: the cache's memory).
        """
        return self._atropos_delta_cache().seed_from_dir(path, int(version))

    def atropos_delta_apply(self, payload: bytes | str) -> dict[str, Any]:
        """Apply a weight delta in memory (see :meth:`DeltaCache.apply`); ``payload`` as bytes or base64 text."""
        import base64

        if isinstance(payload, str):  # vLLM's dev-mode /collective_rpc route passes strings only
            payload = base64.b64decode(payload)
        return self._atropos_delta_cache().apply(bytes(payload), self._atropos_load)

    def atropos_delta_checksums(self) -> dict[str, Any]:
        """``{"version", "sha256": {HF name: hex}}`` of this worker's delta base (what it last applied)."""
        from atroposlib.inference.weights.delta import checksum

        cache = self._atropos_delta_cache()
        return {"version": cache.version, "sha256": {n: checksum(t) for n, t in cache.tensors.items()}}

    def atropos_delta_reset(self) -> None:
        """Forget this worker's delta base (the next delta is refused, so a full sync follows)."""
        self._atropos_delta_cache().reset()

    def _atropos_load(self, pairs: list[tuple[str, Any]]) -> None:
        """Load HF-named tensors into the model in place, through vLLM's own reload (fused params mapped by vLLM)."""
        self.reload_weights(weights_iterator=iter(pairs))  # type: ignore[attr-defined]


__all__ = ["DELTA_APPLY_RPC", "DELTA_RESET_RPC", "DELTA_SEED_RPC", "DISCARD_PARTIAL_RELOAD_RPC",
           "RELEASE_FREE_HEAP_RPC", "WORKER_EXTENSION_CLS",
           "AtroposWorkerExtension", "discard_partial_reload", "release_free_heap", "resident_bytes"]
