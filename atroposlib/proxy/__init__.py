"""An OpenAI-compatible HTTP proxy whose sessions are ``ManagedServer`` token trackers.

Agent frameworks that only speak the OpenAI API can still produce exact training data: each
*session* owns one :class:`~atroposlib.inference.clients.managed.ManagedServer`, the
framework points its ``base_url`` at ``http://HOST:PORT/{uuid}/v1``, and the env reads the tracked
token ids, masks and sampler log-probs back from ``GET /{uuid}/nodes``.

Launch (binds 127.0.0.1 by default; pass ``--host 0.0.0.0`` only on a trusted network, the proxy
has no authentication)::

    python -m atroposlib.proxy --config servers.json --port 9100

``servers.json`` (:class:`ProxyConfig`)::

    {"model_name": "Qwen/Qwen3-1.7B", "tokenizer_name": "Qwen/Qwen3-1.7B",
     "servers": [{"base_url": "http://127.0.0.1:9001/v1", "server_type": "vllm"}]}

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /setup``, ``GET /servers``,
``POST /sessions/create``, ``GET /sessions``, ``POST /{uuid}/v1/chat/completions``,
``POST /{uuid}/v1/chat/completions/render``, ``POST /{uuid}/v1/completions``,
``GET /{uuid}/nodes``, ``DELETE /{uuid}``. Errors use the OpenAI format
``{"error": {"message", "type", "code"}}``.

Limits: idle sessions expire (``--session-ttl``, default 1 h), the number of open
sessions is capped (``--max-sessions``, 429 beyond), bad input is a 400 that says how to fix it,
and an unknown or expired uuid is a 404. Calls within one session are serialised (the node list
is shared state); use one session per rollout for parallelism.

Client side: :func:`~atroposlib.inference.clients.proxy_session.create_proxy_session` /
:class:`~atroposlib.inference.clients.proxy_session.ProxyManagedServer` (with the other
inference clients) give an env the same ``chat_completion(...)`` + ``get_state()["nodes"]``
interface as a local ``ManagedServer``.

Layout: ``models`` (config and wire types), ``errors``, ``state`` (backends and sessions),
``routes/`` (one router per resource), ``app`` (the ``create_app`` factory), ``run_proxy`` /
``__main__`` (the command).
``atroposlib.compat.managed_server_proxy`` re-exports the public names under the
Atropos 0.4 import path (and ``python -m`` on it runs the same command).
"""
