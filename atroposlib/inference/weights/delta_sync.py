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




class DeltaServers:
    """Delta-or-full pushes to vLLM servers reached over ``/collective_rpc``.

    The trainer's own vLLM, or stock servers sharing the weights directory.

    Args:
        roots: the servers' root URLs.
        encoding: ``weight_sync_encoding`` (``auto``, ``index``, ``xor`` or ``full``).
    """

    def __init__(self, roots: list[str], encoding: str):
        fmt = delta_format(encoding)
        self.base = DeltaBase(fmt) if fmt else None
        #: root -> the version its worker extension holds as delta base (None: needs a full sync)
        self.at: dict[str, int | None] = {r: None for r in roots}

    def push(self, tensors: dict[str, Any], version: int, full: Any, client: Any,
             weights_dir: Any) -> dict[str, Any]:
        """Send ``tensors`` as ``version``: a delta to the servers at the base, ``full(roots)`` to the rest.

        Args:
            tensors: ``{HF name: tensor}`` in the servers' dtype (tied copies are dropped here).
            version: the policy version.
            full: ``full(roots) -> (save_seconds, update_seconds)`` writes ``tensors`` into
                ``weights_dir`` and reloads those servers from it.
            client: an ``httpx.Client``.
            weights_dir: the directory ``full`` writes (the servers seed their base from it).

        Returns:
            ``sync/save_seconds``, ``sync/update_seconds`` and :func:`sync_record`'s fields.
        """
        import time

        from atroposlib.inference.weights.external_vllm import apply_delta, seed_delta
        from atroposlib.inference.weights.select import unique_storage

        begin = time.perf_counter()
        tensors = unique_storage(tensors)
        full_nbytes = tensor_bytes(tensors)
        save_s = update_s = 0.0
        sent = 0
        fraction = 1.0
        needs_full = list(self.at)
        checksums = None
        if self.base is not None and self.base.matches(tensors):
            payload, stats = self.base.encode(tensors, version)
            save_s, fraction, checksums = stats.seconds, stats.changed_fraction, stats.checksums
            # a delta no smaller than the tensors themselves: send them whole
            at_base = [r for r in self.at if self.at[r] == self.base.version
                       and stats.nbytes < full_nbytes]
            needs_full = [r for r in self.at if r not in at_base]
            mark = time.perf_counter()
            for root in at_base:
                answer = apply_delta(client, root, payload)
                sent += len(payload)
                if answer.get("applied"):
                    self.at[root] = version
                else:
                    self.at[root] = None
                    warn_full_sync(root, version, f"{answer.get('reason')}: {answer.get('detail')}")
                    needs_full.append(root)
            update_s = time.perf_counter() - mark
        if needs_full:
            write_s, reload_s = full(needs_full)
            save_s, update_s = save_s + write_s, update_s + reload_s
            sent += full_nbytes
            for root in needs_full:
                self.at[root] = version if self.base is not None and seed_delta(
                    client, root, weights_dir, version) else None
        if self.base is not None:
            if any(v == version for v in self.at.values()):
                self.base.commit(tensors, version, checksums)
            else:
                self.base.forget()
        return {"sync/save_seconds": save_s, "sync/update_seconds": update_s,
                **sync_record("full" if needs_full else "delta", sent, full_nbytes,
                              time.perf_counter() - begin, fraction)}


__all__ = ["SYNC_ENCODINGS", "DeltaBase", "DeltaServers", "delta_format", "sync_record", "tensor_bytes", "warn_full_sync"]
