"""ASGI middleware of the API: Host check, auth, JSON bodies, body caps, gunzip, response gzip.

Request bodies are gunzipped as they stream in.

Pure ASGI (no ``BaseHTTPMiddleware``) so the hot paths pay one function call each.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import orjson
from anyio import to_thread
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


#: Largest piece of inflated body produced at a time (bytes).
INFLATE_STEP_BYTES = 1 << 20
#: Methods whose body must be JSON (a cross-site page can POST ``text/plain`` without a preflight).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: Host names every server accepts in the ``Host`` header.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


class GzipInflater:
    """Incremental gunzip that refuses to inflate past a size cap.

    Feed the body as it arrives; each call yields inflated pieces of at most ``step`` bytes and
    stops with OverflowError as soon as the total passes the cap, so memory never exceeds the cap
    plus one step, however small the input. Several concatenated gzip members are allowed, as ``gzip.decompress`` does.

    Args:
        limit: most bytes the inflated body may have.
        step: largest piece yielded (bytes).
    """

    def __init__(self, limit: int, step: int = INFLATE_STEP_BYTES):
        self.limit = limit
        self.step = step
        self.size = 0
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = False  # the current member has input but has not ended yet

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Inflate ``data`` (the next bytes of the gzip stream).

        Yields:
            Inflated pieces of at most ``step`` bytes.

        Raises:
            ValueError: bad gzip data.
            OverflowError: the inflated body passed ``limit`` bytes (raised at once, before
                inflating the rest).
        """
        while data:
            self._pending = True
            try:
                out = self._inflater.decompress(data, self.step)
            except zlib.error as exc:
                raise ValueError(str(exc)) from exc
            self.size += len(out)
            if self.size > self.limit:
                raise OverflowError(self.limit)
            if out:
                yield out
            if self._inflater.eof:
                data = self._inflater.unused_data
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._pending = False
            else:
                data = self._inflater.unconsumed_tail

    def finish(self) -> None:
        """Check that the stream ended cleanly.

        Raises:
            ValueError: the last gzip member is truncated.
        """
        if self._pending:
            raise ValueError("truncated gzip stream")


def _inflate_all(inflater: GzipInflater, data: bytes) -> list[bytes]:
    return list(inflater.feed(data))


def gunzip(data: bytes, limit: int) -> bytes:
    """Inflate a whole gzip body (several concatenated members allowed), refusing to exceed ``limit``.

    Raises:
        ValueError: bad or truncated gzip data.
        OverflowError: the inflated body would exceed ``limit`` bytes.
    """
    inflater = GzipInflater(limit)
    out = b"".join(inflater.feed(data))
    inflater.finish()
    return out


def is_json_media_type(content_type: bytes) -> bool:
    """True for ``application/json`` and ``application/<x>+json`` (parameters and case ignored)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/")
                                            and media.endswith(b"+json"))


class RequestGuard:
    """Bearer auth, JSON-only bodies, body caps and gunzip, applied before anything reads the body.

    * With an API key, every path but ``GET /`` and the docs needs
      ``Authorization: Bearer <key>`` (401 otherwise).
    * ``GET /reset_data`` from another site's web page (``Sec-Fetch-Site`` cross-site or
      same-site) is refused with 403, so a link or ``<img>`` cannot wipe the queue.
    * A POST/PUT/PATCH with a body, or with a ``Content-Type``, must say ``application/json``
      (415 otherwise): browsers send ``text/plain`` or form bodies to other sites without asking
      first, JSON only after a CORS preflight that this server refuses.
    * Bodies over ``max_body_bytes`` (as sent) or ``max_decompressed_bytes`` (after gunzip)
      get 413; a body with a ``Content-Encoding`` containing ``gzip`` (any case, so also
      ``x-gzip``) is inflated as it arrives, in a worker thread (the event loop keeps serving
      others), and refused as soon as it passes the cap; bad or truncated gzip gets 400
      ``Invalid gzip payload``.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int,
                 max_decompressed_bytes: int):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body = max_body_bytes
        self.max_inflated = max_decompressed_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check auth, content type and caps, inflate the body if gzipped, then call the app."""
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
                                  "with (--api-key-file, $ATROPOS_API_KEY or --api-key)",
                                  [(b"www-authenticate", b"Bearer")])
                return
        if path in CSRF_GUARDED and headers.get(b"sec-fetch-site") in (b"cross-site", b"same-site"):
            await _json_error(send, 403, f"{path} refused from a browser page of another site; "
                              "call it from a script or curl")
            return
        length = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or (length is not None and length != b"0")
        content_type = headers.get(b"content-type")
        if scope["method"] in BODY_METHODS and (has_body or content_type is not None) and not (
                content_type is not None and is_json_media_type(content_type)):
            got = content_type.decode("latin-1") if content_type is not None else "none"
            await _json_error(send, 415, f"{scope['method']} {path} takes a JSON body: send the "
                              f"header 'Content-Type: application/json' (got {got!r}); "
                              "requests/httpx/aiohttp set it with json=...")
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await _json_error(send, 413, f"request body of {int(length)} bytes exceeds "
                              f"--max-body-bytes {self.max_body}; send smaller requests (e.g. one "
                              "group per POST) or raise the limit")
            return
        gzipped = b"gzip" in headers.get(b"content-encoding", b"").lower()
        inflater = GzipInflater(self.max_inflated) if gzipped else None
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > self.max_body:
                await _json_error(send, 413, f"request body exceeds --max-body-bytes "
                                  f"{self.max_body}; send smaller requests or raise the limit")
                return
            if inflater is None:
                if chunk:
                    chunks.append(chunk)
                continue
            try:
                # in a worker thread: zlib releases the GIL, so the event loop keeps serving
                chunks += await to_thread.run_sync(_inflate_all, inflater, chunk)
                if not more:
                    inflater.finish()
            except OverflowError:
                chunks.clear()
                await _json_error(send, 413, "gzip body inflates past --max-decompressed-bytes "
                                  f"{self.max_inflated}; send smaller requests or raise the limit")
                return
            except ValueError:
                chunks.clear()
                await _reply(send, 400, b"Invalid gzip payload", b"text/plain; charset=utf-8")
                return
        if inflater is not None:
            new_headers = [(k, v) for k, v in scope["headers"]
                           if k not in (b"content-encoding", b"content-length", b"transfer-encoding")]
            new_headers.append((b"content-length", str(inflater.size).encode()))
            scope = {**scope, "headers": new_headers}
        pending = chunks or [b""]
        index = 0

        async def replay() -> Message:
            nonlocal index
            if index < len(pending):
                body = pending[index]
                pending[index] = b""  # the app keeps its own reference; drop ours
                index += 1
                return {"type": "http.request", "body": body, "more_body": index < len(pending)}
            return await receive()

        await self.app(scope, replay, send)


class GZipRequestMiddleware:
    """Gunzip request bodies sent with ``Content-Encoding: gzip`` (Atropos 0.4's middleware).

    Only the gunzip part of :class:`RequestGuard` (which the API's own app uses): no auth, no
    content-type or size checks on plain bodies. For mounting on other ASGI apps that receive
    gzipped JSON from Atropos clients.

    Args:
        app: the ASGI app to wrap.
        max_decompressed_bytes: largest inflated body; past it the request gets 413.

    A gzipped body is read whole, inflated in a worker thread and handed to ``app`` with the
    ``content-encoding`` header removed and ``content-length`` set to the inflated size. Bad or
    truncated gzip gets 400 ``Invalid gzip payload``.
    """

    def __init__(self, app: ASGIApp, max_decompressed_bytes: int = 256 * 2**20):
        self.app = app
        self.max_inflated = max_decompressed_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Inflate a gzipped HTTP request body, then call the app."""
        if scope["type"] != "http" or not any(
                k == b"content-encoding" and b"gzip" in v.lower() for k, v in scope["headers"]):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        try:
            body = await to_thread.run_sync(gunzip, b"".join(chunks), self.max_inflated)
        except OverflowError:
            await _json_error(send, 413, f"gzip body inflates past {self.max_inflated} bytes")
            return
        except ValueError:
            await _reply(send, 400, b"Invalid gzip payload", b"text/plain; charset=utf-8")
            return
        headers = [(k, v) for k, v in scope["headers"]
                   if k not in (b"content-encoding", b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)


class HostGuard:
    """Serve only requests whose ``Host`` header names this server (DNS-rebinding guard).

    A web page on a name the attacker controls can make that name resolve to 127.0.0.1, and the
    browser then sends ``Host: <that name>``; such requests get 400 with a message naming the
    ``--allowed-hosts`` flag. A missing Host header (HTTP/1.0 scripts) is accepted.

    Args:
        app: the ASGI app to protect.
        allowed_hosts: host names or IP addresses (no port; case-insensitive), ``*.example.com``
            for a domain and its subdomains, or ``*`` to accept any host.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]):
        self.app = app
        names = {h.strip().lower().strip("[]") for h in allowed_hosts if h.strip()}
        self.allow_any = "*" in names
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))
        self.names = frozenset(n for n in names if not n.startswith("*"))

    @staticmethod
    def hostname(host_header: str) -> str | None:
        """The lower-case host of ``name[:port]`` or ``[v6]:port`` (None when malformed)."""
        try:
            return urlsplit("//" + host_header).hostname or None
        except ValueError:
            return None

    def allows(self, host_header: str) -> bool:
        """True when ``host_header`` (``name[:port]`` or ``[v6]:port``) names an allowed host."""
        if self.allow_any:
            return True
        host = self.hostname(host_header)
        if host is None:
            return False
        return host in self.names or any(host.endswith(s) or host == s[1:] for s in self.suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 400 for a foreign Host header, else call the app."""
        if scope["type"] in ("http", "websocket") and not self.allow_any:
            host = next((v for k, v in scope["headers"] if k == b"host"), None)
            if host is not None and not self.allows(host.decode("latin-1")):
                shown = host.decode("latin-1")[:100]
                name = self.hostname(shown) or shown
                await _json_error(send, 400, f"Host {shown!r} is not served here: this run-api "
                                  f"answers to {', '.join(sorted(self.names))}; start it with "
                                  f"--allowed-hosts {name} to accept that name")
                return
        await self.app(scope, receive, send)


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
