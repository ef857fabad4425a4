"""Asking a vLLM server over HTTP to take new weights: reload a directory, or apply a delta.

The one place that asks a vLLM server to reload weights over HTTP: ``POST /collective_rpc``
(``reload_weights`` with the directory) then ``POST /reset_prefix_cache``. Both are vLLM's
development routes: the server must run with ``VLLM_SERVER_DEV_MODE=1``. Deltas take the same
route (``POST /collective_rpc atropos_delta_apply``, applied in memory by atroposlib's worker
extension). :class:`DeltaServers` keeps which version each server holds and sends a delta to
those at the version pushed last; the trainer's own vLLM
(:mod:`~atroposlib.inference.weights.local_vllm`) and stock servers
(:mod:`~atroposlib.inference.weights.external_vllm`) both push through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
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


def release_free_heap(client: Any, root: str) -> int:
    """Have every worker of the vLLM at ``root`` give its free heap back to the OS; bytes released.

    ``POST /collective_rpc`` with atroposlib's worker extension's
    :data:`~atroposlib.inference.worker_extension.RELEASE_FREE_HEAP_RPC` (after a reload or a
    delta, whose transient tensors leave free heap behind).

    Raises:
        InferenceError: the server refused the call (it runs without the worker extension, or
            not in dev mode).
    """
    from atroposlib.inference.worker_extension import RELEASE_FREE_HEAP_RPC

    answer = vllm_post(client, root, "/collective_rpc", {"method": RELEASE_FREE_HEAP_RPC},
                       fix=DEV_MODE_FIX).json()
    return sum(int(r) for r in answer.get("results", []))


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


@dataclass
class DeltaPush:
    """One push in progress (:meth:`DeltaServers.send_delta`, then :meth:`DeltaServers.finish`).

    Attributes:
        version: the policy version pushed.
        begin: ``time.perf_counter()`` when it started.
        tensors: the tensors pushed, tied copies dropped.
        needs_full: the servers that still need the full tensors (write, reload, seed).
        full_nbytes: bytes of the full tensors.
        sent: bytes sent so far.
        fraction: share of elements that changed (1.0 without a delta).
        checksums: the delta's per-tensor checksums (None without one).
        save_s, update_s: seconds encoding/writing and applying/reloading so far.
    """

    version: int
    begin: float
    tensors: dict[str, Any]
    needs_full: list[str] = field(default_factory=list)
    full_nbytes: int = 0
    sent: int = 0
    fraction: float = 1.0
    checksums: Any = None
    save_s: float = 0.0
    update_s: float = 0.0


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

    def send_delta(self, tensors: dict[str, Any], version: int, client: Any,
                   weights_dir: Path) -> DeltaPush:
        """Step 1 of a push: a delta to the servers at the base; the full tensors written for the rest.

        Sends ``tensors`` as ``version`` as a delta to every server at the delta base; when
        any server still needs the full tensors (``push.needs_full``), writes them as
        ``weights_dir/model.safetensors`` (:func:`write_tensors`). The caller then has those
        servers reload ``weights_dir`` and calls :meth:`finish`.

        Args:
            tensors: ``{HF name: tensor}`` in the servers' dtype (tied copies are dropped here).
            version: the policy version.
            client: an ``httpx.Client``.
            weights_dir: where the full tensors go (read by the servers at that path).

        Returns:
            The push so far (:class:`DeltaPush`).
        """
        from atroposlib.inference.weights.delta_sync import tensor_bytes, warn_full_sync
        from atroposlib.inference.weights.select import unique_storage

        push = DeltaPush(version, time.perf_counter(), unique_storage(tensors))
        push.full_nbytes = tensor_bytes(push.tensors)
        push.needs_full = list(self.at)
        if self.base is not None and self.base.matches(push.tensors):
            payload, stats = self.base.encode(push.tensors, version)
            push.save_s, push.fraction, push.checksums = stats.seconds, stats.changed_fraction, stats.checksums
            # a delta no smaller than the tensors themselves: send them whole
            at_base = [r for r in self.at if self.at[r] == self.base.version
                       and stats.nbytes < push.full_nbytes]
            push.needs_full = [r for r in self.at if r not in at_base]
            mark = time.perf_counter()
            for root in at_base:
                answer = apply_delta(client, root, payload)
                push.sent += len(payload)
                if answer.get("applied"):
                    self.at[root] = version
                else:
                    self.at[root] = None
                    warn_full_sync(root, version, f"{answer.get('reason')}: {answer.get('detail')}")
                    push.needs_full.append(root)
            push.update_s = time.perf_counter() - mark
        if push.needs_full:
            push.save_s += write_tensors(tensors, Path(weights_dir))
        return push

    def finish(self, push: DeltaPush, client: Any, weights_dir: Path,
               reload_s: float = 0.0) -> dict[str, Any]:
        """Step 2: record the full reload of ``push.needs_full`` (if any) and the new delta base.

        Args:
            push: what :meth:`send_delta` returned.
            client: an ``httpx.Client``.
            weights_dir: the directory the full tensors were written to and reloaded from (the
                servers seed their delta base from it).
            reload_s: seconds the caller spent reloading them (0 when ``push.needs_full`` is empty).

        Returns:
            ``sync/save_seconds``, ``sync/update_seconds`` and :func:`sync_record`'s fields.
        """
        from atroposlib.inference.weights.delta_sync import sync_record

        version = push.version
        if push.needs_full:
            push.update_s += reload_s
            push.sent += push.full_nbytes
            for root in push.needs_full:
                self.at[root] = version if self.base is not None and seed_delta(
                    client, root, weights_dir, version) else None
        if self.base is not None:
            if any(v == version for v in self.at.values()):
                self.base.commit(push.tensors, version, push.checksums)
            else:
                self.base.forget()
        return {"sync/save_seconds": push.save_s, "sync/update_seconds": push.update_s,
                **sync_record("full" if push.needs_full else "delta", push.sent, push.full_nbytes,
                              time.perf_counter() - push.begin, push.fraction)}


__all__ = ["DEV_MODE_FIX", "RELOAD_TIMEOUT_S", "DeltaPush", "DeltaServers", "apply_delta", "release_free_heap", "reload_from_dir", "seed_delta",
           "vllm_post", "write_tensors"]
