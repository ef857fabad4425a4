"""The bearer-token scheme every atroposlib server shares: a flag, a key file, or ``$ATROPOS_API_KEY``."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable holding the bearer token when neither a key nor a key file is given.
API_KEY_ENV = "ATROPOS_API_KEY"


def resolve_api_key(api_key: str | None, api_key_file: Path | None) -> str | None:
    """Return the effective bearer token of a server or client.

    Order: ``api_key``, else ``api_key_file``'s content (surrounding whitespace stripped), else
    ``$ATROPOS_API_KEY``, else None (no authentication).

    Args:
        api_key: the token given as a flag or setting (None: not given; settings refuse "").
        api_key_file: a file holding the token (keep it ``chmod 600``).

    Raises:
        ValueError: ``api_key_file`` cannot be read or holds only whitespace, or
            ``$ATROPOS_API_KEY`` is set but blank (which would quietly turn authentication off).
    """
    if api_key is not None:
        return api_key
    if api_key_file is not None:
        try:
            key = Path(api_key_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"--api-key-file {api_key_file}: {exc.strerror}") from None
        if not key:
            raise ValueError(f"--api-key-file {api_key_file} is empty; write the token into it")
        return key
    key = os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"${API_KEY_ENV} is set but empty: set it to the token, or unset it "
                         "to run without authentication")
    return key or None


__all__ = ["API_KEY_ENV", "resolve_api_key"]
