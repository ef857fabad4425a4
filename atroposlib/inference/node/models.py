"""Wire types of the inference node's own routes, shared by the node and the trainer's pusher.

Routes (all under ``/atropos/``, bearer token as for the OpenAI routes):

* ``GET  /atropos/status`` -> :class:`NodeStatus`
* ``POST /atropos/probe`` :class:`PathProbe` -> :class:`PathProbeResult`
* ``PUT  /atropos/weights?version=N[&kind=lora&lora_name=X]`` body: a safetensors file,
  header ``Content-Digest: sha-256=:<base64>:`` -> :class:`WeightsApplied`
* ``POST /atropos/weights/load`` :class:`LoadWeights` -> :class:`WeightsApplied`
* ``PUT  /atropos/weights/delta?version=N`` body: a weight delta
  (:mod:`atroposlib.inference.weights.delta`), header ``Content-Digest`` -> :class:`WeightsApplied`;
  409 (nothing changed) when the node holds another base version or a checksum differs
* ``POST /atropos/nccl/{init,start,update,finish,shutdown}`` (``--weight-transfer nccl`` only)

Every completion the node serves carries ``X-Atropos-Policy-Version: N``, the version of the
weights that produced it.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.inference.policy_version import POLICY_VERSION_HEADER

#: Request header carrying the payload's checksum, in RFC 9530 form ``sha-256=:<base64>:``.
DIGEST_HEADER = "Content-Digest"
#: safetensors metadata key holding a LoRA adapter's ``adapter_config.json`` (``kind=lora``).
ADAPTER_CONFIG_KEY = "atropos.adapter_config"
#: Prefix of the files a trainer may ask the node to read in :class:`PathProbe`.
PROBE_PREFIX = ".atropos-probe-"

#: What a node is doing: no weights yet, serving, applying an update, or broken (refusing).
ServingState = Literal["awaiting_weights", "serving", "applying", "failed"]
#: How weights reached the node.
WeightsSource = Literal["base", "http", "path", "nccl", "delta"]


def content_digest(payload: bytes) -> str:
    """The ``Content-Digest`` header value of ``payload``: ``sha-256=:<base64 of sha256>:`` (RFC 9530)."""
    return f"sha-256=:{base64.b64encode(hashlib.sha256(payload).digest()).decode()}:"


def parse_content_digest(value: str) -> bytes:
    """The raw sha-256 digest named by a ``Content-Digest`` header.

    Args:
        value: the header, e.g. ``sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:``
            (other algorithms in the same header are ignored).

    Raises:
        ValueError: no well-formed ``sha-256`` member.
    """
    for member in value.split(","):
        name, _, item = member.strip().partition("=")
        if name.strip().lower() != "sha-256":
            continue
        item = item.strip()
        if len(item) < 2 or item[0] != ":" or item[-1] != ":":
            break
        try:
            digest = base64.b64decode(item[1:-1], validate=True)
        except ValueError:
            break
        if len(digest) == 32:
            return digest
        break
    raise ValueError(f"{DIGEST_HEADER} must be 'sha-256=:<base64 of the 32-byte sha256>:' "
                     f"(RFC 9530), got {value[:120]!r}")


class LastUpdate(BaseModel):
    """The newest update the node applied."""

    version: int = Field(description="Policy version (trainer step) now served.")
    source: WeightsSource = Field(description="base (the starting model), http (pushed), path "
                                  "(read from a directory on this host), nccl, or delta (only "
                                  "the changed elements, applied in memory).")
    kind: Literal["full", "lora"] = Field(default="full", description="Model tensors or a LoRA "
                                          "adapter.")
    tensors: int = Field(default=0, description="Tensors in the update.")
    bytes: int = Field(default=0, description="Bytes received (0 when read from a path).")
    receive_seconds: float = Field(default=0.0, description="Receiving, checksumming and "
                                   "checking the body (0 when read from a path).")
    drain_seconds: float = Field(default=0.0, description="Waiting for completions in flight.")
    apply_seconds: float = Field(default=0.0, description="vLLM loading the weights.")
    delta_ready: bool = Field(default=False, description="The node can take the next push as a "
                              "delta against this version (its vLLM runs atroposlib's worker "
                              "extension, which keeps the pushed tensors).")


class NodeStatus(BaseModel):
    """``GET /atropos/status``: what the node serves and where it runs."""

    state: ServingState
    policy_version: int | None = Field(description="Version of the weights served; null until "
                                       "a trainer pushed weights (or --serve-base).")
    model: str = Field(description="The starting model (path or hub id).")
    served_model_name: str
    dtype: str = Field(description="vLLM's dtype, e.g. bfloat16; pushes should use it.")
    hostname: str
    boot_id: str = Field(description="This host's boot id (with hostname: same machine?).")
    weight_transfer: Literal["http", "nccl", "nccl-sparse"]
    workers: int | None = Field(default=None, description="vLLM's worker processes (tensor x "
                                "pipeline x data parallel): an NCCL weight transfer group has "
                                "these plus the trainer's sender.")
    lora_enabled: bool = Field(description="vLLM was started with --enable-lora.")
    in_flight: int = Field(description="Completions being served now.")
    last_update: LastUpdate | None = None
    last_error: str | None = Field(default=None, description="Why the last update failed, if it did.")


class PathProbe(BaseModel):
    """``POST /atropos/probe``: can the node read this file, and does it hold ``content``?"""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description=f"Absolute path of a file named {PROBE_PREFIX}*.")
    content: str = Field(max_length=256, description="What the trainer wrote into it.")


class PathProbeResult(BaseModel):
    """Whether the node sees the trainer's file (then both share that directory)."""

    readable: bool
    matches: bool


class LoadWeights(BaseModel):
    """``POST /atropos/weights/load``: apply weights from a directory the node can read."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Directory holding *.safetensors (kind full) or an adapter "
                      "(adapter_config.json + adapter_model.safetensors, kind lora).")
    version: int = Field(ge=0, description="Policy version (trainer step) of these weights.")
    kind: Literal["full", "lora"] = "full"
    lora_name: str | None = Field(default=None, description="kind lora: the adapter's served name.")


class WeightsApplied(BaseModel):
    """The answer to a weight update: what the node serves now."""

    policy_version: int
    update: LastUpdate


class NcclInit(BaseModel):
    """``POST /atropos/nccl/init``: vLLM's ``init_weight_transfer_engine`` payload."""

    init_info: dict[str, Any]


class NcclUpdate(BaseModel):
    """``POST /atropos/nccl/update``: vLLM's ``update_weights`` payload (names, dtypes, shapes)."""

    update_info: dict[str, Any] | list[dict[str, Any]]


class NcclFinish(BaseModel):
    """``POST /atropos/nccl/finish``: the broadcast is complete; serve it as ``version``."""

    version: int = Field(ge=0)


__all__ = [
    "ADAPTER_CONFIG_KEY",
    "DIGEST_HEADER",
    "POLICY_VERSION_HEADER",
    "PROBE_PREFIX",
    "LastUpdate",
    "LoadWeights",
    "NcclFinish",
    "NcclInit",
    "NcclUpdate",
    "NodeStatus",
    "PathProbe",
    "PathProbeResult",
    "ServingState",
    "WeightsApplied",
    "WeightsSource",
    "content_digest",
    "parse_content_digest",
]
