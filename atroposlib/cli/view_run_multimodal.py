"""Atropos 0.4's multimodal run viewer, kept at its import path.

``view-run`` (:mod:`atroposlib.cli.view_run`) shows multimodal groups too (image parts of chat
messages are rendered in the page), so ``main`` here is ``view-run``'s. The two helpers that
pull an image and the text out of a message's serialised content are kept for code that used
them.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import sys
from typing import Any

from atroposlib.cli.view_run import main

_DATA_URL = re.compile(r"data:image/(?:jpeg|jpg|png|gif|webp);base64,([A-Za-z0-9+/=]+)")


def extract_image_from_chat(chat_text: str) -> Any:
    """The first base64 ``data:image/...`` URL in ``chat_text``, decoded as a PIL image.

    Args:
        chat_text: a message's content as text (e.g. its JSON content parts).

    Returns:
        A ``PIL.Image.Image``, or None when there is no such URL or it does not decode to an
        image (jpeg, png, gif or webp).

    Raises:
        ImportError: Pillow is not installed (it comes with the ``tools`` extra).
    """
    import PIL.Image

    match = _DATA_URL.search(chat_text)
    if match is None:
        return None
    try:
        image = PIL.Image.open(io.BytesIO(base64.b64decode(match.group(1))))
        image.load()
    except (binascii.Error, OSError, ValueError):
        return None
    return image


def extract_text_from_chat(chat_text: str) -> str:
    """The text of a message whose content may be multimodal.

    Args:
        chat_text: a message's content as text: JSON content parts
            (``[{"type": "text", "text": ...}, {"type": "image_url", ...}]``), text after an
            ``[Image]`` marker, or plain text.

    Returns:
        The text parts joined with newlines; else what follows ``[Image]``; else ``chat_text``.
    """
    try:
        parts = json.loads(chat_text)
    except ValueError:
        parts = None
    if isinstance(parts, dict):
        parts = [parts]
    if isinstance(parts, list):
        texts = [p["text"] for p in parts
                 if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)]
        if texts:
            return "\n".join(texts)
    if "[Image]" in chat_text:
        return chat_text.split("[Image]", 1)[1].strip()
    return chat_text


__all__ = ["extract_image_from_chat", "extract_text_from_chat", "main"]

if __name__ == "__main__":
    sys.exit(main())
