"""Keep every inference node (``atropos-inference-node``) on the trainer's weights, with no shared disk needed.

Per node, one of two paths, chosen once and logged:

* **file** (fast path): the node runs on this host (same hostname and boot id) and reads a probe
  file the trainer wrote into its run directory. The trainer writes safetensors there and the
  node loads them (``POST /atropos/weights/load``), as a trainer-owned vLLM does.
* **http**: otherwise. The trainer sends the tensors as one safetensors body with its sha-256
  (``PUT /atropos/weights``), in the node's dtype, to all such nodes at once.

Failure: each node gets ``timeout`` seconds per sync (upload, drain, load). A node that misses it,
or refuses, is marked stale and named in ONE warning with the fix; every sync it misses is
counted (``sync/nodes_failed``, the summary's ``weight_sync_failures``). Training never waits
for it again: a watcher thread polls stale nodes and re-sends the current weights as soon as one
answers (a restarted node refuses completions until then).

Public API: :meth:`NodeFleet.connect` then :meth:`NodeFleet.push` per policy version, then
:meth:`NodeFleet.close`; any trainer can push to nodes this way (see the inference-node guide,
"Push from your own trainer").
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from atroposlib.errors import InferenceError
from atroposlib.inference.node.models import (
    ADAPTER_CONFIG_KEY,
    PROBE_PREFIX,
    NodeStatus,
)
from atroposlib.inference.weights.base import WeightTarget
from atroposlib.inference.weights.node_send import Node, Payload, send_all

#: Seconds between two looks at the stale nodes.
WATCH_INTERVAL_S = 2.0
#: Seconds a status probe of a stale node may take.
PROBE_TIMEOUT_S = 5.0


def _log(message: str) -> None:
    print(f"[grpo] {message}", flush=True)


class NodeFleet(WeightTarget):
    """A trainer's inference nodes: discovery, concurrent pushes, stale tracking, re-sync.

    Args:
        nodes: the nodes (see :meth:`connect` and :meth:`discover`).
        api_key: their bearer token (None: none).
        timeout: seconds one node may take per sync (``--weight-sync-timeout``).
        weights_dir: where ``file``-path nodes read the weights (None: no node reads files).
        lora_name: push a LoRA adapter served under this name instead of model weights.
    """

    def __init__(self, nodes: list[Node], api_key: str | None, timeout: float,
                 weights_dir: Path | None = None, lora_name: str | None = None,
                 encoding: str = "auto"):
        if weights_dir is None and any(n.path == "file" for n in nodes):
            raise ValueError("file-path nodes need weights_dir, the directory they read")
        self.nodes = nodes
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.lora_name = lora_name
        self.directory = None if weights_dir is None else (
            Path(weights_dir) / "adapter" if lora_name else Path(weights_dir))
        self.version: int | None = None
        from atroposlib.inference.weights.delta_sync import delta_format

        #: the delta format (None: full pushes only, as for LoRA adapters)
        self.delta_format = None if lora_name else delta_format(encoding)
        self._bases: dict[str, Any] = {}  # node dtype -> DeltaBase (what the nodes last applied)
        self._last: Payload | None = None
        self._payload_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ discovery
    @classmethod
    def connect(cls, urls: list[str], api_key: str | None = None, *, timeout: float = 120.0,
                weights_dir: Path | None = None, lora_name: str | None = None,
                encoding: str = "auto") -> NodeFleet:
        """Reach ``atropos-inference-node`` nodes, ready to :meth:`push` to.

        Args:
            urls: the nodes' URLs (``http://host:port``, with or without ``/v1``).
            api_key: their bearer token (the node's ``--api-key``); None: none.
            timeout: seconds one node may take per push (upload, drain, load).
            weights_dir: a directory of this host: nodes on this host that can read it get the
                weights as a file there instead of over HTTP. None: every node over HTTP.
            lora_name: push LoRA adapters (nodes started with ``--enable-lora``), served under
                this name; None: model weights.
            encoding: ``weight_sync_encoding``: ``auto`` / ``index`` / ``xor`` send a node at
                the trainer's base version only the changed elements; ``full`` never.

        Raises:
            InferenceError: a URL is not a node (it answers no ``GET /atropos/status``), runs
                without LoRA though ``lora_name`` is set, refused the key or did not answer.
        """
        fleet, plain = cls.discover(urls, api_key, timeout, weights_dir, "auto", lora_name, encoding)
        if plain or fleet is None:
            raise InferenceError(f"{', '.join(plain) or 'no URL'}: not an atropos-inference-node "
                                 "(no GET /atropos/status); start one with `atropos-inference-node`")
        without = [n.url for n in fleet.nodes if not n.lora_enabled]
        if lora_name and without:
            raise InferenceError(f"the nodes {', '.join(without)} run vLLM without LoRA; start them "
                                 "with `atropos-inference-node ... -- --enable-lora --max-lora-rank R`")
        return fleet

    @classmethod
    def discover(cls, urls: list[str], api_key: str | None, timeout: float, weights_dir: Path | None,
                 transport: str = "auto", lora_name: str | None = None,
                 encoding: str = "auto") -> tuple[NodeFleet | None, list[str]]:
        """:func:`find_nodes`, the nodes as a fleet: ``(fleet or None, plain vLLM URLs)``.

        Raises:
            InferenceError: as :func:`find_nodes`.
        """
        nodes, plain = find_nodes(urls, api_key, weights_dir, transport)
        return (cls(nodes, api_key, timeout, weights_dir, lora_name, encoding) if nodes else None), plain

    # ------------------------------------------------------------------ pushing
    def push(self, tensors: dict[str, Any], version: int,
             metadata: dict[str, str] | None = None) -> dict[str, float]:
        """Send ``tensors`` as ``version`` to every node that is not stale, concurrently.

        Args:
            tensors: ``{HF name: torch.Tensor}``, any subset of the nodes' model (e.g. the
                blocks training changes, see :mod:`atroposlib.inference.weights.select`), any
                dtype and device: cast to each node's dtype and serialized here. With
                ``lora_name``: the adapter's tensors under peft's names.
            version: the policy version (trainer step, int); the nodes tag completions with it.
            metadata: with ``lora_name``: ``{ADAPTER_CONFIG_KEY: adapter_config.json text}``
                (see :func:`adapter_metadata`); else None.

        A node known to hold the version the trainer last pushed gets a delta (only the changed
        elements, ``PUT /atropos/weights/delta``); one that refuses it (another base, a checksum
        mismatch) is named in one warning and sent the full weights in the same push.

        Returns:
            ``sync/update_seconds``, ``sync/bytes_sent``, ``sync/nodes_ok``,
            ``sync/nodes_failed`` (nodes without this version: failed now or still stale) and
            the fields of :func:`~atroposlib.inference.weights.delta_sync.sync_record`
            (``sync/path``: ``delta`` when every node got one, ``full`` or ``lora``).
            A node that failed is warned about once and re-sent the weights by a background
            watcher when it answers again; nothing is raised for it.

        Raises:
            ValueError: ``lora_name`` is set and ``metadata`` carries no adapter config.
        """
        from atroposlib.inference.weights.delta_sync import DeltaBase
        from atroposlib.inference.weights.select import select, unique_storage

        kind: Literal["full", "lora"] = "lora" if self.lora_name else "full"
        if kind == "lora" and ADAPTER_CONFIG_KEY not in (metadata or {}):
            raise ValueError(f"a LoRA push needs metadata={{{ADAPTER_CONFIG_KEY!r}: adapter_config.json "
                             "text}; see adapter_metadata()")
        begin_all = time.perf_counter()
        unique = unique_storage(tensors)
        selected: dict[str, dict[str, Any]] = {}
        for dtype in sorted({n.dtype for n in self.nodes}):
            # LoRA adapters keep their own dtype (peft's), as before
            selected[dtype] = select(unique, list(unique), None if kind == "lora" else dtype)
        payload = Payload(version, kind, self.lora_name, selected, self.directory, len(tensors),
                          metadata)
        fractions = []
        checksums: dict[str, dict[str, str]] = {}
        for dtype, chosen in selected.items():
            base = self._bases.get(dtype)
            if self.delta_format and base is not None and base.matches(chosen) and any(
                    n.delta_version == base.version for n in self.nodes if n.dtype == dtype):
                body, stats = base.encode(chosen, version)
                payload.deltas[dtype] = (base.version, body)
                fractions.append(stats.changed_fraction)
                checksums[dtype] = stats.checksums
        with self._payload_lock:
            self._last, self.version = payload, version
        # stale nodes get this version from the watcher once they answer; a node the watcher
        # is re-sending to right now is waited for (within the timeout)
        begin = time.perf_counter()
        targets = []
        for node in self.nodes:
            wait = max(0.0, self.timeout - (time.perf_counter() - begin))
            if not node.stale and node.lock.acquire(timeout=wait):
                targets.append(node)
        try:
            results = asyncio.run(send_all(targets, payload, self.headers, self.timeout)) if targets else []
        finally:
            for node in targets:
                node.lock.release()
        seconds = time.perf_counter() - begin
        sent = full_bytes = 0
        paths = set()
        for node, (error, path, nbytes) in zip(targets, results, strict=True):
            sent += nbytes
            full_bytes += sum(t.numel() * t.element_size() for t in selected[node.dtype].values())
            if error is None:
                paths.add(path)
            else:
                self._mark_stale(node, version, error)
        for dtype, chosen in selected.items():  # what the nodes of each dtype hold now
            if self.delta_format and any(n.delta_version == version for n in self.nodes if n.dtype == dtype):
                self._bases.setdefault(dtype, DeltaBase(self.delta_format)).commit(
                    chosen, version, checksums.get(dtype))
            else:
                self._bases.pop(dtype, None)
        for node in self.nodes:
            if node.stale and node not in targets:
                node.failures += 1  # skipped while stale: this sync did not land there either
        failed = len(self.nodes) - len(targets) + sum(r[0] is not None for r in results)
        self._ensure_watcher()
        from atroposlib.inference.weights.delta_sync import sync_record

        path = "lora" if kind == "lora" else "delta" if paths == {"delta"} else "full"
        fraction = sum(fractions) / len(fractions) if fractions else 1.0
        return {"sync/update_seconds": seconds, "sync/bytes_sent": float(sent),
                "sync/nodes_ok": float(len(self.nodes) - failed), "sync/nodes_failed": float(failed),
                **sync_record(path, sent, full_bytes, time.perf_counter() - begin_all, fraction)}

    def _mark_stale(self, node: Node, version: int, reason: str, count: bool = True) -> None:
        if count:
            node.failures += 1
        if node.stale:
            return
        node.stale = True
        print(f"[grpo] WARNING: inference node {node.url} missed the weight sync to policy version "
              f"{version} ({reason}). It is marked stale and skipped until it answers again; then it "
              "gets the current weights (a restarted node refuses completions until it has them). "
              f"Fix: check that atropos-inference-node runs there (curl {node.url}/atropos/status)"
              f", or raise --weight-sync-timeout (now {self.timeout:.0f} s) if it is only slow.",
              file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ re-sync
    def _ensure_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="node-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Every few seconds: any node not on the current version (stale, or restarted) is re-sent it."""
        while not self._stop.wait(WATCH_INTERVAL_S):
            for node in self.nodes:
                if self._stop.is_set():
                    return
                try:
                    self.resync(node)
                except Exception as exc:  # noqa: BLE001 - the watcher must outlive one bad probe
                    print(f"[grpo] re-sync of {node.url} failed: {exc}", file=sys.stderr, flush=True)

    def resync(self, node: Node) -> bool:
        """Check one node; if it answers without the current version, send it. True when current.

        A stale node is sent the weights as soon as it answers. A node that restarted between
        two syncs (it awaits weights) is caught here too, so it never waits for the next
        training step to serve again.
        """
        import httpx

        with self._payload_lock:
            payload = self._last
        if payload is None:
            return True
        try:
            answer = httpx.get(f"{node.url}/atropos/status", headers=self.headers,
                               timeout=PROBE_TIMEOUT_S, trust_env=False)
            status = NodeStatus.model_validate(answer.json()) if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            status = None
        if status is None or status.state == "applying":
            return False
        behind = status.policy_version != payload.version or status.state != "serving"
        if behind and not node.stale and status.state == "serving":
            return False  # an older version on a node that is not stale: a push is under way
        if not node.lock.acquire(blocking=False):  # a push to it is in flight
            return False
        try:
            with self._payload_lock:
                payload = self._last or payload
            begin = time.perf_counter()
            if behind:
                if not node.stale:
                    _log(f"inference node {node.url} serves version {status.policy_version} "
                         f"({status.state}), not {payload.version}: it restarted? re-sending")
                # maybe restarted in another dtype: any of the payload's will do
                node.dtype = status.dtype if status.dtype in payload.selected else next(iter(payload.selected))
                error = asyncio.run(send_all([node], payload, self.headers, self.timeout, full=True))[0][0]
                if error is not None:
                    self._mark_stale(node, payload.version, error, count=False)
                    return False
            with self._payload_lock:
                if self._last is not payload:  # a newer version was pushed meanwhile: again
                    return False
                was_stale, node.stale = node.stale, False
            if was_stale:
                _log(f"inference node {node.url} is back: re-sent policy version {payload.version} "
                     f"({time.perf_counter() - begin:.1f} s); it serves again")
            return True
        finally:
            node.lock.release()

    def summary(self) -> dict[str, Any]:
        """What the run summary reports about the nodes.

        Returns:
            ``weight_sync_failures`` (node-syncs that did not land), ``stale_nodes`` (URLs
            still stale) and ``weight_sync_paths`` (URL -> ``file`` or ``http``).
        """
        return {"weight_sync_failures": sum(n.failures for n in self.nodes),
                "stale_nodes": [n.url for n in self.nodes if n.stale],
                "weight_sync_paths": {n.url: n.path for n in self.nodes}}

    def close(self) -> None:
        """Stop the re-sync watcher (a re-send still in flight is left to end with the process)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(PROBE_TIMEOUT_S)
            self._watcher = None


def find_nodes(urls: list[str], api_key: str | None, weights_dir: Path | None,
               transport: str = "auto") -> tuple[list[Node], list[str]]:
    """Split ``urls`` into inference nodes and plain vLLM servers; choose each node's path.

    A node on this host (same hostname and boot id) that can read a probe file written into
    ``weights_dir`` gets the ``file`` path; every other node ``http``. The choice is logged.

    Args:
        urls: OpenAI base URLs (``http://host:port/v1``) or root URLs.
        api_key: the nodes' bearer token.
        weights_dir: the trainer's directory for weights (file-path nodes read it); None:
            every node over HTTP.
        transport: ``auto`` (file path where possible, else http) or ``http`` (always push).

    Returns:
        ``(nodes, plain vLLM URLs)`` (those answering 404 on ``GET /atropos/status``).

    Raises:
        InferenceError: a server did not answer, a node refused the API key or answered its
            status route oddly.
    """
    import httpx

    nodes: list[Node] = []
    plain: list[str] = []
    if weights_dir is None:
        transport = "no weights_dir"
    probe = Path(weights_dir or ".") / f"{PROBE_PREFIX}{secrets.token_hex(8)}"
    token = secrets.token_hex(16)
    if transport == "auto":
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    here = (socket.gethostname(), _boot_id())
    try:
        with httpx.Client(timeout=30.0, trust_env=False, headers=headers) as client:
            for url in urls:
                root = url.rstrip("/").removesuffix("/v1")
                try:
                    answer = client.get(f"{root}/atropos/status")
                except httpx.HTTPError as exc:
                    raise InferenceError(f"inference server {root} stopped answering "
                                         f"({type(exc).__name__}: {exc}); is it running?") from exc
                if answer.status_code == 404:
                    plain.append(url)
                    continue
                if answer.status_code in (401, 403):
                    raise InferenceError(
                        f"inference node {root} refused the API key (HTTP {answer.status_code});"
                        " pass the node's key (api_key; the trainer's --vllm-api-key or $ATROPOS_API_KEY)")
                if answer.status_code != 200:
                    raise InferenceError(f"GET {root}/atropos/status answered "
                                         f"{answer.status_code}: {answer.text[:300]}")
                status = NodeStatus.model_validate(answer.json())
                same_host = (status.hostname, status.boot_id) == here
                reads = transport == "auto" and same_host and client.post(
                    f"{root}/atropos/probe", json={"path": str(probe.resolve()),
                                                   "content": token}).json().get("matches")
                nodes.append(Node(root, "file" if reads else "http", status.dtype,
                                  status.lora_enabled))
                if reads:
                    why = "same host, reads the run directory -> weights by local file"
                else:
                    where = ("--weight-transport http" if transport == "http" else
                             transport if transport != "auto" else
                             "same host but the run directory is hidden from it" if same_host
                             else "another host")
                    why = f"{where} -> weights pushed over HTTP in {status.dtype}"
                _log(f"inference node {root}: {why}")
    finally:
        probe.unlink(missing_ok=True)
    return nodes, plain


def _boot_id() -> str:
    from atroposlib.inference.node.state import boot_id

    return boot_id()


def adapter_metadata(adapter_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors and body metadata of a LoRA push, from an adapter saved with ``save_pretrained``."""
    from safetensors.torch import load_file

    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return tensors, {ADAPTER_CONFIG_KEY: (adapter_dir / "adapter_config.json").read_text()}


__all__ = ["Node", "NodeFleet", "Payload", "adapter_metadata", "find_nodes"]
