"""Compact binary storage of one scored group, and its exact JSON rendering for the wire.

A queued group is held as one ``bytes`` blob (in memory, or as a SQLite BLOB with ``--db``):
token ids and masks as int32 (int64 when a value needs it) and the per-token float fields
(``advantages``, ``ref_logprobs``, ``inference_logprobs``) as float64, all flattened, plus a
small JSON header with the row lengths and every other field. That is about 16 bytes per token
for a group with inference logprobs, against about 110 bytes for Python lists (upstream) and
about 27-32 bytes for JSON text. float64 keeps every value bit-exact, and orjson writes numpy
values exactly as it writes Python ints and floats, so ``/batch`` returns what was posted.

Blob layout (little-endian)::

    b"AGB1" | u32 header_len | header JSON | zero padding to 8 bytes | array bytes ...
    header = {"rows": [T_0, ..., T_{G-1}], "arrays": [[field, dtype, offset, count], ...],
              "rest": {other fields}}
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from atroposlib.api.models import GROUP_FIELDS, OUTCOME_FIELDS
from atroposlib.api.shapes import PER_TOKEN_FIELDS

MAGIC = b"AGB1"
_HEADER = struct.Struct("<4sI")
#: Integer per-token fields packed as int32/int64.
INT_FIELDS = ("tokens", "masks")
#: Float per-token fields packed as float64.
FLOAT_FIELDS = PER_TOKEN_FIELDS
_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_I32 = np.iinfo(np.int32)


def _pack_ints(rows: list[list[int]]) -> np.ndarray | None:
    """Flatten int rows to int32 (or int64); None when a value does not fit int64."""
    try:
        arr = np.concatenate([np.array(r, dtype=np.int64) for r in rows])
    except (OverflowError, ValueError, TypeError):
        return None
    if arr.size and (arr.min() < _I32.min or arr.max() > _I32.max):
        return arr
    return arr.astype(np.int32)


def _pack_floats(rows: list[list[float]]) -> np.ndarray:
    """Flatten float rows to float64 (exact for Python floats)."""
    return np.concatenate([np.array(r, dtype=np.float64) for r in rows])


def encode_group(group: Any) -> bytes:
    """Encode a validated group into a compact blob.

    Args:
        group: a :class:`~atroposlib.api.models.ScoredData` or a dict with the same keys (rows
            already validated by ``group_shape_error``: every per-token field has ``T_i``
            entries in row ``i``).

    Returns:
        The blob; :func:`group_json` renders it back to the exact 14-key JSON object (plus the
        rollout-outcome fields, :data:`~atroposlib.api.models.OUTCOME_FIELDS`, and the
        ``item`` the group has).
    """
    get = group.get if isinstance(group, dict) else (lambda k: getattr(group, k))
    tokens = get("tokens")
    rows = [len(r) for r in tokens]
    arrays: list[tuple[str, np.ndarray]] = []
    rest: dict[str, Any] = {}
    for name in GROUP_FIELDS:
        value = get(name)
        packed = None
        if value is not None and name in INT_FIELDS:
            packed = _pack_ints(value)
        elif value is not None and name in FLOAT_FIELDS:
            packed = _pack_floats(value)
        if packed is None:
            rest[name] = value
        else:
            arrays.append((name, packed))
    for name in OUTCOME_FIELDS:  # extension fields: stored only when the group has them
        value = get(name)
        if value is not None:
            rest[name] = [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m
                          for m in value]
    item = get("item")  # the dataset item (extension): stored only when the group has one
    if item is not None:
        rest["item"] = item
    specs = []
    offset = 0
    for name, arr in arrays:
        specs.append([name, arr.dtype.str, offset, int(arr.size)])
        offset += arr.nbytes
    header = orjson.dumps({"rows": rows, "arrays": specs, "rest": rest}, option=_NUMPY)
    pad = -(_HEADER.size + len(header)) % 8
    return b"".join(
        [_HEADER.pack(MAGIC, len(header)), header, b"\0" * pad, *(a.tobytes() for _, a in arrays)]
    )


def decode_group(blob: bytes) -> dict[str, Any]:
    """Decode a blob into a 14-key dict, plus the outcome fields and ``item`` the group has.

    Packed fields are lists of 1-D numpy rows (views).

    Raises:
        ValueError: ``blob`` was not made by :func:`encode_group`.
    """
    magic, header_len = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ValueError("not an atroposlib group blob (bad magic)")
    start = _HEADER.size
    header = orjson.loads(blob[start : start + header_len])
    base = start + header_len
    base += -base % 8
    rows = header["rows"]
    bounds = np.cumsum(rows)[:-1] if rows else []
    values = dict(header["rest"])
    for name, dtype, offset, count in header["arrays"]:
        flat = np.frombuffer(blob, dtype=np.dtype(dtype), count=count, offset=base + offset)
        values[name] = np.split(flat, bounds) if rows else []
    group = {name: values.get(name) for name in GROUP_FIELDS}
    group.update((name, values[name]) for name in OUTCOME_FIELDS if values.get(name) is not None)
    if values.get("item") is not None:
        group["item"] = values["item"]
    return group


def group_json(blob: bytes) -> bytes:
    """Render a blob as the JSON object ``/batch`` returns: 14 keys, then outcome fields and item."""
    return orjson.dumps(decode_group(blob), option=_NUMPY)


def group_python(blob: bytes) -> dict[str, Any]:
    """Decode a blob into plain Python lists (for merging partial groups)."""
    group = decode_group(blob)
    for name in (*INT_FIELDS, *FLOAT_FIELDS):
        rows = group[name]
        if rows is not None:
            group[name] = [r.tolist() if isinstance(r, np.ndarray) else r for r in rows]
    return group
