"""NodeMiddleware: the ASGI middleware vLLM's own server loads to become an inference node.

``atropos-inference-node`` starts vLLM with ``--middleware
atroposlib.inference.node.middleware.NodeMiddleware``; vLLM adds it outermost, so it sees every
request first and:

* checks the bearer token (every route but ``GET /health``) when the node has an API key;
* answers ``/atropos/*`` itself (:func:`~atroposlib.inference.node.factory.build_app`);
* passes every other POST (completions, chat ...) through the gate of
  :class:`~atroposlib.inference.node.state.NodeState`: held while an update is applied, refused
  with 503 and ``Retry-After`` while the node has no weights, and answered with the header
  ``X-Atropos-Policy-Version`` naming the weights that served it.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atroposlib.inference.node.models import POLICY_VERSION_HEADER
from atroposlib.inference.node.settings import NodeSettings
from atroposlib.inference.node.state import NodeState

#: GET routes answered without the bearer token (for load balancers and orchestrators).
PUBLIC_PATHS = frozenset({"/health", "/ping"})
#: Prefix of the node's own routes.
NODE_PREFIX = "/atropos/"


async def _json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


class NodeMiddleware:
    """Auth, the node's routes, and the policy-version gate in front of vLLM's OpenAI server.

    Args:
        app: the next ASGI app (vLLM's middleware stack and routes).
        settings: the node's settings; None reads them from ``$ATROPOS_INFERENCE_NODE_CONFIG``
            (how vLLM, which passes only ``app``, creates it).
        state: an existing state (tests); default a new one from ``settings``.
    """

    def __init__(self, app: ASGIApp, settings: NodeSettings | None = None,
                 state: NodeState | None = None):
        from atroposlib.inference.node.factory import build_app

        self.app = app
        self.settings = settings or NodeSettings.from_env()
        self.state = state or NodeState(self.settings)
        self.node_app = build_app(self.state)
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else None
        self.expected = f"Bearer {key}".encode() if key else None

    def _authorized(self, scope: Scope) -> bool:
        if self.expected is None:
            return True
        if scope["method"] in ("GET", "HEAD") and scope["path"] in PUBLIC_PATHS:
            return True
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return secrets.compare_digest(given, self.expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one request: refuse, answer it here, gate it, or pass it on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.state.bind(scope.get("app"))
        if not self._authorized(scope):
            await _json(send, 401, {"error": {
                "message": "missing or wrong bearer token: send 'Authorization: Bearer <key>' "
                           "with the key the node was started with ($ATROPOS_API_KEY, "
                           "--api-key-file or --api-key); for an OpenAI client that is its "
                           "api_key", "type": "Unauthorized", "code": 401}},
                        [(b"www-authenticate", b"Bearer")])
            return
        if scope["path"].startswith(NODE_PREFIX):
            await self.node_app(dict(scope), receive, send)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        await self._gated(scope, receive, send)

    async def _gated(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = await self.state.admit()
        if version is None:
            why = ("this node has not received weights from a trainer yet (start the trainer "
                   "with --vllm-url pointing here, or the node with --serve-base)"
                   if self.state.state == "awaiting_weights" else
                   f"this node's last update failed: {self.state.last_error}")
            await _json(send, 503, {"error": {"message": f"{why}; retry shortly",
                                              "type": "ServiceUnavailable", "code": 503}},
                        [(b"retry-after", str(self.settings.retry_after_s).encode())])
            return
        tag = (POLICY_VERSION_HEADER.lower().encode(), str(version).encode())

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), tag]}
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        finally:
            self.state.release()


__all__ = ["NODE_PREFIX", "PUBLIC_PATHS", "NodeMiddleware"]
