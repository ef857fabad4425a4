"""Send one version of the weights to inference nodes: the Node and Payload records, the requests, the files file-path nodes read."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from atroposlib.inference.node.models import ADAPTER_CONFIG_KEY, DIGEST_HEADER, content_digest


@dataclass
class Node:
    """One inference node as the trainer sees it.

    Attributes:
        url: root URL (no ``/v1``).
        path: ``file`` (reads the trainer's run directory) or ``http`` (pushed to).
        dtype: the node's vLLM dtype (pushes are cast to it).
        lora_enabled: the node's vLLM runs with ``--enable-lora`` (takes adapter pushes).
        stale: missed the last sync; re-sent the weights once it answers.
        failures: syncs this node did not get (failed or missed while stale).
    """

    url: str
    path: Literal["file", "http"]
    dtype: str
    lora_enabled: bool = False
    stale: bool = False
    failures: int = 0
    delta_version: int | None = None  # the version the node can take a delta against
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class Payload:
    """One version of the weights, ready for every node (full bodies built when first needed)."""

    version: int
    kind: Literal["full", "lora"]
    lora_name: str | None
    selected: dict[str, dict[str, Any]]  # node dtype -> tensors cast to it
    directory: Path | None  # where file-path nodes read it
    tensors: int
    metadata: dict[str, str] | None = None
    deltas: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # dtype -> (base version, delta)
    bodies: dict[str, bytes] = field(default_factory=dict)  # dtype -> safetensors bytes
    files_written: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def body(self, dtype: str) -> bytes:
        """The full safetensors body in ``dtype`` (serialized once)."""
        from atroposlib.inference.weights.select import serialize

        with self.lock:
            if dtype not in self.bodies:
                self.bodies[dtype] = serialize(self.selected[dtype], self.metadata)
            return self.bodies[dtype]

    def write_files(self, dtype: str) -> None:
        """Write what file-path nodes read (once), in their dtype."""
        with self.lock:
            if not self.files_written and self.directory is not None:
                _write_files(self.selected[dtype], self.directory, self.metadata)
                self.files_written = True


def _write_files(tensors: dict[str, Any], directory: Path, metadata: dict[str, str] | None) -> None:
    """What a file-path node reads: ``model.safetensors``, or a peft adapter directory."""
    from safetensors.torch import save_file

    from atroposlib.inference.weights.select import select

    directory.mkdir(parents=True, exist_ok=True)
    if metadata and ADAPTER_CONFIG_KEY in metadata:
        save_file(select(tensors, list(tensors), None), directory / "adapter_model.safetensors")
        (directory / "adapter_config.json").write_text(metadata[ADAPTER_CONFIG_KEY])
    else:
        save_file(select(tensors, list(tensors), None), directory / "model.safetensors")


async def send_all(nodes: list[Node], payload: Payload, headers: dict[str, str], timeout: float,
                   full: bool = False) -> list[tuple[str | None, str, int]]:
    """Send ``payload`` to every node in ``nodes`` at once, each within ``timeout`` seconds.

    Args:
        nodes: the nodes to send to (their ``delta_version`` is updated from the answers).
        payload: the version to send.
        headers: the nodes' request headers (their bearer token).
        timeout: seconds one node may take (``--weight-sync-timeout``).
        full: send the full weights even to a node at the delta's base.

    Returns:
        Per node, in order: ``(None or why it failed, path, bytes sent)``; path is ``delta``,
        ``full`` or ``lora``. Nothing is raised for a node that failed.
    """
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False,
                                 headers=headers) as client:
        return list(await asyncio.gather(*(_send(client, n, payload, timeout, full) for n in nodes)))


async def _send(client: Any, node: Node, payload: Payload, timeout: float,
                full: bool = False) -> tuple[str | None, str, int]:
    """Send ``payload`` to one node within ``timeout``: ``(None or why it failed, path, bytes sent)``.

    A delta where the node is at its base (unless ``full``); a refused delta is followed by
    the full weights, with one warning naming the node.
    """
    import httpx

    from atroposlib.inference.weights.delta_sync import warn_full_sync

    sent = 0
    path = "lora" if payload.kind == "lora" else "full"
    try:
        async with asyncio.timeout(timeout):
            at_base = payload.deltas.get(node.dtype)
            if not full and at_base is not None and node.delta_version == at_base[0]:
                body = at_base[1]
                answer = await client.put(
                    f"{node.url}/atropos/weights/delta", params={"version": payload.version},
                    content=body, headers={DIGEST_HEADER: content_digest(body),
                                           "Content-Type": "application/octet-stream"})
                sent += len(body)
                if answer.status_code == 200:
                    node.delta_version = payload.version
                    return None, "delta", sent
                node.delta_version = None
                warn_full_sync(f"inference node {node.url}", payload.version,
                               f"HTTP {answer.status_code}: {answer.text[:300]}")
                if answer.status_code != 409:  # 409: nothing changed there; else it may be broken
                    return f"HTTP {answer.status_code}: {answer.text[:300]}", "delta", sent
            if node.path == "file":  # written once per version, when a node needs them
                await asyncio.to_thread(payload.write_files, node.dtype)
            answer = await _request(client, node, payload)
            sent += len(payload.body(node.dtype)) if node.path == "http" else 0
    except TimeoutError:
        return f"no answer within --weight-sync-timeout {timeout:.0f} s", path, sent
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc or 'connection failed'}", path, sent
    if answer.status_code != 200:
        return f"HTTP {answer.status_code}: {answer.text[:300]}", path, sent
    try:
        ready = bool(answer.json()["update"].get("delta_ready"))
    except (ValueError, KeyError, TypeError, AttributeError):
        ready = False
    node.delta_version = payload.version if ready and payload.kind == "full" else None
    return None, path, sent


def _request(client: Any, node: Node, payload: Payload) -> Any:
    """The full push to one node: a load request (file path) or the safetensors body (http)."""
    if node.path == "file":
        return client.post(f"{node.url}/atropos/weights/load", json={
            "path": str(Path(payload.directory or ".").resolve()), "version": payload.version,
            "kind": payload.kind, "lora_name": payload.lora_name})
    body = payload.body(node.dtype)
    params: dict[str, Any] = {"version": payload.version, "kind": payload.kind}
    if payload.lora_name:
        params["lora_name"] = payload.lora_name
    return client.put(f"{node.url}/atropos/weights", params=params, content=body,
                      headers={DIGEST_HEADER: content_digest(body),
                               "Content-Type": "application/octet-stream"})


__all__ = ["Node", "Payload", "send_all"]
