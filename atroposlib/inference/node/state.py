"""NodeState: the policy version a node serves, the gate in front of vLLM, and applying updates atomically.

An update never overlaps a completion. While one is applied the gate is closed: new completions
wait at the node, the ones in flight finish on the old weights (or are aborted after
``drain_timeout_s``), vLLM is paused (nothing scheduled), the weights are loaded, the prefix
cache dropped, and only then the version changes and the gate opens. So the version a request
was admitted under is exactly the version of the weights that served it, which is what the
``X-Atropos-Policy-Version`` header reports.

If vLLM fails while loading, the node puts the last good weights back (the starting model, then
the last pushed directory) and keeps serving them; if even that fails it refuses completions
until a push succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from atroposlib.errors import AtroposError
from atroposlib.inference.node.gate import ABORT_GRACE_S, Gate  # noqa: F401 - importable from here as before
from atroposlib.inference.node.models import LastUpdate, NodeStatus, ServingState, WeightsSource
from atroposlib.inference.node.restore import roll_back
from atroposlib.inference.node.settings import NodeSettings
from atroposlib.inference.weights.delta import DeltaError

logger = logging.getLogger("atroposlib.inference.node")


class DeltaRefused(DeltaError):
    """A weight delta does not apply on this node (HTTP 409); nothing changed.

    The node's side of :class:`~atroposlib.inference.weights.delta.DeltaError`: vLLM's workers
    turn the ``DeltaError`` they hit into an answer (``reason`` ``base``, ``checksum`` or
    ``payload``, and ``detail``), and :meth:`NodeState.apply_delta` raises it again as this
    subclass, which the node's app answers with 409. So ``except DeltaError`` catches both, and
    only a refusal from vLLM's workers becomes a 409.
    """


class UpdateFailed(AtroposError):
    """vLLM failed to apply an update (HTTP 500); ``detail`` says what the node serves now."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def boot_id() -> str:
    """This host's boot id (Linux); with the hostname it tells whether two processes share a machine."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class NodeState:
    """What one node serves, and the only way its weights change.

    Args:
        settings: the node's settings (``weights_dir`` must be set).
        engine: the vLLM engine calls (a :class:`~atroposlib.inference.node.engine.VLLMEngine`);
            None until :meth:`bind` sees the first request.
    """

    def __init__(self, settings: NodeSettings, engine: Any = None):
        if settings.weights_dir is None:
            raise ValueError("NodeSettings.weights_dir must be set (atropos-inference-node sets it)")
        self.settings = settings
        self.weights_dir = Path(settings.weights_dir)
        self.engine = engine
        self.hostname = socket.gethostname()
        self.boot_id = boot_id()
        base = settings.serve_base
        self.state: ServingState = "serving" if base else "awaiting_weights"
        self.version: int | None = 0 if base else None
        self.last_update: LastUpdate | None = LastUpdate(version=0, source="base") if base else None
        self.last_error: str | None = None
        self._gate = Gate()
        #: updates by outcome (``applied`` / ``failed``) and bytes received, for GET /atropos/metrics
        self.updates: Counter[str] = Counter()
        self.bytes_received = 0
        self._owned: dict[str, Path] = {}  # kind -> pushed directory now served (node-owned)
        self._base_shapes: dict[str, tuple[int, ...]] | None | Literal[False] = False  # False: unread
        self._lock: asyncio.Lock | None = None  # one update at a time

    # ------------------------------------------------------------------ wiring
    def bind(self, app: Any) -> None:
        """Attach vLLM's app (its ``state`` holds the engine client) on the first request."""
        if self.engine is None and app is not None:
            from atroposlib.inference.node.engine import VLLMEngine

            self.engine = VLLMEngine(app.state)

    def _sync(self) -> None:
        if self._lock is None:  # created inside the server's event loop
            self._lock = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        """Completions being served now (let through the gate, not yet answered completely)."""
        return self._gate.in_flight

    def base_shapes(self) -> dict[str, tuple[int, ...]] | None:
        """Tensor shapes of the starting model (read once; None: not a local directory)."""
        if self._base_shapes is False:
            from atroposlib.inference.node.payload import model_tensor_shapes

            self._base_shapes = model_tensor_shapes(self.settings.model or "")
        return self._base_shapes

    def status(self) -> NodeStatus:
        """The ``GET /atropos/status`` answer."""
        engine = self.engine
        return NodeStatus(
            state=self.state, policy_version=self.version, model=self.settings.model or "",
            served_model_name=self.settings.served_model_name,
            dtype=engine.dtype if engine is not None else self.settings.dtype,
            hostname=self.hostname, boot_id=self.boot_id,
            weight_transfer=self.settings.weight_transfer,
            workers=engine.workers if engine is not None else None,
            lora_enabled=bool(engine is not None and engine.lora_enabled),
            in_flight=self.in_flight, last_update=self.last_update, last_error=self.last_error)

    # ------------------------------------------------------------------ the gate
    async def admit(self) -> int | None:
        """Let one completion through; return the policy version serving it, or None to refuse.

        Waits while an update is applied. Refuses (None) while the node has no weights or is
        broken. Every admitted completion must be followed by :meth:`release`.
        """
        await self._gate.wait_open()
        if self.state != "serving" or self.version is None:
            return None
        self._gate.enter()
        return self.version

    def release(self) -> None:
        """One admitted completion has been answered completely."""
        self._gate.leave()

    async def _close_and_drain(self) -> float:
        """Close the gate, wait for the completions in flight, pause vLLM; return the seconds."""
        self.state = "applying"
        return await self._gate.close_and_drain(self.engine, self.settings.drain_timeout_s)

    # ------------------------------------------------------------------ updates
    async def apply(self, directory: Path, version: int, *, source: WeightsSource,
                    kind: Literal["full", "lora"] = "full", lora_name: str | None = None,
                    tensors: int = 0, nbytes: int = 0, receive_s: float = 0.0) -> LastUpdate:
        """Serve the weights in ``directory`` as ``version``, atomically (see the module doc).

        Args:
            directory: ``*.safetensors`` (kind full; may hold only some tensors) or a PEFT
                adapter directory (kind lora).
            version: the policy version (trainer step) of these weights.
            source: how they arrived (``http`` pushes are owned by the node and deleted when
                replaced; ``path`` directories belong to the trainer).
            kind: ``full`` model tensors or a ``lora`` adapter.
            lora_name: kind lora: the name the adapter is served under.
            tensors: number of tensors, for the status.
            nbytes: bytes received, for the status.
            receive_s: seconds spent receiving and checking them, for the status.

        Returns:
            The update now served.

        Raises:
            UpdateFailed: vLLM failed to load them (the message says what is served now).
        """
        async with self._drained() as (previous_state, drain_s):
            begin = time.perf_counter()
            delta_ready = False
            try:
                if kind == "lora":
                    await self.engine.load_lora(lora_name or "", directory)
                else:
                    await self.engine.reload(directory)
                    # the next push may be a delta against exactly these tensors
                    delta_ready = await self.engine.delta_seed(directory, version)
                await self.engine.reset_prefix_cache()
                await self.engine.set_weight_version(version)
            except Exception as exc:  # noqa: BLE001 - any engine failure: roll back, report
                self.updates["failed"] += 1
                if kind != "lora":
                    await self.engine.delta_reset()
                detail = await self._roll_back(previous_state, kind, exc)
                raise UpdateFailed(detail) from exc
            finally:
                await self._resume()
            return self._finish(LastUpdate(
                version=version, source=source, kind=kind, tensors=tensors, bytes=nbytes,
                receive_seconds=receive_s, drain_seconds=drain_s,
                apply_seconds=time.perf_counter() - begin, delta_ready=delta_ready),
                directory if source == "http" else None)

    async def apply_delta(self, payload: bytes, version: int, *, tensors: int = 0,
                          receive_s: float = 0.0) -> LastUpdate:
        """Apply a weight delta (only the changed elements) in vLLM's memory and serve ``version``.

        The gate closes as for :meth:`apply`. Every worker applies the delta onto its copy of the
        tensors it last applied, checks each result's sha-256 against the trainer's, and only
        then loads the touched blocks; the version flips after all of that.

        Raises:
            DeltaRefused: the node holds another base version, or a checksum differs (nothing
                changed; the node keeps serving its version: push the full weights).
            UpdateFailed: vLLM failed while loading (the node refuses completions until a full
                push succeeds: the weights may be half-written and no file restores them).
        """
        async with self._drained() as (previous_state, drain_s):
            begin = time.perf_counter()
            try:
                answer = await self.engine.delta_apply(payload)
                if answer.get("applied"):
                    await self.engine.reset_prefix_cache()
                    await self.engine.set_weight_version(version)
            except Exception as exc:  # noqa: BLE001 - a failed load: nothing restores it
                self.updates["failed"] += 1
                await self.engine.delta_reset()
                self.state = "failed"
                self.last_error = f"a weight delta failed while loading ({type(exc).__name__}: {exc})"
                self._gate.open()
                raise UpdateFailed(f"{self.last_error}; the node refuses completions until a "
                                   "full push succeeds") from exc
            finally:
                await self._resume()
            if not answer.get("applied"):
                self.state = previous_state
                self._gate.open()
                raise DeltaRefused(str(answer.get("reason", "unknown")),
                                   f"{answer.get('detail', 'refused')}; nothing changed (policy "
                                   f"version {self.version}): push the full weights")
            return self._finish(LastUpdate(
                version=version, source="delta", tensors=tensors, bytes=len(payload),
                receive_seconds=receive_s, drain_seconds=drain_s,
                apply_seconds=time.perf_counter() - begin, delta_ready=True), None)

    @contextlib.asynccontextmanager
    async def _drained(self) -> AsyncIterator[tuple[ServingState, float]]:
        """Hold the update lock with the gate closed and vLLM paused (:meth:`_close_and_drain`).

        Yields:
            ``(the state before, seconds the drain took)``. The block resumes vLLM
            (:meth:`_resume`) and reports (:meth:`_finish`) itself, all under the lock, so no
            other update starts between loading the weights and flipping the version.
        """
        self._sync()
        assert self._lock is not None
        async with self._lock:
            previous_state = self.state
            yield previous_state, await self._close_and_drain()

    def _finish(self, update: LastUpdate, owned_dir: Path | None) -> LastUpdate:
        """Count ``update`` and serve it (:meth:`_commit`), once vLLM resumed after loading it.

        Raises:
            UpdateFailed: vLLM did not resume (the node refuses completions).
        """
        if self.state == "failed":  # loaded, but vLLM did not resume
            self.updates["failed"] += 1
            raise UpdateFailed(self.last_error or "vLLM did not resume")
        self.updates["applied"] += 1
        self.bytes_received += update.bytes
        self._commit(update, owned_dir)
        return update

    def _commit(self, update: LastUpdate, owned_dir: Path | None) -> None:
        """Record ``update`` as served, open the gate, delete the pushed files it replaced.

        Args:
            update: what is served now.
            owned_dir: the pushed directory it came from (node-owned), or None (read from a
                caller's path or received over NCCL: nothing on disk to restore it from).
        """
        old = self._owned.pop(update.kind, None)
        if owned_dir is not None:
            self._owned[update.kind] = owned_dir
        if old is not None and old != owned_dir:
            shutil.rmtree(old, ignore_errors=True)
        self.version, self.state, self.last_update, self.last_error = (
            update.version, "serving", update, None)
        self._gate.open()
        logger.info("serving policy version %d (%s, %d tensors, receive %.2f s, drain %.2f s, "
                    "load %.2f s)", update.version, update.source, update.tensors,
                    update.receive_seconds, update.drain_seconds, update.apply_seconds)

    async def _resume(self) -> None:
        try:
            await self.engine.resume()
        except Exception as exc:  # noqa: BLE001 - the engine is gone: refuse from now on
            self.state, self.last_error = "failed", f"vLLM did not resume: {exc}"
            self._gate.open()

    async def _roll_back(self, previous_state: ServingState, kind: str, exc: BaseException) -> str:
        """Put the last good weights back after a failed load; return what the node serves now."""
        restored, self.last_error, detail = await roll_back(
            self.engine, self.settings.model or "", self.last_update, self._owned.get("full"),
            kind, self.version, exc)
        self.state = previous_state if restored else "failed"
        logger.error("%s", detail)
        self._gate.open()
        return detail

    # ------------------------------------------------------------------ NCCL (never run here)
    async def begin_external_update(self) -> None:
        """Take the update lock and close the gate for an update driven over several requests (NCCL)."""
        self._sync()
        assert self._lock is not None
        await self._lock.acquire()
        try:
            await self._close_and_drain()
        except BaseException:
            self._lock.release()
            raise

    async def end_external_update(self, version: int | None, error: BaseException | None = None) -> None:
        """Finish what :meth:`begin_external_update` started: serve ``version``, or fail.

        A failure leaves the weights half-written, so the node refuses completions until the
        next update succeeds.
        """
        assert self._lock is not None
        try:
            await self._resume()
            if error is not None or version is None:
                self.state, self.last_error = "failed", f"NCCL update failed: {error}"
                self._gate.open()
            else:
                self._commit(LastUpdate(version=version, source="nccl"), None)
        finally:
            self._lock.release()

    @property
    def updating(self) -> bool:
        """Whether an update holds the lock (NCCL: between start and finish)."""
        return self._lock is not None and self._lock.locked()


__all__ = ["DeltaRefused", "NodeState", "UpdateFailed", "boot_id"]
