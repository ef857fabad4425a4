"""Hot-reloading new weights into a running stock vLLM server, through its dev endpoints."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.worker_extension import RELEASE_FREE_HEAP_RPC


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

    def _post(self, client: Any, path: str, payload: dict | None = None) -> Any:
        response = client.post(f"{self.root_url}{path}", json=payload)
        if response.status_code == 404 and not self.dev_mode:
            raise InferenceError(
                f"POST {path} is not available: start VLLMProcess(dev_mode=True) "
                "(VLLM_SERVER_DEV_MODE=1) to hot-reload weights"
            )
        if response.status_code != 200:
            raise InferenceError(
                f"POST {self.root_url}{path} answered {response.status_code}: "
                f"{response.text[:2000]}"
            )
        return response

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
        with httpx.Client(timeout=600.0, trust_env=False) as client:
            self._post(
                client,
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}},
            )
            self._post(client, "/reset_prefix_cache")
            if self.releases_heap:
                # the reload's transient tensors leave free heap behind: return it to the OS
                answer = self._post(client, "/collective_rpc", {"method": RELEASE_FREE_HEAP_RPC}).json()
                self.heap_released_bytes = sum(int(r) for r in answer.get("results", []))
        return time.perf_counter() - begin


__all__ = ["WeightReload"]
