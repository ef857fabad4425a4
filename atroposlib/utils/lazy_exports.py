"""Names kept at Atropos 0.4's import paths without importing their homes up front.

Upstream modules re-exported many names they merely imported (``envs.base`` exposed
``AutoTokenizer``, ``retry``, ``rprint`` ...). Code written against Atropos 0.4 sometimes imports
them from there. :func:`lazy_exports` gives a module a PEP 562 ``__getattr__`` that resolves such
a name from its real home on first access, so ``import atroposlib.envs.base`` stays as cheap as
before (no ``transformers`` / ``fastapi`` / ``wandb`` import until a name that needs one is used).

Example::

    __getattr__ = lazy_exports(__name__, {
        "AutoTokenizer": "transformers",               # same name in its home module
        "LegacyFunctionWrapper": "atroposlib.rewards.registry:_FunctionReward",
    })
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    module_name: str,
    exports: Mapping[str, str],
    fallback: Callable[[str], Any] | None = None,
) -> Callable[[str], Any]:
    """Build a module ``__getattr__`` that imports each name of ``exports`` when first asked.

    Args:
        module_name: ``__name__`` of the module that gets the ``__getattr__``; a resolved name
            is cached in that module's globals, so later accesses are plain lookups.
        exports: public name -> ``"home.module"`` (same attribute name there) or
            ``"home.module:attribute"`` (a different name there).
        fallback: called with names not in ``exports`` (for a module that already had its
            own ``__getattr__``); without it such names raise ``AttributeError``.

    Returns:
        The function to assign to the module's ``__getattr__``.

    Raises (from the returned function):
        AttributeError: the name is not exported (the usual message for a missing attribute).
        ImportError: the home module cannot be imported (e.g. an optional dependency is not
            installed); the message says which upstream name needed it.
    """
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        spec = table.get(name)
        if spec is None:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        home, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(home)
        except ImportError as exc:
            raise ImportError(
                f"{module_name}.{name} (kept for Atropos 0.4 code) lives in {home!r}, which "
                f"failed to import: {exc}"
            ) from exc
        value = getattr(module, attr or name)
        setattr(sys.modules[module_name], name, value)
        return value

    __getattr__.exports = table  # type: ignore[attr-defined] - lets tests list the names
    return __getattr__


#: The ``openai`` response types Atropos 0.4's inference modules imported at module level.
OPENAI_RESPONSE_TYPES = {
    "ChatCompletion": "openai.types.chat.chat_completion",
    "ChatCompletionMessage": "openai.types.chat.chat_completion",
    "Choice": "openai.types.chat.chat_completion",
    "Completion": "openai.types.completion",
    "CompletionChoice": "openai.types.completion",
}

#: What Atropos 0.4's server modules (``openai_server``, ``vllm_server``, ``sglang_server`` ...)
#: imported at module level, besides their own classes.
SERVER_MODULE_EXPORTS = {
    **OPENAI_RESPONSE_TYPES,
    "APIServer": "atroposlib.inference.clients.base",
    "AutoTokenizer": "transformers",
    "NAMESPACE_SEP": "atroposlib.envs.constants",
    "OPENAI_NAMESPACE": "atroposlib.envs.constants",
}

__all__ = ["OPENAI_RESPONSE_TYPES", "SERVER_MODULE_EXPORTS", "lazy_exports"]
