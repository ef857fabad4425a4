"""Stock vLLM servers that read the trainer's weights directory, reloaded over HTTP.

A server that holds the version pushed last gets only the changed elements, every other server
the full directory reload, through :mod:`~atroposlib.inference.weights.vllm_rpc` (the one
home of those HTTP calls). LoRA adapters are hot-loaded with :func:`load_adapter`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.base import WeightTarget
from atroposlib.inference.weights.vllm_rpc import (
    RELOAD_TIMEOUT_S,
    DeltaServers,
    reload_from_dir,
    vllm_post,
)


class ExternalVLLM(WeightTarget):
    """Stock vLLM servers (``--vllm-url``) sharing a filesystem with the trainer.

    A server running atroposlib's worker extension (``--worker-extension-cls
    atroposlib.inference.worker_extension.AtroposWorkerExtension``) gets a weight delta over
    ``/collective_rpc`` once it holds a version the trainer pushed; otherwise each push writes
    ``model.safetensors`` into ``weights_dir`` and has the servers reload it, one after another.

    Args:
        roots: the servers' root URLs (no ``/v1``); each runs with ``VLLM_SERVER_DEV_MODE=1``.
        weights_dir: a directory every server reads at the same path.
        encoding: ``weight_sync_encoding`` (``full``: never a delta).
    """

    def __init__(self, roots: list[str], weights_dir: Path, encoding: str = "auto"):
        self.roots = [r.rstrip("/").removesuffix("/v1") for r in roots]
        self.weights_dir = Path(weights_dir)
        self._servers = DeltaServers(self.roots, encoding)

    def push(self, tensors: dict[str, Any], version: int,
             metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Send a delta or write and reload ``tensors`` on every server (see :meth:`WeightTarget.push`).

        Returns:
            ``sync/save_seconds`` (encoding, writing), ``sync/update_seconds`` (all updates) and
            the fields of :func:`~atroposlib.inference.weights.delta_sync.sync_record`.

        Raises:
            InferenceError: a server refused or failed the reload (e.g. not in dev mode).
        """
        import httpx

        weights_dir = self.weights_dir.resolve()
        with httpx.Client(timeout=RELOAD_TIMEOUT_S, trust_env=False) as client:
            push = self._servers.send_delta(tensors, version, client, weights_dir)
            begin = time.perf_counter()
            for root in push.needs_full:
                reload_from_dir(client, root, weights_dir)
            return self._servers.finish(push, client, weights_dir, time.perf_counter() - begin)

    def wait_healthy(self, timeout: float, fix: str) -> float:
        """Wait until every server answers ``GET /health`` with 200 (fail fast, not at the first push).

        Args:
            timeout: seconds for all of them together.
            fix: what the user should do when one never answers (ends the error message).

        Returns:
            Seconds waited.

        Raises:
            InferenceError: a server did not answer 200 within ``timeout``.
        """
        import httpx

        begin = time.perf_counter()
        deadline = time.monotonic() + timeout
        for root in self.roots:
            health = root + "/health"
            while True:
                try:
                    if httpx.get(health, timeout=5.0, trust_env=False).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise InferenceError(f"no vLLM answers {health} after {timeout:.0f}s; {fix}")
                time.sleep(1.0)
        return time.perf_counter() - begin

    def unhealthy(self) -> str | None:
        """Why a server cannot serve right now: it did not answer ``GET /health`` with 200 within 5 s (None: all did).

        A server that failed may come back; the caller decides how long to wait for it.
        """
        import httpx

        for root in self.roots:
            health = root + "/health"
            try:
                status = httpx.get(health, timeout=5.0, trust_env=False).status_code
            except httpx.HTTPError as exc:
                return f"{health} did not answer ({type(exc).__name__}: {exc})"
            if status != 200:
                return f"{health} answered {status}"
        return None


def load_adapter(roots: list[str], lora_name: str, adapter_dir: Path, *, fix: str) -> float:
    """Load (or replace in place) the LoRA adapter served as ``lora_name`` on every server.

    ``POST /v1/load_lora_adapter`` with ``load_inplace``; each server runs with
    ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and reads ``adapter_dir``
    (a ``save_pretrained`` peft adapter) at that path.

    Returns:
        Seconds taken.

    Raises:
        InferenceError: a server refused the adapter (``fix`` says what to do).
    """
    import httpx

    payload = {"lora_name": lora_name, "lora_path": str(Path(adapter_dir).resolve()),
               "load_inplace": True}
    begin = time.perf_counter()
    with httpx.Client(timeout=RELOAD_TIMEOUT_S, trust_env=False) as client:
        for root in roots:
            vllm_post(client, root.rstrip("/").removesuffix("/v1"), "/v1/load_lora_adapter",
                      payload, fix=fix)
    return time.perf_counter() - begin


__all__ = ["ExternalVLLM", "load_adapter"]
