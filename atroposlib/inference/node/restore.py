"""After a failed update: put a node's last good weights back into vLLM (the starting model, then the last push)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from atroposlib.inference.node.models import LastUpdate

logger = logging.getLogger("atroposlib.inference.node")


async def reload_last_good(engine: Any, model: str, last: LastUpdate | None, pushed: Path | None) -> bool:
    """Reload the starting model, then the pushed directory last served; False if impossible.

    Only weights the node can rebuild count: the starting model (nothing served yet, or
    ``--serve-base``) or a push it still holds on disk. Weights read from a caller's path or
    received over NCCL cannot be restored.

    Args:
        engine: the node's vLLM engine calls (``reload``, ``reset_prefix_cache``).
        model: the node's starting model (a directory or a hub id in the local cache).
        last: the update served before the failed one (None: nothing served yet).
        pushed: the node-owned directory of the last full push still on disk, or None.

    Returns:
        True when the last good weights are served again; False when they cannot be rebuilt
        or reloading them failed (logged).
    """
    # a path, NCCL or delta update left nothing on disk to rebuild the served version from
    if last is not None and last.kind == "full" and last.source not in ("base", "http"):
        return False
    base = local_model_dir(model)
    if base is None or (last is not None and last.source == "http" and pushed is None):
        return False
    try:
        await engine.reload(base)
        if last is not None and last.source == "http" and pushed is not None:
            await engine.reload(pushed)
        await engine.reset_prefix_cache()
    except Exception:  # noqa: BLE001 - reported by the caller as "could not be undone"
        logger.exception("restoring the previous weights failed")
        return False
    return True


async def roll_back(engine: Any, model: str, last: LastUpdate | None, pushed: Path | None, kind: str,
                    version: int | None, exc: BaseException) -> tuple[bool, str, str]:
    """After vLLM failed to load an update: put the last good weights back where possible.

    A LoRA adapter needs nothing put back (vLLM swaps one only once it has loaded); model
    tensors may be half-written, so :func:`reload_last_good` rebuilds them.

    Args:
        engine: the node's vLLM engine calls (see :func:`reload_last_good`).
        model: the node's starting model.
        last: the update served before the failed one (None: nothing served yet).
        pushed: the node-owned directory of the last full push still on disk, or None.
        kind: the failed update's kind, ``full`` or ``lora``.
        version: the policy version served before it (None: nothing yet).
        exc: what vLLM raised.

    Returns:
        ``(restored, the node's last_error, what it serves now)``: restored is True when the
        node keeps serving ``version``, False when it must refuse completions.
    """
    reason = f"{type(exc).__name__}: {exc}"
    served = f"version {version}" if version is not None else "nothing yet"
    if kind == "lora" or await reload_last_good(engine, model, last, pushed):
        return True, f"update refused by vLLM ({reason})", (
            f"vLLM failed to load the update ({reason}); the node put back and keeps serving {served}")
    return False, f"update failed and could not be undone ({reason})", (
        f"vLLM failed to load the update ({reason}) and the previous weights could not be "
        "restored; the node refuses completions until a push succeeds")


def local_model_dir(model: str) -> Path | None:
    """The starting model as a local directory (a hub id resolved from the local cache), or None."""
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached or not a hub id: no roll-back source
        return None


__all__ = ["local_model_dir", "reload_last_good", "roll_back"]
