"""Check a pushed safetensors payload before vLLM sees it: well-formed, complete, known tensor names and shapes.

Reading the safetensors header only costs one small read
(:func:`~atroposlib.inference.weights.safetensors_header.read_raw_header`), so the node can refuse
a payload that would fail half-way through vLLM's reload (an unknown name, a wrong shape, a
truncated file) while the old weights keep serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from atroposlib.errors import AtroposError
from atroposlib.inference.node.models import ADAPTER_CONFIG_KEY
from atroposlib.inference.weights.safetensors_header import (  # noqa: F401 - importable from here as before
    MAX_HEADER_BYTES,
    read_raw_header,
)

#: How many offending names an error message lists.
NAMES_SHOWN = 5


class PayloadError(AtroposError, ValueError):
    """The payload is not a usable update; ``status_code`` is the HTTP answer (400, 409, 422)."""

    def __init__(self, detail: str, status_code: int = 422):
        super().__init__(detail)
        self.detail = detail
        self.status_code = status_code


@dataclass(frozen=True)
class Header:
    """A safetensors header.

    Attributes:
        shapes: tensor name -> shape.
        dtypes: tensor name -> safetensors dtype code (``F32``, ``BF16`` ...).
        metadata: the ``__metadata__`` string map ({} if none).
    """

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    metadata: dict[str, str]


def read_header(path: Path) -> Header:
    """Parse and check the header of the safetensors file ``path``.

    Raises:
        PayloadError: not a safetensors file, or its size disagrees with its header
            (truncated or padded), or a tensor's bytes lie outside the data section.
    """
    size = path.stat().st_size
    with open(path, "rb") as handle:
        try:
            raw, length = read_raw_header(handle, size)
        except ValueError as exc:
            raise PayloadError(str(exc), 400) from None
    metadata = raw.pop("__metadata__", None) or {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    data_size = size - 8 - length
    end_max = 0
    for name, info in raw.items():
        try:
            begin, end = info["data_offsets"]
            shapes[name] = tuple(int(d) for d in info["shape"])
            dtypes[name] = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise PayloadError(f"tensor {name!r} has a malformed safetensors entry", 400) from None
        if not 0 <= begin <= end <= data_size:
            raise PayloadError(f"tensor {name!r} lies outside the file (truncated body?)", 400)
        end_max = max(end_max, end)
    if end_max != data_size:
        raise PayloadError(f"the body has {data_size} data bytes but its header describes "
                           f"{end_max}: truncated or padded", 400)
    return Header(shapes, dtypes, {str(k): str(v) for k, v in metadata.items()})


def model_tensor_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of every ``*.safetensors`` file in a model directory.

    Returns:
        The index, or None when ``model_dir`` is not a local directory with safetensors files
        (a hub id): pushes are then not checked against it.
    """
    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(read_header(file).shapes)
    return shapes


def check_full_update(header: Header, base: dict[str, tuple[int, ...]] | None) -> None:
    """Refuse an update of model tensors that vLLM could not load whole.

    Args:
        header: the pushed file's header.
        base: the starting model's shapes (None: nothing to check against).

    Raises:
        PayloadError: no tensors, a name the model does not have, or a shape that differs.
    """
    if not header.shapes:
        raise PayloadError("the payload holds no tensors")
    for name, dtype in header.dtypes.items():
        if not dtype.startswith(("F", "BF")):
            raise PayloadError(f"tensor {name!r} has dtype {dtype}; push floating-point weights")
    if base is None:
        return
    unknown = sorted(n for n in header.shapes if n not in base)
    if unknown:
        raise PayloadError(
            f"{len(unknown)} tensor(s) are not in this node's model (e.g. "
            f"{', '.join(unknown[:NAMES_SHOWN])}): the trainer and the node must start from the "
            "same model (atropos-inference-node --model), and tied copies (lm_head) are not sent")
    wrong = [f"{n} {list(header.shapes[n])} (model: {list(base[n])})"
             for n in sorted(header.shapes) if header.shapes[n] != base[n]]
    if wrong:
        raise PayloadError(f"{len(wrong)} tensor(s) have the wrong shape: "
                           f"{'; '.join(wrong[:NAMES_SHOWN])}")


def adapter_config(header: Header) -> str:
    """The ``adapter_config.json`` text a LoRA push carries in its safetensors metadata.

    Raises:
        PayloadError: no adapter config, or one that is not a JSON object.
    """
    text = header.metadata.get(ADAPTER_CONFIG_KEY)
    if not text:
        raise PayloadError(f"a LoRA push must carry adapter_config.json in the safetensors "
                           f"metadata key {ADAPTER_CONFIG_KEY!r}")
    try:
        if not isinstance(json.loads(text), dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise PayloadError(f"{ADAPTER_CONFIG_KEY} is not a JSON object ({exc})") from None
    if not header.shapes:
        raise PayloadError("the adapter holds no tensors")
    return text


__all__ = ["Header", "PayloadError", "adapter_config", "check_full_update", "model_tensor_shapes",
           "read_header"]
