"""The sending half of a delta weight sync: the trainer's copy of what its servers last applied.

A target (the trainer's own vLLM, stock vLLM servers, inference nodes) keeps one
:class:`DeltaBase`: the tensors of the last version every server it pushed to applied, in the
pushed dtype (bf16 for a bf16 vLLM). The next push of the same tensors is sent as a delta
against it (:func:`~atroposlib.inference.weights.delta.encode`) to every server known to hold
that version; any other server (another base version, a checksum mismatch, a server without
atroposlib's worker extension) gets a full sync.

Every push reports, for ``metrics.jsonl``: ``sync/path`` (``delta``, ``full`` or ``lora``),
``sync/bytes`` (sent or written), ``sync/full_bytes`` (what a full sync of the same tensors
takes), ``sync/seconds`` (the whole push) and ``sync/changed_fraction`` (changed elements /
elements pushed; 1.0 for a full sync without a base to compare with).
"""

from __future__ import annotations

import sys
from typing import Any

from atroposlib.inference.weights import delta

#: ``weight_sync_encoding`` values: the measured default format, a format, or no deltas.
SYNC_ENCODINGS = ("auto", "index", "xor", "full")


def delta_format(encoding: str) -> str | None:
    """The delta format of a ``weight_sync_encoding`` (None: ``full``, no deltas).

    Raises:
        ValueError: an unknown value.
    """
    if encoding not in SYNC_ENCODINGS:
        raise ValueError(f"weight_sync_encoding must be one of {', '.join(SYNC_ENCODINGS)}, "
                         f"not {encoding!r}")
    if encoding == "full":
        return None
    return encoding


def warn_full_sync(server: str, version: int, reason: str) -> None:
    """The one warning a server that refused a delta gets (it is sent the full weights)."""
    print(f"[grpo] WARNING: {server} refused the weight delta to policy version {version} "
          f"({reason}); sending it the full weights instead. A checksum mismatch means its copy "
          "of the weights differed from the trainer's; if this repeats, report it, or set "
          "weight_sync_encoding: full.", file=sys.stderr, flush=True)


class DeltaBase:
    """What the servers of one target last applied: tensors (pushed dtype) and their version.

    Args:
        encoding: the delta format (``index`` or ``xor``).
    """

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.version: int | None = None
        self.tensors: dict[str, Any] = {}
        self.checksums: dict[str, str] = {}  # sha-256 of each tensor of the copy

    @property
    def nbytes(self) -> int:
        """Bytes the trainer's copy takes."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def matches(self, tensors: dict[str, Any]) -> bool:
        """Whether ``tensors`` can be sent as a delta against this base (same names, shapes, dtypes)."""
        if self.version is None or set(tensors) != set(self.tensors):
            return False
        return all(t.shape == self.tensors[n].shape and t.dtype == self.tensors[n].dtype
                   for n, t in tensors.items())

    def encode(self, tensors: dict[str, Any], version: int) -> tuple[bytes, delta.DeltaStats]:
        """The delta from this base to ``tensors`` (``version``); see :func:`delta.encode`."""
        assert self.version is not None
        return delta.encode(self.tensors, tensors, base_version=self.version, version=version,
                            encoding=self.encoding, checksums=self.checksums)

    def changed_fraction(self, tensors: dict[str, Any]) -> float:
        """Changed elements / elements of ``tensors`` against this base (1.0 without a base)."""
        if not self.matches(tensors):
            return 1.0
        total = changed = 0
        for name, tensor in tensors.items():
            a = delta._bits(self.tensors[name].contiguous())
            b = delta._bits(tensor.detach().to("cpu").contiguous())
            changed += int((a != b).sum())
            total += a.numel()
        return changed / total if total else 0.0

    def commit(self, tensors: dict[str, Any], version: int,
               checksums: dict[str, str] | None = None) -> None:
        """Take ``tensors`` (copied to the CPU) as what the servers hold now, as ``version``.

        Args:
            tensors: ``{HF name: tensor}`` the servers applied.
            version: their policy version.
            checksums: their sha-256 where known (``DeltaStats.checksums``); else computed.
        """
        self.tensors = {n: t.detach().to("cpu", copy=True).contiguous() for n, t in tensors.items()}
        known = checksums or {}
        self.checksums = {n: known.get(n) or delta.checksum(t) for n, t in self.tensors.items()}
        self.version = version

    def forget(self) -> None:
        """Drop the copy (no server holds a known base any more)."""
        self.tensors, self.checksums, self.version = {}, {}, None


def tensor_bytes(tensors: dict[str, Any]) -> int:
    """Raw bytes of ``tensors`` (what a full sync of them carries, headers aside)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def sync_record(path: str, nbytes: int, full_nbytes: int, seconds: float,
                changed_fraction: float) -> dict[str, Any]:
    """The per-push fields for ``metrics.jsonl`` (see the module doc)."""
    return {"sync/path": path, "sync/bytes": float(nbytes), "sync/full_bytes": float(full_nbytes),
            "sync/seconds": seconds, "sync/changed_fraction": changed_fraction}





__all__ = ["SYNC_ENCODINGS", "DeltaBase", "delta_format", "sync_record", "tensor_bytes", "warn_full_sync"]
