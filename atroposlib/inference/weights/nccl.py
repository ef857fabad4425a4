"""``--weight-transport nccl``: vLLM's native NCCL weight transfer to inference nodes, on CUDA.

NEVER RUN IN THIS PROJECT: there is no GPU here, and no test covers it. It is written from vLLM
0.32's weight-transfer documentation (``docs/training/weight_transfer``, the
``rlhf_http_nccl`` example) and its source (``vllm/distributed/weight_transfer``), and reviewed
against them; treat it as a starting point and run it on a GPU pair before relying on it. The
HTTP push (:mod:`atroposlib.inference.weights.node_http`) is the tested default.

How it works. vLLM's trainer-side engine (``WeightTransferTrainerFactory.trainer_init`` with
``NCCLTrainerInitInfo``) opens an NCCL group in which the trainer is rank 0 and the node's vLLM
workers are ranks 1..N, and drives each round through a control-plane client: ``start`` ->
``update_weights`` (the workers receive while the trainer broadcasts) -> ``finish``. vLLM serves
those control routes only in its unauthenticated development mode; here the client is
:class:`NodeWeightSyncClient`, which speaks the node's authenticated ``/atropos/nccl/*`` routes
instead, and the node closes its gate and pauses vLLM from ``start`` to ``finish``, so the
policy-version guarantee of the HTTP path holds. One NCCL group per node; nodes are updated one
after another. Requirements: CUDA on the trainer and the nodes, nodes started with
``atropos-inference-node --weight-transfer nccl``, and the trainer's address reachable from
every node on the rendezvous port (``master_address``, found as the local address that routes
to the node).

Failure: a node that fails a round is marked stale and not used again in this run (an NCCL group
that failed mid-broadcast cannot be reused); restart the trainer to bring it back.

Deltas (nodes started with ``--weight-transfer nccl-sparse``, equally NEVER RUN). vLLM 0.32 ships
a sparse NCCL engine (``backend: sparse_nccl``, ``vllm/distributed/weight_transfer/
sparse_nccl_engine.py``): per checkpoint tensor the trainer broadcasts flat int32 indices and
their values, and vLLM's checkpoint-patch loader writes them into its (fused, sharded) runtime
parameters in place. The first round, and every round after the node missed one, carries every
element (indices ``0..n-1``: 3x the bytes of a dense bf16 broadcast); later rounds carry only the
elements that changed since the version the trainer last sent that node
(:func:`sparse_patch_arrays`, against the trainer's :class:`~atroposlib.inference.weights.
delta_sync.DeltaBase`). Unlike the HTTP deltas, nothing checks a checksum on the node: vLLM's
engine applies the patches straight to its parameters and keeps no copy to hash, so a node that
silently lost an update stays wrong until a full round; only a GPU run could show how the
patches, the bytes and the time behave.
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

from atroposlib.errors import InferenceError
from atroposlib.inference.node.models import NodeStatus
from atroposlib.inference.weights.base import WeightTarget

#: Node ``weight_transfer`` values this fleet drives.
NCCL_TRANSFERS = ("nccl", "nccl-sparse")


def sparse_patch_arrays(old: dict[str, Any] | None,
                        new: dict[str, Any]) -> list[tuple[str, Any, Any, tuple[int, ...]]]:
    """The ``(name, int32 flat indices, values, shape)`` patches that turn ``old`` into ``new``.

    Args:
        old: what the node holds (same names, shapes and dtypes as ``new``), or None: every
            element is sent (a full round over the sparse engine).
        new: ``{HF name: tensor}`` in the node's dtype.

    Returns:
        One patch per tensor with a change (per tensor when ``old`` is None), in ``new``'s order;
        indices into the flattened tensor, values of ``new`` there.
    """
    import torch

    from atroposlib.inference.weights.delta import encode_tensor

    patches = []
    for name, tensor in new.items():
        flat = tensor.detach().reshape(-1)
        if old is None:
            indices = torch.arange(flat.numel(), dtype=torch.int32, device=flat.device)
            patches.append((name, indices, flat.contiguous(), tuple(tensor.shape)))
            continue
        entries = encode_tensor(old[name], tensor, "index")
        if entries:
            patches.append((name, entries["i"], entries["v"], tuple(tensor.shape)))
    return patches


class NodeWeightSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol (structural) over one node's ``/atropos/nccl/*`` routes.

    Args:
        root: the node's root URL (no ``/v1``).
        headers: the bearer-token header.
        timeout: seconds per control call.
    """

    def __init__(self, root: str, headers: dict[str, str], timeout: float):
        self.root, self.headers, self.timeout = root, headers, timeout
        self.version = 0  # the policy version ``finish_weight_update`` records

    def _post(self, path: str, body: dict[str, Any] | None = None) -> None:
        import httpx

        answer = httpx.post(f"{self.root}/atropos/nccl/{path}", json=body, headers=self.headers,
                            timeout=self.timeout, trust_env=False)
        if answer.status_code != 200:
            raise InferenceError(f"POST {self.root}/atropos/nccl/{path} answered "
                                 f"{answer.status_code}: {answer.text[:500]}")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Ask the node's workers to join the group (blocks until the trainer joins too)."""
        self._post("init", {"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        """Ask the node's workers to leave the group."""
        self._post("shutdown")

    def start_weight_update(self) -> None:
        """Close the node's gate and start a round."""
        self._post("start")

    def update_weights(self, update_info: Any) -> None:
        """Announce the tensors of the broadcast the trainer sends meanwhile."""
        self._post("update", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """End the round; the node serves it as :attr:`version`."""
        self._post("finish", {"version": self.version})


class _DictSource:
    """A vLLM ``WeightSource`` over the tensors of the current round (replaced before each send)."""

    def __init__(self, device: Any):
        self.device = device
        self.tensors: dict[str, Any] = {}

    def build(self) -> Any:
        from vllm.distributed.weight_transfer import ParamMeta, WeightSource

        outer = self

        class Source(WeightSource):
            def metadata(self) -> list[Any]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in outer.tensors.items()]

            def __iter__(self) -> Any:
                for name, tensor in outer.tensors.items():
                    yield name, tensor.to(outer.device, non_blocking=True)

        return Source()


def _address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent: UDP connect)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))
        return sock.getsockname()[0]


class NcclFleet(WeightTarget):
    """Nodes started with ``--weight-transfer nccl``, updated over NCCL (never run here).

    The same :class:`~atroposlib.inference.weights.base.WeightTarget` as
    :class:`~atroposlib.inference.weights.node_http.NodeFleet`; build it with :meth:`connect`.
    """

    def __init__(self, statuses: list[tuple[str, NodeStatus]], headers: dict[str, str], timeout: float,
                 encoding: str = "auto"):
        from atroposlib.inference.weights.delta_sync import delta_format

        self.statuses, self.headers, self.timeout = statuses, headers, timeout
        self.deltas = delta_format(encoding) is not None
        self._bases: dict[str, Any] = {}  # root -> DeltaBase of what that sparse node holds
        self.engines: dict[str, Any] = {}
        self.clients: dict[str, NodeWeightSyncClient] = {}
        self.stale: set[str] = set()
        self.failures = 0
        self._source: _DictSource | None = None
        self.nodes = [root for root, _ in statuses]

    @classmethod
    def connect(cls, urls: list[str], api_key: str | None, timeout: float,
                encoding: str = "auto") -> NcclFleet:
        """Check that every URL is a node started with ``--weight-transfer nccl`` or ``nccl-sparse``.

        ``encoding`` (``weight_sync_encoding``): ``full`` sends every element to sparse nodes too.

        Raises:
            InferenceError: a URL is not such a node, or CUDA is not available here.
        """
        import httpx
        import torch

        if not torch.cuda.is_available():
            raise InferenceError("--weight-transport nccl needs CUDA on the trainer; use "
                                 "--weight-transport auto (HTTP)")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        statuses = []
        for url in urls:
            root = url.rstrip("/").removesuffix("/v1")
            answer = httpx.get(f"{root}/atropos/status", headers=headers, timeout=30, trust_env=False)
            status = NodeStatus.model_validate(answer.json()) if answer.status_code == 200 else None
            if status is None or status.weight_transfer not in NCCL_TRANSFERS or not status.workers:
                raise InferenceError(f"{root} is not an atropos-inference-node started with "
                                     "--weight-transfer nccl; restart it so, or use "
                                     "--weight-transport auto (HTTP)")
            statuses.append((root, status))
        return cls(statuses, headers, timeout, encoding)

    def _engine(self, root: str, status: NodeStatus) -> Any:
        import torch
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        from atroposlib.inference.vllm_process import find_free_port

        if root not in self.engines:
            if self._source is None:
                self._source = _DictSource(torch.device("cuda", torch.cuda.current_device()))
            host = urlsplit(root).hostname or "127.0.0.1"
            address = _address_towards(host)
            client = NodeWeightSyncClient(root, self.headers, self.timeout)
            self.clients[root] = client
            if status.weight_transfer == "nccl-sparse":
                from vllm.distributed.weight_transfer.sparse_nccl_engine import (
                    SparseNCCLTrainerInitInfo,
                )

                sparse = SparseNCCLTrainerInitInfo(
                    master_address=address, master_port=find_free_port(address),
                    world_size=1 + int(status.workers or 1), rank=0)
                self.engines[root] = WeightTransferTrainerFactory.trainer_init(sparse, client=client)
                return self.engines[root]
            info = NCCLTrainerInitInfo(master_address=address, master_port=find_free_port(address),
                                       world_size=1 + int(status.workers or 1), rank=0)
            self.engines[root] = WeightTransferTrainerFactory.trainer_init(
                info, client=client, source=self._source.build())
        return self.engines[root]

    def push(self, tensors: dict[str, Any], version: int,
             metadata: dict[str, str] | None = None) -> dict[str, float]:
        """Broadcast ``tensors`` (HF names, CUDA or CPU) as ``version`` to every node in turn.

        A node that fails is marked stale for the rest of the run; ``metadata`` is unused
        (model weights only: no LoRA adapters over NCCL).

        Returns:
            ``sync/update_seconds``, ``sync/nodes_ok``, ``sync/nodes_failed`` and the fields
            of :func:`~atroposlib.inference.weights.delta_sync.sync_record` (``delta`` when
            every node that took this round got only the changed elements).
        """
        import time

        import torch

        from atroposlib.inference.weights.delta_sync import tensor_bytes

        begin = time.perf_counter()
        failed = 0
        sent = full_bytes = 0
        paths: set[str] = set()
        fractions: list[float] = []
        for root, status in self.statuses:
            if root in self.stale:
                failed += 1
                self.failures += 1
                continue
            try:
                engine = self._engine(root, status)
                assert self._source is not None
                dtype = getattr(torch, status.dtype)  # the node's dtype: no cast on arrival
                chosen = {n: t.to(dtype) for n, t in tensors.items()}
                full_bytes += tensor_bytes(chosen)
                self.clients[root].version = version
                if status.weight_transfer == "nccl-sparse":
                    send, nbytes, path = self._sparse_round(root, engine, chosen, version, fractions)
                else:
                    self._source.tensors = chosen
                    send, nbytes, path = engine.send_weights, tensor_bytes(chosen), "full"
                done = threading.Thread(target=send, daemon=True)
                done.start()
                done.join(self.timeout)
                if done.is_alive():
                    raise TimeoutError(f"no answer within --weight-sync-timeout {self.timeout:.0f} s")
                sent += nbytes
                paths.add(path)
                if root in self._bases:
                    self._bases[root].commit(chosen, version)
            except Exception as exc:  # noqa: BLE001 - a failed node is reported, training goes on
                failed += 1
                self.failures += 1
                self.stale.add(root)
                self._bases.pop(root, None)
                print(f"[grpo] WARNING: NCCL weight sync to {root} failed ({exc}); it is no longer "
                      "updated in this run. Fix the node and restart the trainer, or use "
                      "--weight-transport auto (HTTP, which re-syncs nodes by itself).",
                      file=sys.stderr, flush=True)
        from atroposlib.inference.weights.delta_sync import sync_record

        seconds = time.perf_counter() - begin
        return {"sync/update_seconds": seconds, "sync/nodes_ok": float(len(self.statuses) - failed),
                "sync/nodes_failed": float(failed),
                **sync_record("delta" if paths == {"delta"} else "full", sent, full_bytes, seconds,
                              sum(fractions) / len(fractions) if fractions else 1.0)}

    def _sparse_round(self, root: str, engine: Any, chosen: dict[str, Any], version: int,
                      fractions: list[float]) -> tuple[Any, int, str]:
        """What one sparse node is sent: ``(callable that sends, bytes, path)``.

        Only the changed elements when the trainer knows what the node holds (it took the
        previous round), every element otherwise.
        """
        from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseWeightPatch

        from atroposlib.inference.weights.delta_sync import DeltaBase

        base = self._bases.get(root)
        held = base.tensors if base is not None and base.matches(chosen) else None
        arrays = sparse_patch_arrays(held, {n: t.to("cpu") for n, t in chosen.items()} if held else chosen)
        if self.deltas:
            self._bases.setdefault(root, DeltaBase("index"))
        device = next(iter(chosen.values())).device if chosen else None
        patches = [SparseWeightPatch(name=n, indices=i.to(device), values=v.to(device), full_shape=s)
                   for n, i, v, s in arrays]
        nbytes = sum(i.numel() * i.element_size() + v.numel() * v.element_size() for _, i, v, _ in arrays)
        if held is not None:
            total = sum(t.numel() for t in chosen.values())
            fractions.append(sum(i.numel() for _, i, _, _ in arrays) / total if total else 0.0)
        client = self.clients[root]

        def send() -> None:
            if patches:
                engine.send_weights(patches)
            else:  # nothing changed: only the version moves
                client.start_weight_update()
                client.finish_weight_update()

        return send, nbytes, "delta" if held is not None else "full"

    def summary(self) -> dict[str, Any]:
        """Weight-sync fields for the run summary."""
        return {"weight_sync_failures": self.failures, "stale_nodes": sorted(self.stale),
                "weight_sync_paths": {root: "nccl" for root, _ in self.statuses}}

    def close(self) -> None:
        """Leave every node's NCCL group."""
        for root, engine in self.engines.items():
            if root in self.stale:
                continue
            try:
                self.clients[root].shutdown_weight_transfer_engine()
                engine.shutdown()
            except Exception as exc:  # noqa: BLE001 - shutting down: report only
                print(f"[grpo] leaving {root}'s NCCL group failed: {exc}", file=sys.stderr, flush=True)


__all__ = ["NCCL_TRANSFERS", "NcclFleet", "NodeWeightSyncClient", "sparse_patch_arrays"]
