"""``weight_sync=lora``: save each version of a LoRA adapter into its own folder and hot-load it.

vLLM keys the prefix-cache blocks of a LoRA request by the adapter's name and path, so a
reload of changed weights from the same path would let blocks computed with the old adapter be
reused; every push therefore gets a new folder (``<weights_dir>/adapters/push_<n>``) and only
the newest two are kept.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any


class AdapterPush:
    """The adapter folders of one run and their hot-load into vLLM servers."""

    def __init__(self, weights_dir: Path, lora_r: int):
        """Nothing is written until :meth:`save`.

        Args:
            weights_dir: the run's weights directory (``<run>/vllm_weights``).
            lora_r: the adapter's rank (names the ``--max-lora-rank`` a refusal asks for).
        """
        self.root = (Path(weights_dir) / "adapters").resolve()
        self.lora_r = lora_r
        self.pushes = 0  # folders written so far

    @property
    def latest(self) -> Path | None:
        """The folder of the adapter saved last (None before the first)."""
        return self.root / f"push_{self.pushes - 1}" if self.pushes else None

    def save(self, model: Any, state_dict: dict[str, Any] | None) -> Path:
        """Save the adapter into a new ``push_<n>`` folder and delete ``push_<n-2>``.

        Args:
            model: the peft LoRA model (plain or FSDP2-sharded).
            state_dict: its full state dict gathered from the shards; None in one process.

        Returns:
            The new folder's absolute path.
        """
        from example_trainer.lora import save_adapter

        out = self.root / f"push_{self.pushes}"
        shutil.rmtree(out, ignore_errors=True)  # a leftover of an earlier run in this directory
        save_adapter(model, out, state_dict)
        if self.pushes >= 2:
            shutil.rmtree(self.root / f"push_{self.pushes - 2}", ignore_errors=True)
        self.pushes += 1
        return out

    def push(self, model: Any, state_dict: dict[str, Any] | None, roots: list[str],
             lora_name: str) -> dict[str, float]:
        """Save the adapter and load it in place, as ``lora_name``, into every server in ``roots``.

        Args:
            model: the peft LoRA model.
            state_dict: its gathered full state dict, or None in one process.
            roots: the servers' base URLs (``http://HOST:PORT/v1``); each reads the folder.
            lora_name: the name the adapter is served under.

        Returns:
            ``sync/save_seconds``, ``sync/update_seconds`` and the sync record (``sync/path``
            ``lora``, ``sync/bytes`` = the adapter's safetensors bytes, ``sync/seconds``).

        Raises:
            InferenceError: a server refused the adapter (the message names the vLLM flags).
        """
        from atroposlib.inference.weights.delta_sync import sync_record
        from atroposlib.inference.weights.external_vllm import load_adapter
        from example_trainer.sync_choice import lora_rank_slot

        begin = time.perf_counter()
        folder = self.save(model, state_dict)
        save_s = time.perf_counter() - begin
        nbytes = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        update_s = load_adapter(
            roots, lora_name, folder,
            fix=f"start that vLLM with --enable-lora --max-lora-rank {lora_rank_slot(self.lora_r)} "
                "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or use --weight-sync reload")
        return {"sync/save_seconds": save_s, "sync/update_seconds": update_s,
                **sync_record("lora", nbytes, nbytes, time.perf_counter() - begin, 1.0)}


__all__ = ["AdapterPush"]
