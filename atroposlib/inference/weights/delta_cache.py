"""The receiving half of a delta weight sync: what a vLLM worker keeps to apply deltas.

vLLM fuses and renames a model's tensors (``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj``,
``gate_proj``/``up_proj`` into ``gate_up_proj``) and may repack them for its kernels, so a delta
by HF name cannot be added to vLLM's own parameters. A worker therefore keeps, per synced HF
tensor, the exact tensor it last applied (:class:`DeltaCache`, on the CPU), applies a delta onto
that copy, checks each result's sha-256 against the trainer's, and only then hands the HF-named
tensors to vLLM's own in-place reload (``reload_weights(weights_iterator=...)``), which maps
them onto its fused parameters. No file is involved.

vLLM's layer-wise reload only rebuilds a module once every part of it has arrived (a fused
``qkv_proj`` needs q, k and v), so every tensor of a decoder block the delta touches is loaded,
not only the changed ones.

Memory: the cache holds the synced subset once per worker, in the pushed dtype (the quickstart's
10 trained layers of SmolLM2-135M in bf16: 71 MB; a full fine-tune of every tensor, the tied
embeddings once: 269 MB, as ``benchmarks/bench_delta_sync.py`` records in
``trainer_copy_bytes``). The trainer keeps one copy of the same size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atroposlib.inference.weights import delta
from atroposlib.inference.weights.select import layer_key


class DeltaCache:
    """The tensors a worker last applied, by HF name, and their policy version.

    Attributes:
        tensors: ``{HF name: CPU tensor}`` as last applied (the synced subset only).
        version: their policy version; None until seeded (then every delta is refused).
    """

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.checksums: dict[str, str] = {}  # sha-256 of each cached tensor
        self.version: int | None = None

    @property
    def nbytes(self) -> int:
        """Bytes the cached tensors take."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def seed(self, tensors: dict[str, Any], version: int) -> dict[str, Any]:
        """Take ``tensors`` (just loaded whole) as the base of the next delta, replacing the cache."""
        self.tensors = {n: t.detach().to("cpu").contiguous() for n, t in tensors.items()}
        self.checksums = {n: delta.checksum(t) for n, t in self.tensors.items()}
        self.version = int(version)
        return {"version": self.version, "tensors": len(self.tensors), "bytes": self.nbytes}

    def seed_from_dir(self, path: str | Path, version: int) -> dict[str, Any]:
        """:meth:`seed` with every tensor of the ``*.safetensors`` files in ``path`` (what was just reloaded).

        Raises:
            FileNotFoundError: ``path`` holds no ``*.safetensors`` file.
        """
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path} holds no *.safetensors file to seed the delta base from")
        tensors: dict[str, Any] = {}
        for file in files:
            tensors.update(load_file(str(file)))
        return self.seed(tensors, version)

    def reset(self) -> None:
        """Forget the base (after a load of unknown outcome): the next delta is refused."""
        self.tensors, self.checksums, self.version = {}, {}, None

    def apply(self, payload: bytes, load: Callable[[list[tuple[str, Any]]], None]) -> dict[str, Any]:
        """Apply a delta: verify every result, load the touched blocks into vLLM, then flip the version.

        Args:
            payload: bytes from :func:`~atroposlib.inference.weights.delta.encode`.
            load: loads ``[(HF name, tensor), ...]`` into the model in place (vLLM's
                ``reload_weights(weights_iterator=...)``).

        Returns:
            ``{"applied": True, "version", "changed", "loaded", "seconds"}``; or ``{"applied":
            False, "reason": "base" | "checksum" | "payload", "detail"}`` when the delta does not
            apply (nothing was loaded, the cache and the model are unchanged).

        Raises:
            Exception: ``load`` failed (the cache is reset: the model may be half-written).
        """
        begin = time.perf_counter()
        try:
            changed, header = delta.apply(payload, self.tensors, self.version, self.checksums)
        except delta.DeltaError as exc:
            return {"applied": False, "reason": exc.reason, "detail": exc.detail,
                    "version": self.version}
        blocks = {layer_key(n) for n in changed} - {None}
        pairs = [(n, changed.get(n, t)) for n, t in self.tensors.items()
                 if n in changed or layer_key(n) in blocks]
        try:
            if pairs:
                load(pairs)
        except BaseException:
            self.reset()
            raise
        self.tensors.update(changed)
        self.checksums.update({n: header.tensors[n]["sha256"] for n in changed})
        self.version = header.version
        return {"applied": True, "version": header.version, "changed": len(changed),
                "loaded": len(pairs), "seconds": time.perf_counter() - begin}


__all__ = ["DeltaCache"]
