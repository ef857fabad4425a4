"""``load_tokenizer``: the one way the library loads a Hugging Face tokenizer.

Lazy (``transformers`` is imported on the first call, not with this module), ``~`` in a
directory path is expanded, and a failure says how to fix it: offline runs (``HF_HUB_OFFLINE=1``)
need a local tokenizer directory or one already in the HF cache.

``AutoTokenizer`` imports torch (its model-type dispatch reads the model config, which pulls in
generation code): about 330 MB of resident memory in a process that only tokenizes, such as an
environment. A local directory whose ``tokenizer_config.json`` names ``TokenizersBackend`` (what
transformers 5 writes for a plain fast tokenizer) and no custom code is loaded with that class
directly, which is what ``AutoTokenizer`` returns for it, without torch.
"""

from __future__ import annotations

import os
from typing import Any

#: The fix suggested when a tokenizer cannot be loaded.
LOAD_HINT = ("pass a local tokenizer directory, e.g. the bundled model's (`atropos-bundled-model` "
             "prints its path), or a hub id that is already in the HF cache when offline")


def load_tokenizer(
    name: str | os.PathLike[str], what: str = "tokenizer", auto_tokenizer: Any = None
) -> Any:
    """Load ``transformers.AutoTokenizer.from_pretrained(name)``.

    Args:
        name: a local tokenizer (or model) directory, ``~`` allowed, or a hub id.
        what: what the tokenizer is for, used in the error (e.g. ``"teacher tokenizer"``).
        auto_tokenizer: the class whose ``from_pretrained`` loads it (default
            ``transformers.AutoTokenizer``; a module that keeps its own ``AutoTokenizer`` name
            passes it, so patching that name takes effect).

    Returns:
        The ``PreTrainedTokenizerBase``.

    Raises:
        OSError: it cannot be loaded (not a directory with tokenizer files, and not in the HF
            cache or reachable); the message names ``name`` and the fix.
    """
    path = os.path.expanduser(os.fspath(name))
    try:
        if auto_tokenizer is None and _plain_fast_tokenizer(path):
            from transformers.tokenization_utils_tokenizers import TokenizersBackend

            return TokenizersBackend.from_pretrained(path)
        if auto_tokenizer is None:
            from transformers import AutoTokenizer as auto_tokenizer

        return auto_tokenizer.from_pretrained(path)
    except OSError as exc:
        raise OSError(f"cannot load {what} {os.fspath(name)!r}: {exc}; {LOAD_HINT}") from exc


def _plain_fast_tokenizer(path: str) -> bool:
    """Whether ``path`` is a local directory with a plain ``TokenizersBackend`` tokenizer."""
    import json

    config = os.path.join(path, "tokenizer_config.json")
    if not (os.path.isfile(config) and os.path.isfile(os.path.join(path, "tokenizer.json"))):
        return False
    try:
        with open(config, encoding="utf-8") as handle:
            settings = json.load(handle)
    except (OSError, ValueError):
        return False
    return settings.get("tokenizer_class") == "TokenizersBackend" and "auto_map" not in settings


__all__ = ["LOAD_HINT", "load_tokenizer"]
