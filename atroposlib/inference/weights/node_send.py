"""What the trainer pushes to its inference nodes: the Node and Payload records, and the files file-path nodes read."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from atroposlib.inference.node.models import ADAPTER_CONFIG_KEY


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


__all__ = ["Node", "Payload"]
