"""The inference node: vLLM on one host, updated by a trainer on another host over HTTP, no shared disk.

``atropos-inference-node`` (:mod:`atroposlib.cli.inference_node`) starts vLLM's OpenAI server
on this host. A trainer pushes each new policy to ``PUT /atropos/weights`` (a safetensors body
with its sha-256); the node checks it, writes it to its own disk, loads it into vLLM in place
and from then on tags every completion with ``X-Atropos-Policy-Version``. See
``docs/inference-node.md`` for running one.

Why inside vLLM's server rather than in front of it
---------------------------------------------------
The node could have been a proxy owning the public port, with vLLM behind it on a private one.
It is instead an ASGI middleware that vLLM's own server loads (vLLM's ``--middleware`` option),
so there is one process and one port, and:

* the weight update calls vLLM's engine directly (``pause_generation`` / ``collective_rpc
  ("reload_weights")`` / ``reset_prefix_cache`` / ``resume_generation``, the methods behind
  vLLM's own routes), so vLLM's unauthenticated development routes (``VLLM_SERVER_DEV_MODE``)
  stay off, which matters on a node reachable from other hosts;
* completions are not copied through a second HTTP hop (streams included);
* the node's routes, auth and gate still live in our code: a FastAPI app of their own
  (:func:`~atroposlib.inference.node.factory.build_app`, one router per resource, wire types in
  :mod:`~atroposlib.inference.node.models`, settings in
  :class:`~atroposlib.inference.node.settings.NodeSettings`), dispatched by the middleware.

The price is coupling to vLLM's in-process engine API (written against vLLM 0.32, all calls in
:mod:`~atroposlib.inference.node.engine`) and one API-server process per node (vLLM's default;
with ``--api-server-count > 1`` each process would keep its own version and gate).

Honest policy versions
----------------------
An update closes the node's gate (new completions wait), lets the completions in flight finish
on the old weights, pauses vLLM, loads, drops the prefix cache, then opens the gate with the new
version. No completion ever straddles two versions, so the header of each response is the
version of the weights that produced it (:mod:`~atroposlib.inference.node.state` runs the update,
:mod:`~atroposlib.inference.node.gate` is the gate, :mod:`~atroposlib.inference.node.restore`
puts the last good weights back after a failed load).
"""

from __future__ import annotations

__all__: list[str] = []
