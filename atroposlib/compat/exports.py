"""Names that Atropos 0.4's ``envs/base.py`` imported and env code sometimes imports from there.

Each is loaded from its home on first access (:func:`~atroposlib.utils.lazy_exports.lazy_exports`),
so importing :mod:`atroposlib.envs.base` stays cheap: no transformers, tenacity or rich until one
of these names is asked for. ``envs/base.py`` uses :data:`base_getattr` as its module
``__getattr__``.
"""

from __future__ import annotations

from atroposlib.utils.lazy_exports import SERVER_MODULE_EXPORTS, lazy_exports

#: Upstream name -> its home here (``"module"`` or ``"module:attribute"``).
BASE_EXPORTS = {
    "APIServer": "atroposlib.inference.clients.base",
    "AutoTokenizer": "transformers",
    "BaseModel": "pydantic",
    "Field": "pydantic",
    "retry": "tenacity",
    "stop_after_attempt": "tenacity",
    "wait_random_exponential": "tenacity",
    "rprint": "rich:print",
    "ENV_NAMESPACE": "atroposlib.envs.constants",
    "NAMESPACE_SEP": "atroposlib.envs.constants",
    "OPENAI_NAMESPACE": "atroposlib.envs.constants",
    "Message": "atroposlib.type_definitions",
    "UUID": "atroposlib.type_definitions",
    "get_std_min_max_avg": "atroposlib.utils.metrics",
    "parse_http_response": "atroposlib.utils.io",
    "resolve_openai_configs": "atroposlib.inference.clients.openai_client",
    "generate_html": "atroposlib.frontend.jsonl2html",
    "TypedDict": "typing_extensions",
    "extract_namespace": "atroposlib.utils.flags",
    "get_double_dash_flags": "atroposlib.utils.flags",
    "get_prefixed_pydantic_model": "atroposlib.utils.flags",
    "merge_dicts": "atroposlib.utils.flags",
}


base_getattr = lazy_exports("atroposlib.envs.base", BASE_EXPORTS)
"""The ``__getattr__`` of :mod:`atroposlib.envs.base` (PEP 562)."""

__all__ = ["BASE_EXPORTS", "SERVER_MODULE_EXPORTS", "base_getattr"]
