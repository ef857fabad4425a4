"""Stock vLLM servers that read the trainer's weights directory, reloaded over HTTP.

The one place that asks a vLLM server to reload weights over HTTP: ``POST /collective_rpc``
(``reload_weights`` with the directory) then ``POST /reset_prefix_cache``. Both are vLLM's
development routes: the server must run with ``VLLM_SERVER_DEV_MODE=1``. The trainer's own
vLLM (:mod:`~atroposlib.inference.weights.local_vllm`) reloads through the same calls.

Deltas take the same route: :class:`DeltaServers` sends a server that holds the version pushed
last only the changed elements (``POST /collective_rpc atropos_delta_apply``, applied in memory
by atroposlib's worker extension), and the full directory reload to every other server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.base import WeightTarget
from atroposlib.inference.worker_extension import DELTA_APPLY_RPC, DELTA_SEED_RPC

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


def apply_delta(client: Any, root: str, payload: bytes, *, fix: str = DEV_MODE_FIX) -> dict[str, Any]:
    """Have every worker of the vLLM at ``root`` apply a weight delta in memory, then drop stale KV.

    ``POST /collective_rpc {"method": "atropos_delta_apply", "args": [base64 of payload]}`` (the
    dev-mode route passes strings only), then ``POST /reset_prefix_cache`` when it applied. The
    server must run atroposlib's worker extension (the trainer's own vLLM does).

    Returns:
        ``{"applied": True, "version", ...}`` when every worker applied it; else ``{"applied":
        False, "reason", "detail"}`` (another base, a checksum mismatch, no worker extension):
        then nothing changed unless a worker failed while loading (reason ``load``).
    """
    import base64

    try:
        answer = vllm_post(client, root, "/collective_rpc", {
            "method": DELTA_APPLY_RPC, "args": [base64.b64encode(payload).decode()]}, fix=fix).json()
    except InferenceError as exc:
        return {"applied": False, "reason": "load", "detail": str(exc)[:500]}
    results = answer.get("results") or []
    refused = [r for r in results if not (isinstance(r, dict) and r.get("applied"))]
    if not results or refused:
        first = refused[0] if refused else {}
        first = first if isinstance(first, dict) else {"detail": str(first)}
        return {"applied": False, "reason": first.get("reason", "unknown"),
                "detail": first.get("detail", "no worker answered")}
    vllm_post(client, root, "/reset_prefix_cache", fix=fix)
    return results[0]


def seed_delta(client: Any, root: str, weights_dir: Path, version: int) -> bool:
    """Have the vLLM at ``root`` take the ``*.safetensors`` it just reloaded from ``weights_dir`` as its delta base.

    Returns:
        False when it cannot (it runs without atroposlib's worker extension): it then only
        ever gets full syncs.
    """
    try:
        vllm_post(client, root, "/collective_rpc", {
            "method": DELTA_SEED_RPC, "args": [str(weights_dir), str(version)]}, fix=DEV_MODE_FIX)
    except InferenceError as exc:
        print(f"[grpo] {root} cannot take weight deltas (it runs without atroposlib's worker "
              f"extension?): {str(exc)[:200]}; it gets full syncs", flush=True)
        return False
    return True


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


class DeltaServers:
    """Delta-or-full pushes to vLLM servers reached over ``/collective_rpc``.

    The trainer's own vLLM, or stock servers sharing the weights directory.

    Args:
        roots: the servers' root URLs.
        encoding: ``weight_sync_encoding`` (``auto``, ``index``, ``xor`` or ``full``).
    """

    def __init__(self, roots: list[str], encoding: str):
        from atroposlib.inference.weights.delta_sync import DeltaBase, delta_format

        fmt = delta_format(encoding)
        self.base = DeltaBase(fmt) if fmt else None
        #: root -> the version its worker extension holds as delta base (None: needs a full sync)
        self.at: dict[str, int | None] = {r: None for r in roots}

    def push(self, tensors: dict[str, Any], version: int, full: Any, client: Any,
             weights_dir: Any) -> dict[str, Any]:
        """Send ``tensors`` as ``version``: a delta to the servers at the base, ``full(roots)`` to the rest.

        Args:
            tensors: ``{HF name: tensor}`` in the servers' dtype (tied copies are dropped here).
            version: the policy version.
            full: ``full(roots) -> (save_seconds, update_seconds)`` writes ``tensors`` into
                ``weights_dir`` and reloads those servers from it.
            client: an ``httpx.Client``.
            weights_dir: the directory ``full`` writes (the servers seed their base from it).

        Returns:
            ``sync/save_seconds``, ``sync/update_seconds`` and :func:`sync_record`'s fields.
        """
        from atroposlib.inference.weights.delta_sync import (
            sync_record,
            tensor_bytes,
            warn_full_sync,
        )
        from atroposlib.inference.weights.select import unique_storage

        begin = time.perf_counter()
        tensors = unique_storage(tensors)
        full_nbytes = tensor_bytes(tensors)
        save_s = update_s = 0.0
        sent = 0
        fraction = 1.0
        needs_full = list(self.at)
        checksums = None
        if self.base is not None and self.base.matches(tensors):
            payload, stats = self.base.encode(tensors, version)
            save_s, fraction, checksums = stats.seconds, stats.changed_fraction, stats.checksums
            # a delta no smaller than the tensors themselves: send them whole
            at_base = [r for r in self.at if self.at[r] == self.base.version
                       and stats.nbytes < full_nbytes]
            needs_full = [r for r in self.at if r not in at_base]
            mark = time.perf_counter()
            for root in at_base:
                answer = apply_delta(client, root, payload)
                sent += len(payload)
                if answer.get("applied"):
                    self.at[root] = version
                else:
                    self.at[root] = None
                    warn_full_sync(root, version, f"{answer.get('reason')}: {answer.get('detail')}")
                    needs_full.append(root)
            update_s = time.perf_counter() - mark
        if needs_full:
            write_s, reload_s = full(needs_full)
            save_s, update_s = save_s + write_s, update_s + reload_s
            sent += full_nbytes
            for root in needs_full:
                self.at[root] = version if self.base is not None and seed_delta(
                    client, root, weights_dir, version) else None
        if self.base is not None:
            if any(v == version for v in self.at.values()):
                self.base.commit(tensors, version, checksums)
            else:
                self.base.forget()
        return {"sync/save_seconds": save_s, "sync/update_seconds": update_s,
                **sync_record("full" if needs_full else "delta", sent, full_nbytes,
                              time.perf_counter() - begin, fraction)}

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

        def full(roots: list[str]) -> tuple[float, float]:
            save_s = write_tensors(tensors, self.weights_dir)
            begin = time.perf_counter()
            for root in roots:
                reload_from_dir(client, root, self.weights_dir.resolve())
            return save_s, time.perf_counter() - begin

        with httpx.Client(timeout=RELOAD_TIMEOUT_S, trust_env=False) as client:
            return self._servers.push(tensors, version, full, client, self.weights_dir.resolve())

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


__all__ = ["DEV_MODE_FIX", "DeltaServers", "ExternalVLLM", "apply_delta", "load_adapter", "reload_from_dir",
           "seed_delta", "vllm_post", "write_tensors"]
