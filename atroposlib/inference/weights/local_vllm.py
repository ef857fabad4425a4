"""The vLLM process this trainer launched: weights written to a directory, then hot-reloaded.

:class:`WeightReload` is the reload half of
:class:`~atroposlib.inference.vllm_process.VLLMProcess`; :class:`LocalVLLM` is the
:class:`~atroposlib.inference.weights.base.WeightTarget` over such a process. The HTTP calls
themselves are in :mod:`~atroposlib.inference.weights.vllm_rpc`, shared with stock vLLM servers
the trainer did not launch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.base import WeightTarget
from atroposlib.inference.weights.vllm_rpc import (
    DEV_MODE_FIX,
    RELOAD_TIMEOUT_S,
    DeltaServers,
    release_free_heap,
    reload_from_dir,
)


class WeightReload:
    """The weight half of :class:`~atroposlib.inference.vllm_process.VLLMProcess` (a mixin).

    It reads the process's ``root_url``, ``dev_mode``, ``is_running()``, ``death_report()``
    and ``releases_heap``.
    """

    root_url: str
    dev_mode: bool
    #: bytes the workers' resident memory shrank by when they released their free heap after
    #: the last reload (``None`` before one, or when the server runs another worker extension)
    heap_released_bytes: int | None = None
    is_running: Any
    death_report: Any
    releases_heap: bool

    def reload_weights(self, weights_dir: str | Path) -> float:
        """Load new weights into the running server without restarting it.

        Sends ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path":
        DIR}}`` (every worker reloads the safetensors in ``DIR``), then ``POST
        /reset_prefix_cache`` so no KV computed with the old weights is reused, then (with our
        worker extension) has every worker give its free heap back to the OS
        (:attr:`heap_released_bytes`). The model architecture and shapes must be unchanged.

        Args:
            weights_dir: directory holding ``model.safetensors`` (e.g. a ``save_pretrained``
                checkpoint of the same architecture).

        Returns:
            Seconds taken (about 0.3-1.2 s for SmolLM2-135M on CPU).

        Raises:
            FileNotFoundError: ``weights_dir`` has no ``*.safetensors`` file.
            RuntimeError: the server was never started (or was stopped).
            InferenceError: the server died (exit code and log tail in the message), refused or
                failed (message includes its answer).
        """
        import httpx

        weights_dir = Path(weights_dir).resolve()
        if not any(weights_dir.glob("*.safetensors")):
            raise FileNotFoundError(
                f"{weights_dir} holds no *.safetensors file; save the policy with "
                "model.save_pretrained(dir) (safetensors) before reloading"
            )
        died = self.death_report()
        if died is not None:
            raise InferenceError(f"cannot reload weights: {died}")
        if not self.is_running():
            raise RuntimeError("vLLM is not running; call start() first")
        begin = time.perf_counter()
        with httpx.Client(timeout=RELOAD_TIMEOUT_S, trust_env=False) as client:
            reload_from_dir(client, self.root_url, weights_dir, fix=DEV_MODE_FIX if self.dev_mode else
                            "start VLLMProcess(dev_mode=True) (VLLM_SERVER_DEV_MODE=1) to hot-reload weights")
            if self.releases_heap:
                # the reload's transient tensors leave free heap behind: return it to the OS
                self.heap_released_bytes = release_free_heap(client, self.root_url)
        return time.perf_counter() - begin


class LocalVLLM(WeightTarget):
    """The vLLM process this trainer launched: a weight delta applied in memory, or a reload from a directory.

    Once vLLM holds a version the trainer pushed (after the first full push), each push of the
    same tensors is a delta (only the changed elements) applied by atroposlib's worker extension
    inside vLLM (:mod:`~atroposlib.inference.weights.delta_sync`); a push that cannot be one
    (the first, another tensor set, a refused delta) writes ``model.safetensors`` and reloads it.

    Args:
        process: a started :class:`~atroposlib.inference.vllm_process.VLLMProcess` (any
            object with :meth:`WeightReload.reload_weights`, ``heap_released_bytes`` and
            ``root_url``).
        weights_dir: where a full push writes ``model.safetensors`` (on this host).
        encoding: ``weight_sync_encoding``: ``auto`` / ``index`` / ``xor`` (deltas where
            possible) or ``full`` (always write and reload).
    """

    def __init__(self, process: Any, weights_dir: Path, encoding: str = "auto"):
        self.process = process
        self.weights_dir = Path(weights_dir)
        self.encoding = encoding
        self._servers: Any = None

    def push(self, tensors: dict[str, Any], version: int,
             metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Apply ``tensors`` as a delta, or write and hot-reload them (see :meth:`WeightTarget.push`).

        Returns:
            ``sync/save_seconds`` (encoding or writing), ``sync/update_seconds`` (vLLM
            applying or reloading), the fields of
            :func:`~atroposlib.inference.weights.delta_sync.sync_record` (``sync/path``,
            ``sync/bytes``, ``sync/full_bytes``, ``sync/seconds``, ``sync/changed_fraction``)
            and, with atroposlib's worker extension, ``sync/vllm_heap_released_mb`` (MiB of
            free heap vLLM's workers gave back to the OS after the update).

        Raises:
            InferenceError: vLLM died, refused or failed the reload.
        """
        import httpx

        if self._servers is None:  # a stand-in process without a URL takes full pushes only
            root = getattr(self.process, "root_url", None)
            self._servers = DeltaServers([root or "local"], self.encoding if root else "full")

        self.process.heap_released_bytes = None
        weights_dir = self.weights_dir.resolve()
        with httpx.Client(timeout=RELOAD_TIMEOUT_S, trust_env=False) as client:
            push = self._servers.send_delta(tensors, version, client, weights_dir)
            reload_s = self.process.reload_weights(weights_dir) if push.needs_full else 0.0
            metrics = self._servers.finish(push, client, weights_dir, reload_s)
            if metrics["sync/path"] == "delta" and self.process.releases_heap:
                self.process.heap_released_bytes = release_free_heap(client, self.process.root_url)
        released = self.process.heap_released_bytes
        heap = {} if released is None else {"sync/vllm_heap_released_mb": released / 2**20}
        return {**metrics, **heap}


__all__ = ["LocalVLLM", "WeightReload"]
