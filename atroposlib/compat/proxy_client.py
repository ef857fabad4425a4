"""The ManagedServer proxy's client under its Atropos 0.4 import path.

:class:`ProxyManagedServer` (a ``ManagedServer`` look-alike that talks to a running proxy over
HTTP) and :func:`create_proxy_session` live in :mod:`atroposlib.inference.clients.proxy_session`;
this module re-exports them. The OpenAI types and ``SequenceNode`` that Atropos 0.4's module
imported load on first access.
"""

from __future__ import annotations

from atroposlib.inference.clients.proxy_session import ProxyManagedServer, create_proxy_session

__all__ = ["ProxyManagedServer", "create_proxy_session"]
