"""Stock vLLM servers that read the trainer's weights directory, reloaded over HTTP.

The one place that asks a vLLM server to reload weights over HTTP: ``POST /collective_rpc``
(``reload_weights`` with the directory) then ``POST /reset_prefix_cache``. Both are vLLM's
development routes: the server must run with ``VLLM_SERVER_DEV_MODE=1``. The trainer's own
vLLM (:mod:`~atroposlib.inference.weights.local_vllm`) reloads through the same calls.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.base import WeightTarget

#: What to do when a stock vLLM refuses a reload.
DEV_MODE_FIX = "start that vLLM with VLLM_SERVER_DEV_MODE=1 to allow weight reloads"
#: Seconds one reload call may take (a large model on a slow disk).
RELOAD_TIMEOUT_S = 600.0


def vllm_post(client: Any, root: str, path: str, payload: dict | None = None, *, fix: str) -> Any:
    """``POST root+path`` with a JSON ``payload``; the response when it answered 200.

    Args:
        client: an ``httpx.Client``.
        root: the server's root URL (no ``/v1``).
        path: the route, e.g. ``/reset_prefix_cache``.
        payload: the JSON body (None: none).
        fix: what the user should do if the server refuses (ends the error message).

    Raises:
        InferenceError: any other status (status, the answer's first 2000 characters, ``fix``).
        httpx.HTTPError: the server did not answer.
    """
    response = client.post(f"{root}{path}", json=payload)
    if response.status_code != 200:
        raise InferenceError(f"POST {root}{path} answered {response.status_code}: "
                             f"{response.text[:2000]}; {fix}")
    return response


def reload_from_dir(client: Any, root: str, weights_dir: Path, *, fix: str = DEV_MODE_FIX) -> None:
    """Have the vLLM at ``root`` load every ``*.safetensors`` in ``weights_dir``, then drop stale KV.

    Tensors the directory leaves out keep their values. ``weights_dir`` must be readable by
    the server at that path (same host, or a shared filesystem).

    Raises:
        InferenceError: the server refused or failed a call (``fix`` says what to do).
    """
    vllm_post(client, root, "/collective_rpc",
              {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}, fix=fix)
    vllm_post(client, root, "/reset_prefix_cache", fix=fix)


def write_tensors(tensors: dict[str, Any], weights_dir: Path) -> float:
    """Write ``tensors`` as ``weights_dir/model.safetensors`` (replaced); return the seconds.

    A tensor sharing storage with an earlier one (tied embeddings) is written once, under the
    first name, as ``save_pretrained`` does.
    """
    from atroposlib.inference.weights.select import save_tensors

    begin = time.perf_counter()
    weights_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, weights_dir / "model.safetensors")
    return time.perf_counter() - begin


class ExternalVLLM(WeightTarget):
    """Stock vLLM servers (``--vllm-url``) sharing a filesystem with the trainer.

    Each push writes ``model.safetensors`` into ``weights_dir`` and has every server reload it,
    one after another.

    Args:
        roots: the servers' root URLs (no ``/v1``); each runs with ``VLLM_SERVER_DEV_MODE=1``.
        weights_dir: a directory every server reads at the same path.
    """

    def __init__(self, roots: list[str], weights_dir: Path):
        self.roots = [r.rstrip("/").removesuffix("/v1") for r in roots]
        self.weights_dir = Path(weights_dir)

    def push(self, tensors: dict[str, Any], version: int,
             metadata: dict[str, str] | None = None) -> dict[str, float]:
        """Write ``tensors`` and reload every server (see :meth:`WeightTarget.push`).

        Returns:
            ``sync/save_seconds`` (writing) and ``sync/update_seconds`` (all reloads).

        Raises:
            InferenceError: a server refused or failed the reload (e.g. not in dev mode).
        """
        import httpx

        save_s = write_tensors(tensors, self.weights_dir)
        begin = time.perf_counter()
        with httpx.Client(timeout=RELOAD_TIMEOUT_S, trust_env=False) as client:
            for root in self.roots:
                reload_from_dir(client, root, self.weights_dir.resolve())
        return {"sync/save_seconds": save_s, "sync/update_seconds": time.perf_counter() - begin}


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


__all__ = ["DEV_MODE_FIX", "ExternalVLLM", "load_adapter", "reload_from_dir", "vllm_post", "write_tensors"]
