"""The few calls the node makes into vLLM's engine, through the objects vLLM's own routes use.

vLLM's OpenAI server keeps its engine client (``AsyncLLM``) in ``app.state.engine_client`` and its
model registry in ``app.state.openai_serving_models``; its ``/pause``, ``/collective_rpc``,
``/reset_prefix_cache`` and ``/v1/load_lora_adapter`` routes are thin wrappers over the same
methods called here. Calling them in-process means the node needs none of vLLM's unauthenticated
development routes (``VLLM_SERVER_DEV_MODE``). Written against vLLM 0.32.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.worker_extension import (
    DELTA_APPLY_RPC,
    DELTA_RESET_RPC,
    DELTA_SEED_RPC,
    DISCARD_PARTIAL_RELOAD_RPC,
)

logger = logging.getLogger("atroposlib.inference.node")


class EngineCallError(InferenceError):
    """vLLM refused or failed an engine call (the message carries vLLM's reason)."""


class VLLMEngine:
    """Weight-update calls on the vLLM server this middleware runs in.

    Args:
        app_state: the vLLM FastAPI app's ``state`` (holds ``engine_client`` and
            ``openai_serving_models`` once the server has started).
    """

    def __init__(self, app_state: Any):
        self._state = app_state

    @property
    def client(self) -> Any:
        """The engine client of vLLM (``AsyncLLM``)."""
        return self._state.engine_client

    @property
    def dtype(self) -> str:
        """The served dtype without the ``torch.`` prefix, e.g. ``bfloat16``."""
        return str(self.client.model_config.dtype).removeprefix("torch.")

    @property
    def lora_enabled(self) -> bool:
        """Whether vLLM was started with ``--enable-lora``."""
        return getattr(self.client.vllm_config, "lora_config", None) is not None

    @property
    def workers(self) -> int | None:
        """Worker processes of vLLM (tensor x pipeline x data parallel), None if unknown."""
        parallel = getattr(self.client.vllm_config, "parallel_config", None)
        return getattr(parallel, "world_size_across_dp", None)

    async def pause(self, mode: str = "wait") -> None:
        """Stop scheduling: ``wait`` lets requests in flight finish, ``abort`` ends them.

        Requests that arrive while paused are queued by vLLM and run after :meth:`resume`.
        """
        await self.client.pause_generation(mode=mode)

    async def resume(self) -> None:
        """Schedule requests again (those that arrived while paused run now)."""
        await self.client.resume_generation()

    async def reload(self, weights_dir: Path) -> None:
        """Load every ``*.safetensors`` tensor in ``weights_dir`` into the running model, in place.

        Tensors absent from the directory keep their values (vLLM's layer-wise reload puts the
        current ones back), so a directory may hold only the layers that changed.

        If vLLM fails half-way (a tensor of the wrong shape or name), the layers it had not
        finished get their previous tensors back before the error is raised (see
        :func:`~atroposlib.inference.worker_extension.discard_partial_reload`); without that
        every later reload would fail too. The layers it had finished keep the new values:
        reload the last good weights to undo them.

        Raises:
            Exception: vLLM's error (the engine stays up).
        """
        try:
            await self.client.collective_rpc("reload_weights",
                                             kwargs={"weights_path": str(weights_dir)})
        except Exception:
            try:
                await self.client.collective_rpc(DISCARD_PARTIAL_RELOAD_RPC)
            except Exception:  # noqa: BLE001 - e.g. vLLM runs another worker extension
                logger.exception("could not discard the failed reload's leftovers in vLLM "
                                 "(it runs without atroposlib's worker extension?)")
            raise

    async def delta_seed(self, weights_dir: Path, version: int) -> bool:
        """Have every worker keep the tensors just reloaded from ``weights_dir`` as its delta base.

        Returns:
            False when a worker cannot (vLLM runs another worker extension): full syncs only.
        """
        try:
            await self.client.collective_rpc(DELTA_SEED_RPC, args=(str(weights_dir), version))
        except Exception as exc:  # noqa: BLE001 - no worker extension: deltas off, not an error
            logger.info("weight deltas off (vLLM's workers cannot keep a delta base: %s)", exc)
            return False
        return True

    async def delta_apply(self, payload: bytes) -> dict[str, Any]:
        """Apply a weight delta in every worker (checked, then loaded; see ``DeltaCache.apply``).

        Returns:
            The first worker's answer when all applied it, else the first refusal
            (``{"applied": False, "reason", "detail"}``).

        Raises:
            Exception: vLLM failed while loading (the model may be half-written).
        """
        results = await self.client.collective_rpc(DELTA_APPLY_RPC, args=(payload,))
        results = list(results or [])
        refused = [r for r in results if not (isinstance(r, dict) and r.get("applied"))]
        if not results:
            return {"applied": False, "reason": "payload", "detail": "no worker answered"}
        return refused[0] if refused else results[0]

    async def delta_reset(self) -> None:
        """Forget the delta base in every worker (best effort)."""
        try:
            await self.client.collective_rpc(DELTA_RESET_RPC)
        except Exception:  # noqa: BLE001 - without the extension there is nothing to forget
            logger.debug("no delta base to reset")

    async def reset_prefix_cache(self) -> None:
        """Drop cached KV blocks computed with the previous weights."""
        await self.client.reset_prefix_cache()

    async def set_weight_version(self, version: int) -> None:
        """Record ``version`` as vLLM's own weight version (its ``/weight_info`` route)."""
        await self.client.update_weight_version(str(version))

    async def load_lora(self, lora_name: str, adapter_dir: Path) -> None:
        """Load (or replace, in place) the adapter served as ``lora_name``.

        Raises:
            EngineCallError: vLLM refused the adapter (its message is kept).
        """
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        models = self._state.openai_serving_models
        answer = await models.load_lora_adapter(LoadLoRAAdapterRequest(
            lora_name=lora_name, lora_path=str(adapter_dir), load_inplace=True))
        error = getattr(answer, "error", None)
        if error is not None:
            raise EngineCallError(f"vLLM refused the adapter: {getattr(error, 'message', error)}")

    # ------------------------------------------------------------------ NCCL (never run here)
    async def nccl_init(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's NCCL group (vLLM's ``init_weight_transfer_engine``)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.client.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def nccl_start(self) -> None:
        """Start an update (vLLM's ``start_weight_update``)."""
        await self.client.start_weight_update()

    async def nccl_update(self, update_info: Any) -> None:
        """Receive the broadcast the trainer sends meanwhile (vLLM's ``update_weights``)."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self.client.update_weights(request=WeightTransferUpdateRequest(update_info=update_info))

    async def nccl_finish(self, version: int) -> None:
        """Finish the update and record ``version`` (vLLM's ``finish_weight_update``)."""
        await self.client.finish_weight_update(str(version))

    async def nccl_shutdown(self) -> None:
        """Leave the trainer's NCCL group (vLLM's ``shutdown_weight_transfer_engine``)."""
        await self.client.shutdown_weight_transfer_engine()


__all__ = ["EngineCallError", "VLLMEngine"]
