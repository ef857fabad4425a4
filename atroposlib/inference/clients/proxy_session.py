"""The ManagedServer proxy's client: one proxy session used over HTTP (httpx, async).

:func:`create_proxy_session` opens a session and returns a :class:`ProxyManagedServer`, which
gives an env the same ``chat_completion(...)`` + ``get_state()["nodes"]`` interface as a local
``ManagedServer``. ``ServerManager.managed_server()`` uses it when a proxy URL is configured;
this module does not import the server manager (nor FastAPI).
"""

from __future__ import annotations

from typing import Any

from atroposlib.errors import ProxyError


def _raise_for_error(response: Any) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {"message": response.text}
    raise ProxyError(response.status_code, str(error.get("message")), error.get("type"),
                     error.get("code"))


class ProxyManagedServer:
    """A ``ManagedServer`` living in a proxy session, used over HTTP (httpx, async).

    Same interface as a local ``ManagedServer``: ``await chat_completion(...)`` /
    ``await completion(...)`` return ``openai`` objects, and ``get_state()["nodes"]`` holds the
    tracked :class:`SequenceNode` s (refreshed after every call; ``await fetch_state()`` to
    refresh explicitly). Close with ``await aclose()`` (deletes the session) or use
    ``async with``.
    """

    def __init__(self, proxy_url: str, session: dict[str, Any], client: Any = None,
                 timeout: float = 1200.0):
        """Wrap an existing session.

        Args:
            proxy_url: proxy root, e.g. ``http://127.0.0.1:9100``.
            session: the ``POST /sessions/create`` answer (needs ``uuid``).
            client: an ``httpx.AsyncClient`` to share; default: own client.
            timeout: seconds per request (generations can be long).
        """
        import httpx

        self.proxy_url = proxy_url.rstrip("/")
        self.session = dict(session)
        self.uuid: str = session["uuid"]
        self._owns_client = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout)
        self._nodes: list[Any] = []
        self._tree: dict[str, Any] | None = None

    @property
    def base_url(self) -> str:
        """OpenAI ``base_url`` of this session, for agent frameworks (``.../{uuid}/v1``)."""
        return f"{self.proxy_url}/{self.uuid}/v1"

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post(f"{self.proxy_url}/{self.uuid}{path}", json=body)
        _raise_for_error(response)
        return response.json()

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Chat completion through the proxy; returns an ``openai`` ``ChatCompletion``.

        Args:
            **kwargs: ``messages`` (required), ``n``, ``max_tokens``, ``temperature``, ``stop``,
                ``tools``, ``tool_choice``; ``split`` is accepted and ignored.

        Raises:
            ProxyError: 400 bad input, 404 unknown/expired session, 5xx backend failure.
        """
        from openai.types.chat import ChatCompletion

        kwargs.pop("split", None)
        data = await self._post("/v1/chat/completions", kwargs)
        await self.fetch_state()
        return ChatCompletion.model_validate(data)

    async def completion(self, **kwargs: Any) -> Any:
        """Text completion through the proxy; returns an ``openai`` ``Completion``.

        Raises:
            ProxyError: as :meth:`chat_completion`.
        """
        from openai.types import Completion

        kwargs.pop("split", None)
        data = await self._post("/v1/completions", kwargs)
        await self.fetch_state()
        return Completion.model_validate(data)

    async def render(self, messages: list[dict[str, Any]], tools: Any = None) -> dict[str, Any]:
        """``{prompt_text, token_ids, num_tokens}`` for ``messages`` (nothing is generated)."""
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        return await self._post("/v1/chat/completions/render", body)

    async def fetch_state(self) -> dict[str, Any]:
        """Download the tracked nodes and return :meth:`get_state`.

        Raises:
            ProxyError: the session is gone (404).
        """
        from atroposlib.inference.clients.managed import SequenceNode

        response = await self.client.get(f"{self.proxy_url}/{self.uuid}/nodes")
        _raise_for_error(response)
        data = response.json()
        self._nodes = [SequenceNode(**node) for node in data["nodes"]]
        self._tree = data.get("tree")
        return self.get_state()

    def get_state(self) -> dict[str, Any]:
        """``{"nodes": [SequenceNode, ...]}`` as of the last call (tree sessions: also "tree")."""
        state: dict[str, Any] = {"nodes": list(self._nodes)}
        if self._tree is not None:
            state["tree"] = dict(self._tree)
        return state

    def reset(self) -> None:
        """Forget the local copy of the nodes (the proxy session keeps its own until deleted)."""
        self._nodes, self._tree = [], None

    async def aclose(self) -> None:
        """Delete the session on the proxy (a session already gone is fine) and close the client."""
        try:
            response = await self.client.delete(f"{self.proxy_url}/{self.uuid}")
            if response.status_code != 404:
                _raise_for_error(response)
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def __aenter__(self) -> ProxyManagedServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def create_proxy_session(
    proxy_url: str,
    tool_parser: str | None = "hermes",
    track_tree: bool = False,
    base_url: str | None = None,
    client: Any = None,
    timeout: float = 1200.0,
    preserve_think_blocks: bool = False,
) -> ProxyManagedServer:
    """Open a session on a running proxy and return its client.

    Args:
        proxy_url: proxy root, e.g. ``http://127.0.0.1:9100``.
        tool_parser: ``"hermes"`` (default) or None.
        track_tree: tree mode (see ``ManagedServer``).
        base_url: pin a backend by its base URL.
        client: an ``httpx.AsyncClient`` to share.
        timeout: seconds per request.
        preserve_think_blocks: see ``ManagedServer``.

    Returns:
        A :class:`ProxyManagedServer` (delete it with ``await aclose()`` or ``async with``).

    Raises:
        ProxyError: 404 unknown ``base_url``, 429 too many sessions, 503 not configured.
    """
    import httpx

    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout)
    body = {
        "tool_parser": tool_parser,
        "track_tree": track_tree,
        "base_url": base_url,
        "preserve_think_blocks": preserve_think_blocks,
    }
    try:
        response = await http.post(f"{proxy_url.rstrip('/')}/sessions/create", json=body)
        _raise_for_error(response)
    except BaseException:
        if own:
            await http.aclose()
        raise
    proxy = ProxyManagedServer(proxy_url, response.json(), client=http, timeout=timeout)
    proxy._owns_client = own
    return proxy



__all__ = ["ProxyError", "ProxyManagedServer", "create_proxy_session"]
