"""``PUT /atropos/weights`` (a pushed safetensors body), ``POST /atropos/weights/load`` (a directory on this host) and ``PUT /atropos/weights/delta`` (only the changed elements).

A push is received into the node's weights directory while the old weights keep serving, its
checksum and header are verified, and only then is it applied (:meth:`NodeState.apply`). A
delta is received into memory and applied inside vLLM (:meth:`NodeState.apply_delta`).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, HTTPException, Query, Request

from atroposlib.inference.node.deps import StateDep
from atroposlib.inference.node.models import (
    DIGEST_HEADER,
    LoadWeights,
    WeightsApplied,
    parse_content_digest,
)
from atroposlib.inference.node.payload import (
    Header,
    PayloadError,
    adapter_config,
    check_full_update,
    read_header,
)
from atroposlib.inference.node.state import NodeState

router = APIRouter(prefix="/atropos", tags=["weights"])

#: Bytes of request body gathered before one write + hash in a worker thread.
WRITE_CHUNK_BYTES = 4 * 2**20

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Missing or wrong Content-Digest, or not a safetensors body; nothing "
                         "changed"},
    409: {"description": "A LoRA push to a node whose vLLM runs without --enable-lora"},
    413: {"description": "Body larger than --max-weights-bytes"},
    422: {"description": "Tensors the model does not have, wrong shapes; nothing changed"},
    500: {"description": "vLLM failed to load the update; the detail says what is served now"},
}


def _write(handle: Any, digest: Any, data: bytes) -> None:
    digest.update(data)
    handle.write(data)


async def _receive(request: Request, state: NodeState) -> tuple[Path, bytes, int]:
    """Stream the body into a temporary file of the weights directory; return it, its sha-256, its size."""
    limit = state.settings.max_weights_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise HTTPException(413, f"a push of {int(length)} bytes exceeds --max-weights-bytes "
                                 f"{limit}; raise it on the node")
    state.weights_dir.mkdir(parents=True, exist_ok=True)
    path = state.weights_dir / f".incoming-{uuid.uuid4().hex}"
    digest = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    buffered = 0
    handle = open(path, "wb")  # noqa: SIM115 - closed below, also on error
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"the push exceeds --max-weights-bytes {limit}; raise "
                                         "it on the node")
            pending.append(chunk)
            buffered += len(chunk)
            if buffered >= WRITE_CHUNK_BYTES:
                await to_thread.run_sync(_write, handle, digest, b"".join(pending))
                pending, buffered = [], 0
        if pending:
            await to_thread.run_sync(_write, handle, digest, b"".join(pending))
        handle.close()
    except BaseException:
        handle.close()
        path.unlink(missing_ok=True)
        raise
    return path, digest.digest(), size


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _stage(incoming: Path, header: Header, kind: str, target: Path) -> None:
    """Move a verified push into its own version directory, laid out as vLLM loads it."""
    target.mkdir(parents=True)
    if kind == "lora":
        (target / "adapter_config.json").write_text(adapter_config(header))
        incoming.rename(target / "adapter_model.safetensors")
    else:
        incoming.rename(target / "model.safetensors")


def _verify(incoming: Path, kind: str, state: NodeState) -> Header:
    header = read_header(incoming)
    if kind == "lora":
        adapter_config(header)
    else:
        check_full_update(header, state.base_shapes())
    return header


def _expected_digest(request: Request) -> bytes:
    """The sha-256 the ``Content-Digest`` header promises for the body (RFC 9530).

    Raises:
        HTTPException: 400 when the header is missing or malformed.
    """
    raw_digest = request.headers.get(DIGEST_HEADER)
    if not raw_digest:
        raise HTTPException(400, f"send the body's checksum as '{DIGEST_HEADER}: "
                                 "sha-256=:<base64 of its sha256>:' (RFC 9530)")
    try:
        return parse_content_digest(raw_digest)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _require_lora(state: NodeState, kind: str, lora_name: str | None) -> None:
    if kind != "lora":
        return
    if not lora_name:
        raise HTTPException(422, "kind=lora needs lora_name, the name the adapter is served under")
    if state.engine is not None and not state.engine.lora_enabled:
        raise HTTPException(409, "this node's vLLM runs without LoRA: restart it with "
                                 "`atropos-inference-node ... -- --enable-lora --max-lora-rank R`")


@router.put("/weights", response_model=WeightsApplied, responses=_ERRORS)
async def put_weights(
    request: Request, state: StateDep,
    version: Annotated[int, Query(ge=0, description="Policy version (trainer step) of the weights.")],
    kind: Annotated[Literal["full", "lora"], Query(description="full: model tensors (any "
                                                   "subset); lora: a PEFT adapter")] = "full",
    lora_name: Annotated[str | None, Query(description="kind lora: served adapter name")] = None,
) -> WeightsApplied:
    """Receive weights as a safetensors body and serve them as ``version``.

    The body is ``safetensors.torch.save(tensors)`` (model tensor names, any subset of the
    starting model's); for ``kind=lora`` its metadata carries ``adapter_config.json``. Send
    ``Content-Digest: sha-256=:<base64>:`` (RFC 9530). A body that fails the checksum or the
    checks is refused with 4xx and the previous weights keep serving.
    """
    expected = _expected_digest(request)
    _require_lora(state, kind, lora_name)
    begin = time.perf_counter()
    incoming, received, size = await _receive(request, state)
    target = state.weights_dir / f"v{version}-{uuid.uuid4().hex[:8]}"
    try:
        if received != expected:
            raise PayloadError(
                f"{DIGEST_HEADER} does not match the body: sent sha-256 {_b64(expected)}, received "
                f"{_b64(received)} ({size} bytes); it was damaged or cut short on the way. "
                f"Nothing changed (policy version {state.version}); push again.", 400)
        header = await to_thread.run_sync(_verify, incoming, kind, state)
        await to_thread.run_sync(_stage, incoming, header, kind, target)
    except BaseException:
        incoming.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        raise
    try:
        update = await state.apply(target, version, source="http", kind=kind, lora_name=lora_name,
                                   tensors=len(header.shapes), nbytes=size,
                                   receive_s=time.perf_counter() - begin)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return WeightsApplied(policy_version=update.version, update=update)


async def _receive_bytes(request: Request, state: NodeState) -> tuple[bytes, bytes]:
    """The whole body (a delta is small) and its sha-256, within --max-weights-bytes."""
    limit = state.settings.max_weights_bytes
    digest = hashlib.sha256()
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"the delta exceeds --max-weights-bytes {limit}; raise it on "
                                     "the node")
        digest.update(chunk)
        parts.append(chunk)
    return b"".join(parts), digest.digest()


_DELTA_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Missing or wrong Content-Digest, or not a weight delta; nothing changed"},
    409: {"description": "The node holds another base version, or a result's checksum differs "
                         "from the trainer's (`reason`: base or checksum); nothing changed: push "
                         "the full weights"},
    413: _ERRORS[413],
    500: {"description": "vLLM failed while loading; the node refuses completions until a full "
                         "push succeeds"},
}


@router.put("/weights/delta", response_model=WeightsApplied, responses=_DELTA_ERRORS)
async def put_weights_delta(
    request: Request, state: StateDep,
    version: Annotated[int, Query(ge=0, description="Policy version (trainer step) the delta leads to.")],
) -> WeightsApplied:
    """Apply a weight delta (only the changed elements) in memory and serve ``version``.

    The body is :func:`atroposlib.inference.weights.delta.encode`'s payload: against the version
    the node serves, with the sha-256 of every changed tensor. Each of vLLM's workers applies it
    onto its copy of the tensors it last applied, checks every checksum, and only then loads
    the touched blocks (no file). A node at another base version, or whose result differs from
    the trainer's, answers 409 and keeps serving: the trainer then pushes the full weights
    (``PUT /atropos/weights``).
    """
    from atroposlib.inference.weights.delta import DeltaError, read_header

    expected = _expected_digest(request)
    begin = time.perf_counter()
    body, received = await _receive_bytes(request, state)
    if received != expected:
        raise PayloadError(f"{DIGEST_HEADER} does not match the body (sent sha-256 "
                           f"{_b64(expected)}, received {_b64(received)}, {len(body)} bytes); "
                           f"nothing changed (policy version {state.version}); push again", 400)
    try:
        header = read_header(body)
    except DeltaError as exc:
        raise PayloadError(exc.detail, 400) from None
    if header.version != version:
        raise PayloadError(f"the delta leads to version {header.version}, the query says "
                           f"{version}", 400)
    update = await state.apply_delta(body, version, tensors=len(header.tensors),
                                     receive_s=time.perf_counter() - begin)
    return WeightsApplied(policy_version=update.version, update=update)


def _check_directory(body: LoadWeights, state: NodeState) -> int:
    path = Path(body.path)
    if body.kind == "lora":
        if not (path / "adapter_config.json").is_file():
            raise PayloadError(f"{path} holds no adapter_config.json (kind lora)")
        return len(read_header(path / "adapter_model.safetensors").shapes)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise PayloadError(f"{path} is not a directory with *.safetensors files this node can read")
    tensors = 0
    for file in files:
        header = read_header(file)
        check_full_update(header, state.base_shapes())
        tensors += len(header.shapes)
    return tensors


@router.post("/weights/load", response_model=WeightsApplied, responses=_ERRORS)
async def load_weights(body: LoadWeights, state: StateDep) -> WeightsApplied:
    """Serve weights from a directory on this host as ``version`` (the same-host fast path).

    The directory stays the caller's: the node reads it and never deletes it.
    """
    _require_lora(state, body.kind, body.lora_name)
    tensors = await to_thread.run_sync(_check_directory, body, state)
    update = await state.apply(Path(body.path), body.version, source="path", kind=body.kind,
                               lora_name=body.lora_name, tensors=tensors)
    return WeightsApplied(policy_version=update.version, update=update)
