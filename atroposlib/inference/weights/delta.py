"""Weight deltas: only the elements that changed since the version a server last applied.

A delta turns the tensors a server holds (``old``, version ``base_version``) into the trainer's
current ones (``new``, version ``version``), bit for bit. Elements are compared as raw bits (a
bf16 tensor as int16, an fp32 one as int32), so ``-0.0`` vs ``0.0`` and NaN payloads count as
changes and the result is exact.

Two encodings, chosen per changed tensor (``auto``) or forced for all:

* ``index``: the flat positions of the changed elements (int32) and their new values (the
  tensor's dtype): 6 bytes per changed bf16 element.
* ``xor``: a bitmask of the changed elements and ``old ^ new`` of those elements only, split
  into byte planes (all low bytes, then all high bytes: a change of a few ulps leaves the high
  bytes zero), each compressed with zlib (level 1, the fastest).

Index/value costs ``4 + w`` bytes per changed element (``w``: element width) against ``w`` per
element sent whole. On two consecutive steps of the quickstart's LoRA policy (10% of the merged
bf16 elements changed), index/value took 31% of the full bytes, XOR of all elements + zlib 10%,
and the masked XOR above 6.3% (0.33 s for 70 MB on this project's 2-core CPU box; zlib level 6
or lzma gained 1 point at 4x the time). ``auto`` (the default) takes index/value only for a
tensor with so few changes that it is smaller than the compressed mask alone would be
(:data:`INDEX_MAX_FRACTION`), XOR otherwise.

Wire format: one safetensors file (bytes). Per changed tensor ``NAME`` it holds ``NAME|i``
(int32) and ``NAME|v`` (index) or ``NAME|m`` and ``NAME|x`` (uint8, xor); its ``__metadata__`` key
``atropos.delta`` is JSON ``{"base_version", "version", "encoding", "tensors": {NAME:
{"sha256", "dtype", "shape"}}, "unchanged": {NAME: sha256}}``: every changed tensor with the
sha-256 of its new bytes, and the sha-256 of every other tensor, so the receiver checks all of
them (unchanged ones against the checksum it kept, without hashing them again).

Checksum: sha-256 of a tensor's raw bytes (little-endian, C order). It is in the standard
library, hardware-accelerated (~0.7 GB/s on this project's 2-core CPU box, 0.1 s for the 70 MB
of the quickstart's 10 trained bf16 layers), the same hash as the node's ``Content-Digest``, and
an accidental match is out of the question, so a matching checksum means identical weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from atroposlib.errors import AtroposError

#: Encodings :func:`encode` writes.
ENCODINGS = ("auto", "index", "xor")
#: The encoding used unless a caller picks one (see the module doc).
DEFAULT_ENCODING = "auto"
#: ``auto``: index/value while the changed fraction is at most this (then its ``4 + w`` bytes
#: per change undercut the XOR encoding's bitmask); XOR + zlib above it.
INDEX_MAX_FRACTION = 0.005
#: safetensors metadata key of the delta header.
HEADER_KEY = "atropos.delta"
#: zlib level of the ``xor`` encoding (1: fastest).
ZLIB_LEVEL = 1

_INT_VIEW = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


class DeltaError(AtroposError, ValueError):
    """A delta cannot be applied.

    ``reason`` is ``base`` (another base version or tensor set), ``checksum`` (a result differs
    from the trainer's) or ``payload`` (malformed). An inference node raises its subclass
    :class:`~atroposlib.inference.node.state.DeltaRefused` when vLLM's workers refuse a delta.
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class DeltaHeader:
    """What a delta says about itself.

    Attributes:
        base_version: the version the receiver must hold.
        version: the version it holds after applying.
        encoding: ``auto`` (each tensor's entries say which), ``index`` or ``xor``.
        tensors: changed tensor name -> ``{"sha256": hex, "dtype": "bfloat16", "shape": [..]}``.
    """

    base_version: int
    version: int
    encoding: str
    tensors: dict[str, dict[str, Any]]
    unchanged: dict[str, str] = field(default_factory=dict)


@dataclass
class DeltaStats:
    """Sizes of one encoded delta.

    Attributes:
        nbytes: bytes of the payload.
        full_nbytes: bytes of the same tensors sent whole (the raw tensor bytes).
        elements: elements of all tensors compared.
        changed: elements that differ.
        tensors_changed: tensors with at least one changed element.
        seconds: time taken to encode (including checksums).
    """

    nbytes: int = 0
    full_nbytes: int = 0
    elements: int = 0
    changed: int = 0
    tensors_changed: int = 0
    seconds: float = 0.0
    checksums: dict[str, str] = field(default_factory=dict)  # sha-256 of every new tensor

    @property
    def changed_fraction(self) -> float:
        """Changed elements / elements compared (0 when nothing was compared)."""
        return self.changed / self.elements if self.elements else 0.0


def _bits(tensor: Any) -> Any:
    """``tensor`` flattened and viewed as signed integers of its element width (no copy)."""
    import torch

    flat = tensor.detach().reshape(-1)
    width = flat.element_size()
    if width not in _INT_VIEW:
        raise ValueError(f"cannot take the bits of {tensor.dtype} elements")
    return flat.view(getattr(torch, _INT_VIEW[width]))


def checksum(tensor: Any) -> str:
    """sha-256 hex digest of ``tensor``'s raw bytes (C order; the tensor is made contiguous on the CPU)."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().data).hexdigest()


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _bytes_tensor(raw: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)


def encode_tensor(old: Any, new: Any, encoding: str = DEFAULT_ENCODING) -> dict[str, Any]:
    """The entries (suffix -> tensor) turning ``old`` into ``new``; ``{}`` when they are equal.

    Args:
        old: the tensor the receiver holds (any shape; CPU).
        new: the tensor it must hold: same shape and dtype.
        encoding: ``index`` (``{"i": int32 positions, "v": values}``), ``xor``
            (``{"m": zlib of the packed changed-element bitmask, "x": zlib of the byte planes of
            old ^ new of the changed elements}``) or ``auto`` (either,
            see :data:`INDEX_MAX_FRACTION`).

    Raises:
        ValueError: shapes or dtypes differ, or an unknown encoding.
    """
    return _encode_tensor(old, new, encoding)[0]


def _encode_tensor(old: Any, new: Any, encoding: str) -> tuple[dict[str, Any], int]:
    """:func:`encode_tensor`, and how many elements changed."""
    import torch

    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"cannot encode a change of shape or dtype ({tuple(old.shape)} "
                         f"{old.dtype} -> {tuple(new.shape)} {new.dtype}); send the tensor whole")
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown delta encoding {encoding!r}; use one of {', '.join(ENCODINGS)}")
    a, b = _bits(old.contiguous()), _bits(new.contiguous())
    mask = a != b
    positions = torch.nonzero(mask).reshape(-1)
    changed = positions.numel()
    if changed == 0:
        return {}, 0
    if encoding == "auto":
        encoding = "index" if changed <= INDEX_MAX_FRACTION * a.numel() else "xor"
    if encoding == "index":
        if a.numel() > 2**31 - 1:
            raise ValueError("a tensor of more than 2**31 - 1 elements needs int64 positions")
        return {"i": positions.to(torch.int32),
                "v": new.detach().reshape(-1)[positions].contiguous()}, changed
    import numpy as np

    x = torch.bitwise_xor(a[positions], b[positions])
    planes = x.view(torch.uint8).reshape(-1, x.element_size()).t().contiguous().reshape(-1)
    bits = np.packbits(mask.numpy())
    return {"m": _bytes_tensor(zlib.compress(bits.data, ZLIB_LEVEL)),
            "x": _bytes_tensor(zlib.compress(planes.numpy().data, ZLIB_LEVEL))}, changed
    raise ValueError(f"unknown delta encoding {encoding!r}; use one of {', '.join(ENCODINGS)}")


def apply_tensor(old: Any, entries: dict[str, Any], encoding: str) -> Any:
    """``old`` with the change ``entries`` (from :func:`encode_tensor`) applied, as a new tensor.

    Raises:
        DeltaError: (``payload``) the entries do not fit ``old``.
    """
    import torch

    out = old.detach().contiguous().clone()
    flat = out.reshape(-1)
    if encoding == "auto":
        encoding = "xor" if "m" in entries else "index"
    try:
        if encoding == "index":
            positions, values = entries["i"].to(torch.int64), entries["v"]
            if positions.numel() != values.numel() or values.dtype != old.dtype:
                raise ValueError("positions and values disagree")
            flat[positions] = values
            return out
        if encoding == "xor":
            import numpy as np

            packed = np.frombuffer(zlib.decompress(entries["m"].numpy().tobytes()), dtype=np.uint8)
            if packed.size != (flat.numel() + 7) // 8:
                raise ValueError(f"a mask of {packed.size} bytes for {flat.numel()} elements")
            positions = torch.from_numpy(np.flatnonzero(np.unpackbits(packed, count=flat.numel())))
            raw = zlib.decompress(entries["x"].numpy().tobytes())
            width = flat.element_size()
            if len(raw) != positions.numel() * width:
                raise ValueError(f"{len(raw)} bytes for {positions.numel()} changed elements")
            planes = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(width, -1)
            x = planes.t().contiguous().reshape(-1).view(_bits(out).dtype)
            bits = _bits(out)
            bits[positions] = torch.bitwise_xor(bits[positions], x)
            return out
    except (KeyError, IndexError, ValueError, RuntimeError, zlib.error) as exc:
        raise DeltaError("payload", f"the delta does not fit its tensor ({exc})") from None
    raise DeltaError("payload", f"unknown delta encoding {encoding!r}")


def encode(old: dict[str, Any], new: dict[str, Any], *, base_version: int, version: int,
           encoding: str = DEFAULT_ENCODING,
           checksums: dict[str, str] | None = None) -> tuple[bytes, DeltaStats]:
    """The delta turning ``old`` (version ``base_version``) into ``new`` (``version``), as bytes.

    Args:
        old: ``{name: tensor}`` the receiver holds (CPU tensors).
        new: ``{name: tensor}`` it must hold: the same names, shapes and dtypes.
        base_version: version of ``old``.
        version: version of ``new``.
        encoding: ``auto`` (per tensor), ``index`` or ``xor``.
        checksums: sha-256 of ``old``'s tensors where already known (unchanged tensors are
            then not hashed again); None: computed.

    Returns:
        ``(payload, stats)``: the safetensors bytes (see the module doc), their sizes and
        ``stats.checksums`` (sha-256 of every tensor of ``new``).

    Raises:
        ValueError: the names, a shape or a dtype differ (then send the tensors whole).
    """
    import time

    from safetensors.torch import save

    begin = time.perf_counter()
    if set(old) != set(new):
        raise ValueError(f"the tensor sets differ ({len(old)} held, {len(new)} new); send them whole")
    stats = DeltaStats()
    body: dict[str, Any] = {}
    described: dict[str, dict[str, Any]] = {}
    for name, tensor in new.items():
        tensor = tensor.detach().to("cpu")
        stats.elements += tensor.numel()
        stats.full_nbytes += tensor.numel() * tensor.element_size()
        entries, changed = _encode_tensor(old[name], tensor, encoding)
        if not entries:
            known = (checksums or {}).get(name)
            stats.checksums[name] = known if known is not None else checksum(tensor)
            continue
        stats.tensors_changed += 1
        stats.changed += changed
        for suffix, value in entries.items():
            body[f"{name}|{suffix}"] = value
        stats.checksums[name] = checksum(tensor)
        described[name] = {"sha256": stats.checksums[name], "dtype": _dtype_name(tensor),
                           "shape": list(tensor.shape)}
    header = {"base_version": base_version, "version": version, "encoding": encoding,
              "tensors": described,
              "unchanged": {n: c for n, c in stats.checksums.items() if n not in described}}
    payload = save(body, metadata={HEADER_KEY: json.dumps(header)})
    stats.nbytes = len(payload)
    stats.seconds = time.perf_counter() - begin
    return payload, stats


def read_header(payload: bytes) -> DeltaHeader:
    """The header of a delta payload.

    Raises:
        DeltaError: (``payload``) not a delta.
    """
    from atroposlib.inference.weights.safetensors_header import read_raw_header

    try:
        meta = read_raw_header(io.BytesIO(payload), len(payload))[0].get("__metadata__") or {}
        raw = json.loads(meta[HEADER_KEY])
        return DeltaHeader(int(raw["base_version"]), int(raw["version"]), str(raw["encoding"]),
                           dict(raw["tensors"]), dict(raw.get("unchanged") or {}))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DeltaError("payload", f"not a weight delta ({type(exc).__name__}: {exc})") from None


def apply(payload: bytes, base: dict[str, Any], base_version: int | None,
          checksums: dict[str, str] | None = None) -> tuple[dict[str, Any], DeltaHeader]:
    """The tensors a delta changes, with their new values, after checking every checksum.

    Nothing is modified: ``base`` stays as it was, whatever happens.

    Args:
        payload: bytes from :func:`encode`.
        base: ``{name: tensor}`` the receiver holds.
        base_version: the version ``base`` is (None: unknown, refused).
        checksums: sha-256 of ``base``'s tensors where known (what the receiver computed when
            it applied them); the others are hashed here.

    Returns:
        ``({name: new tensor}, header)`` for the changed tensors only.

    Raises:
        DeltaError: ``base`` (the delta starts from another version, or names a tensor ``base``
            lacks), ``checksum`` (a result's sha-256 differs from the trainer's: the bases
            differed) or ``payload`` (malformed).
    """
    from safetensors.torch import load

    header = read_header(payload)
    if base_version is None or header.base_version != base_version:
        raise DeltaError("base", f"the delta starts from version {header.base_version}, the "
                                 f"receiver holds {base_version}")
    missing = sorted((set(header.tensors) | set(header.unchanged)) - set(base))
    if missing:
        raise DeltaError("base", f"{len(missing)} tensor(s) of the delta are not held (e.g. "
                                 f"{', '.join(missing[:3])})")
    try:
        body = load(payload)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise DeltaError("payload", f"unreadable delta body ({exc})") from None
    for name, expected in header.unchanged.items():
        held = (checksums or {}).get(name) or checksum(base[name])
        if held != expected:
            raise DeltaError("checksum", f"{name}: the receiver's copy differs from the trainer's "
                                         f"version {header.base_version} (sha-256 {held[:12]}... "
                                         f"vs {expected[:12]}...)")
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in body.items():
        name, _, suffix = key.rpartition("|")
        grouped.setdefault(name, {})[suffix] = value
    out: dict[str, Any] = {}
    for name, info in header.tensors.items():
        tensor = apply_tensor(base[name], grouped.get(name, {}), header.encoding)
        if checksum(tensor) != info.get("sha256"):
            raise DeltaError("checksum", f"{name}: the result's sha-256 differs from the "
                                         "trainer's (the receiver's copy was not the trainer's "
                                         f"version {header.base_version})")
        out[name] = tensor
    return out, header


__all__ = ["DEFAULT_ENCODING", "ENCODINGS", "HEADER_KEY", "DeltaError", "DeltaHeader", "DeltaStats",
           "apply", "apply_tensor", "checksum", "encode", "encode_tensor", "read_header"]
