"""Read the JSON header of a safetensors file or body without loading its tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``__metadata__``
string map), then the tensor bytes. Reading the header costs one small read, so a receiver can
look at what a payload holds (names, shapes, a delta's own header) before loading it.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

#: Largest safetensors header read (bytes); the format itself caps it at 100 MB.
MAX_HEADER_BYTES = 100 * 2**20


def read_raw_header(handle: IO[bytes], size: int) -> tuple[dict[str, Any], int]:
    """Read the header at the start of ``handle``, a safetensors file or body of ``size`` bytes.

    Args:
        handle: a binary stream at the start of the file (an open file, ``io.BytesIO(body)``).
        size: the file's size in bytes.

    Returns:
        ``(header, length)``: the JSON header object as parsed (``__metadata__`` included when
        present) and its length in bytes; the tensor data starts at ``8 + length``.

    Raises:
        ValueError: not a safetensors file (shorter than 8 bytes, a header length beyond the
            file or :data:`MAX_HEADER_BYTES`), a header that is not JSON or not a JSON object.
    """
    head = handle.read(8)
    if len(head) < 8:
        raise ValueError("the body is not a safetensors file (shorter than 8 bytes)")
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise ValueError("the body is not a safetensors file (bad header length); send "
                         "safetensors.torch.save(tensors)")
    try:
        raw = json.loads(handle.read(length))
    except ValueError as exc:
        raise ValueError(f"the safetensors header is not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError("the safetensors header is not a JSON object")
    return raw, length


__all__ = ["MAX_HEADER_BYTES", "read_raw_header"]
