"""ASGI middleware of the API: auth, body-size caps, request gunzip, and selective response gzip.

Pure ASGI (no ``BaseHTTPMiddleware``) so the hot paths pay one function call each.
"""

from __future__ import annotations

import secrets
import zlib
from typing import Any

import orjson
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Paths readable without the bearer token (``GET /`` and the interactive docs).
PUBLIC_PATHS = frozenset({"/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
#: State-changing GETs (kept as GET for wire compatibility) refused from other sites' pages.
CSRF_GUARDED = frozenset({"/reset_data"})


async def _reply(send: Send, status: int, body: bytes, content_type: bytes,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                    *(headers or [])],
    })
    await send({"type": "http.response.body", "body": body})


async def _json_error(send: Send, status: int, detail: str,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await _reply(send, status, orjson.dumps({"detail": detail}), b"application/json", headers)


def gunzip(data: bytes, limit: int) -> bytes:
    """Inflate a gzip body (several concatenated members allowed), refusing to exceed ``limit``.

    Args:
        data: the gzip bytes as received.
        limit: most bytes the inflated body may have.

    Returns:
        The inflated bytes.

    Raises:
        ValueError: bad or truncated gzip data.
        OverflowError: the inflated body would exceed ``limit`` bytes.
    """
    out = bytearray()
    while data:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(data, limit - len(out) + 1)
        except zlib.error as exc:
            raise ValueError(str(exc)) from exc
        if len(out) > limit:
            raise OverflowError(limit)
        if not inflater.eof:
            raise ValueError("truncated gzip stream")
        data = inflater.unused_data
    return bytes(out)


class RequestGuard:
    """Bearer auth, body caps and gunzip, applied before anything reads the body.

    * With an API key, every path but ``GET /`` and the docs needs
      ``Authorization: Bearer <key>`` (401 otherwise).
    * ``GET /reset_data`` from another site's web page (``Sec-Fetch-Site`` cross-site or
      same-site) is refused with 403, so a link or ``<img>`` cannot wipe the queue.
    * Bodies over ``max_body_bytes`` (as sent) or ``max_decompressed_bytes`` (after gunzip)
      get 413; a body with a ``Content-Encoding`` containing ``gzip`` (any case, so also
      ``x-gzip``) is inflated, and bad or truncated gzip gets 400 ``Invalid gzip payload``.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int,
                 max_decompressed_bytes: int):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body = max_body_bytes
        self.max_inflated = max_decompressed_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check auth and caps, inflate the body if gzipped, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers[k] = v
        path = scope["path"]
        if self.expected is not None and path not in PUBLIC_PATHS and scope["method"] != "OPTIONS":
            given = headers.get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                await _json_error(send, 401, "missing or wrong bearer token: send the header "
                                  "'Authorization: Bearer <key>' with the key run-api was started "
                                  "with (--api-key or $ATROPOS_API_KEY)",
                                  [(b"www-authenticate", b"Bearer")])
                return
        if path in CSRF_GUARDED and headers.get(b"sec-fetch-site") in (b"cross-site", b"same-site"):
            await _json_error(send, 403, f"{path} refused from a browser page of another site; "
                              "call it from a script or curl")
            return
        length = headers.get(b"content-length")
        if length is None and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)
            return
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await _json_error(send, 413, f"request body of {int(length)} bytes exceeds "
                              f"--max-body-bytes {self.max_body}; send smaller requests (e.g. one "
                              "group per POST) or raise the limit")
            return
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _json_error(send, 413, f"request body exceeds --max-body-bytes "
                                  f"{self.max_body}; send smaller requests or raise the limit")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        encoding = headers.get(b"content-encoding", b"").lower()
        new_headers = scope["headers"]
        if b"gzip" in encoding:
            if body:
                try:
                    body = gunzip(body, self.max_inflated)
                except OverflowError:
                    await _json_error(send, 413, "gzip body inflates past --max-decompressed-bytes "
                                      f"{self.max_inflated}; send smaller requests or raise the limit")
                    return
                except ValueError:
                    await _reply(send, 400, b"Invalid gzip payload", b"text/plain; charset=utf-8")
                    return
            new_headers = [(k, v) for k, v in scope["headers"]
                           if k not in (b"content-encoding", b"content-length", b"transfer-encoding")]
            new_headers.append((b"content-length", str(len(body)).encode()))
        scope = {**scope, "headers": new_headers}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class SelectiveGZip:
    """Starlette's GZipMiddleware, except for the paths in ``skip``.

    Bodies of at least 1000 bytes are gzipped when the client accepts gzip; ``/batch`` is skipped
    by default because compressing it costs more time than it saves on a LAN.
    """

    def __init__(self, app: ASGIApp, skip: frozenset[str], level: int, minimum_size: int = 1000):
        self.app = app
        self.skip = skip
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size, compresslevel=level)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> Any:
        """Gzip the response unless the path is skipped."""
        if scope["type"] == "http" and scope["path"] not in self.skip:
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)
