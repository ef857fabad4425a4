"""Atropos 0.4's import surface: one table, served by one import hook.

Env code written for Atropos 0.4 imports from that release's module paths, and sometimes imports
a name from a module that merely imported it there (``from
atroposlib.envs.server_handling.openai_server import ChatCompletion``). Both are kept here,
without a file per old path and without a table at the foot of each module:

* :data:`MOVED` maps an old module path to the module that holds its code now. Importing the old
  path gives *the same module object* (``sys.modules`` holds it under both names), so
  ``isinstance`` checks, pickles and ``monkeypatch.setattr("OLD.NAME", ...)`` all act on the code
  that runs. An old package's submodules follow it (``atroposlib.envs.reward_fns.registry`` is
  ``atroposlib.rewards.registry``), and ``python -m OLD`` runs the new module.
* :data:`NAMES` lists, per old module path, the names that module imported and re-exposed. Each
  resolves from its home on first access (a module ``__getattr__``, PEP 562), so importing the
  module stays as cheap as without them: no ``transformers``, ``openai`` or ``fastapi`` until a
  name that needs one is asked for.

:class:`AliasFinder` does both. :func:`install` puts it at the front of ``sys.meta_path``;
``import atroposlib`` calls it, so every ``atroposlib.*`` import sees it. The hook costs one
string test for an import outside ``atroposlib`` and a dictionary look-up inside it.

The approach (a meta-path finder that is also the loader, returning the target module object
from ``create_module``) is the one verifiers uses for its legacy module paths.
"""

import sys

# ``import atroposlib`` runs this module: importlib, typing and __future__ are not imported here
# at run time (annotations naming them are strings).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

_SH = "atroposlib.envs.server_handling."
_CL = "atroposlib.inference.clients."

#: Old module path -> the module that holds its code now. An old *package* maps to a package; its
#: submodules map to the new package's submodules of the same name.
MOVED: dict[str, str] = {
    _SH + "server_baseline": _CL + "base",
    _SH + "openai_server": _CL + "openai_client",
    _SH + "vllm_server": _CL + "vllm_client",
    _SH + "sglang_server": _CL + "sglang_client",
    _SH + "trl_vllm_server": _CL + "trl_vllm_client",
    _SH + "server_manager": _CL + "manager",
    _SH + "managed_server": _CL + "managed",
    _SH + "tool_call_translator": _CL + "tool_call_translator",
    _SH + "server_harness": "atroposlib.testing.server_harness",
    _SH + "managed_server_proxy": "atroposlib.compat.managed_server_proxy",
    _SH + "proxy_client": "atroposlib.compat.proxy_client",
    "atroposlib.envs.reward_fns": "atroposlib.rewards",
    "atroposlib.utils.cli": "atroposlib.utils.flags",
    # atroposlib's own earlier path of the zero-variance filter (ZeroVarianceFilter, item_key)
    "atroposlib.envs.prompt_filter": "atroposlib.envs.item_filter",
}

#: OpenAI's response types, which Atropos 0.4's inference modules imported at module level.
_OPENAI_TYPES = {
    "ChatCompletion": "openai.types.chat.chat_completion",
    "ChatCompletionMessage": "openai.types.chat.chat_completion",
    "Choice": "openai.types.chat.chat_completion",
    "Completion": "openai.types.completion",
    "CompletionChoice": "openai.types.completion",
}

#: What Atropos 0.4's server modules imported at module level, besides their own classes.
_SERVER_MODULE = {
    **_OPENAI_TYPES,
    "APIServer": _CL + "base",
    "AutoTokenizer": "transformers",
    "NAMESPACE_SEP": "atroposlib.envs.constants",
    "OPENAI_NAMESPACE": "atroposlib.envs.constants",
}

_MATH_VERIFY = {
    "parse": "math_verify",
    "verify": "math_verify",
    "LatexExtractionConfig": "math_verify",
    "NormalizationConfig": "latex2sympy2_extended",
}

#: Old module path -> {name: home}: the names that module only imported. A home is
#: ``"module"`` (same attribute name there) or ``"module:attribute"``.
NAMES: dict[str, dict[str, str]] = {
    "atroposlib.envs.base": {
        "APIServer": _CL + "base",
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
        "resolve_openai_configs": _CL + "openai_client",
        "generate_html": "atroposlib.frontend.jsonl2html",
        "TypedDict": "typing_extensions",
        "extract_namespace": "atroposlib.utils.flags",
        "get_double_dash_flags": "atroposlib.utils.flags",
        "get_prefixed_pydantic_model": "atroposlib.utils.flags",
        "merge_dicts": "atroposlib.utils.flags",
    },
    "atroposlib.envs.eval": {
        "ChatCompletion": "openai.types.chat",
        "ServerManager": _CL + "manager",
        "tqdm_asyncio": "tqdm.asyncio",
    },
    "atroposlib.envs.reward_fns.accuracy_reward": _MATH_VERIFY,
    "atroposlib.envs.reward_fns.cascading_r1_math_reward": _MATH_VERIFY,
    "atroposlib.envs.reward_fns.cosine_scaled_reward": {
        "AutoModel": "transformers",
        "AutoTokenizer": "transformers",
    },
    _SH + "server_baseline": {**_OPENAI_TYPES, "BaseModel": "pydantic", "Field": "pydantic"},
    _SH + "openai_server": _SERVER_MODULE,
    _SH + "vllm_server": _SERVER_MODULE,
    _SH + "sglang_server": _SERVER_MODULE,
    _SH + "trl_vllm_server": {
        **_OPENAI_TYPES,
        "APIServer": _CL + "base",
        "AutoTokenizer": "transformers",
    },
    _SH + "managed_server": {**_SERVER_MODULE, "BaseModel": "pydantic"},
    _SH + "server_manager": {
        **_OPENAI_TYPES,
        "DummyManagedServer": _CL + "managed",
        "ManagedServer": _CL + "managed",
        "APIServer": _CL + "base",
        "OpenAIServer": _CL + "openai_client",
        "SGLangServer": _CL + "sglang_client",
        "ServerHarness": "atroposlib.testing.server_harness",
        "TrlVllmServer": _CL + "trl_vllm_client",
        "VLLMServer": _CL + "vllm_client",
    },
    _SH + "server_harness": _OPENAI_TYPES,
    _SH + "managed_server_proxy": {
        # our own FastAPI side, loaded on first use so the client side does not import FastAPI
        "create_app": "atroposlib.proxy.app",
        "openai_error": "atroposlib.proxy.app",
        "APIServerConfig": _CL + "base",
        "BaseModel": "pydantic",
        "DummyManagedServer": _CL + "managed",
        "ManagedServer": _CL + "managed",
        "OpenAIServer": _CL + "openai_client",
        "ServerManager": _CL + "manager",
        "ToolCallTranslator": _CL + "tool_call_translator",
        "FastAPI": "fastapi",
        "HTTPException": "fastapi",
        "Request": "fastapi",
        "JSONResponse": "fastapi.responses",
    },
    _SH + "proxy_client": {
        "ChatCompletion": "openai.types.chat.chat_completion",
        "ChatCompletionMessage": "openai.types.chat.chat_completion",
        "Choice": "openai.types.chat.chat_completion",
        "Completion": "openai.types.completion",
        "SequenceNode": _CL + "managed",
    },
    "atroposlib.utils.message_history_utils": {"PreTrainedTokenizer": "transformers"},
    "atroposlib.utils.tokenize_for_trainer": {"PreTrainedTokenizer": "transformers"},
    "atroposlib.utils.tokenizers.qwen_fixed_tokenizer": {"AutoTokenizer": "transformers"},
}

_PREFIX = "atroposlib."


def target(name: str) -> str | None:
    """The module that holds the code of old path ``name``, or None when ``name`` did not move.

    ``name`` is in :data:`MOVED`, or a submodule of a package there (its new name is the new
    package's submodule of the same name).
    """
    new = MOVED.get(name)
    if new is not None:
        return new
    parent, _, child = name.rpartition(".")
    while parent:
        new = MOVED.get(parent)
        if new is not None:
            return f"{new}.{child}"
        parent, _, head = parent.rpartition(".")
        child = f"{head}.{child}"
    return None


def _home_names() -> dict[str, dict[str, str]]:
    """:data:`NAMES` keyed by the module that holds the code (the key itself when not moved)."""
    return {target(old) or old: names for old, names in NAMES.items()}


def module_getattr(module_name: str, names: dict[str, str], fallback: "Any" = None) -> "Any":
    """A module ``__getattr__`` (PEP 562) that imports each of ``names`` from its home when asked.

    Args:
        module_name: the module that gets it; a resolved name is stored in its globals, so later
            accesses are plain look-ups.
        names: name -> ``"home"`` or ``"home:attribute"``.
        fallback: the module's own ``__getattr__``, asked for every other name.

    Raises (from the returned function):
        AttributeError: not one of ``names`` (and no fallback): the usual message.
        ImportError: the home cannot be imported (an optional dependency is missing); the message
            names the Atropos 0.4 name that needed it.
    """

    def __getattr__(name: str) -> "Any":
        spec = names.get(name)
        if spec is None:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        from importlib import import_module

        home, _, attribute = spec.partition(":")
        try:
            module = import_module(home)
        except ImportError as exc:
            raise ImportError(f"{module_name}.{name} (kept for Atropos 0.4 code) lives in "
                              f"{home!r}, which failed to import: {exc}") from exc
        value = getattr(module, attribute or name)
        setattr(sys.modules[module_name], name, value)
        return value

    __getattr__.names = names  # type: ignore[attr-defined] - lets tests list them
    return __getattr__


class _NamesLoader:
    """Runs a module with its own loader, then gives it the names :data:`NAMES` lists for it.

    Anything else (``get_source``, ``get_code``, ``is_package``, resource readers) is the real
    loader's; after loading, the module's ``__loader__`` and ``__spec__.loader`` are the real
    loader again.
    """

    def __init__(self, loader: "Any", names: dict[str, str]) -> None:
        self._loader = loader
        self._names = names

    def __getattr__(self, attribute: str) -> "Any":
        return getattr(self._loader, attribute)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self._loader.create_module(spec)

    def exec_module(self, module: "ModuleType") -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        own = module.__dict__.get("__getattr__")
        module.__getattr__ = module_getattr(module.__name__, self._names, own)  # type: ignore[method-assign]


class AliasFinder:
    """``sys.meta_path`` hook: old module paths are their new modules; listed names are added.

    As a finder, :meth:`find_spec` answers for an old path (the spec names this object as the
    loader) and for a module :data:`NAMES` adds names to (the real spec, with a loader that adds
    them after the module ran). As the loader of an old path, :meth:`create_module` returns the
    new module itself, imported if needed, so both names hold one module object.
    """

    def __init__(self) -> None:
        self._names = _home_names()

    def find_spec(self, fullname: str, path: "Any" = None,
                  target_module: "Any" = None) -> "ModuleSpec | None":
        """The spec for ``fullname``, or None to let the other finders answer.

        Raises:
            ImportError: the new module of an old path failed to import for another reason than
                not existing (a missing dependency): that error, unchanged.
        """
        if not fullname.startswith(_PREFIX):
            return None
        new = target(fullname)
        if new is not None:
            return self._alias_spec(fullname, new)
        names = self._names.get(fullname)
        if names is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target_module)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NamesLoader(spec.loader, names)
                return spec
        return None

    def _alias_spec(self, fullname: str, new: str) -> "ModuleSpec | None":
        from importlib.machinery import ModuleSpec
        from importlib.util import find_spec

        try:
            real = find_spec(new)
        except ModuleNotFoundError as exc:
            # ``new`` itself missing (an old package's submodule that does not exist): not found,
            # like any missing module. A dependency missing inside ``new`` is a real error.
            if exc.name and new.startswith(exc.name):
                return None
            raise
        if real is None:
            return None
        spec = ModuleSpec(fullname, self, origin=real.origin,
                          is_package=real.submodule_search_locations is not None)
        if real.submodule_search_locations is not None:
            spec.submodule_search_locations = real.submodule_search_locations
        return spec

    def create_module(self, spec: "ModuleSpec") -> "ModuleType":
        """The new module (imported now if it was not), recording its own spec and loader."""
        from importlib import import_module

        module = import_module(target(spec.name) or spec.name)
        spec.loader_state = (module.__dict__.get("__spec__"), module.__dict__.get("__loader__"))
        return module

    def exec_module(self, module: "ModuleType") -> None:
        """Nothing runs again: the module keeps its own ``__spec__`` and ``__loader__``.

        Submodules of an old package that the new package already imported get their old
        names now, so ``import OLD.sub`` returns them without setting ``OLD.sub`` as an
        attribute, which would replace a package attribute of the same name
        (``reward_fns.registry``, the registry instance, by the module).
        """
        spec = module.__dict__.get("__spec__")
        state = getattr(spec, "loader_state", None)
        if not state:
            return
        real_spec, real_loader = state
        if real_spec is None:
            return
        module.__spec__ = real_spec
        module.__loader__ = real_loader or real_spec.loader
        if real_spec.submodule_search_locations is not None:
            old = spec.name
            prefix = module.__name__ + "."
            for name, loaded in list(sys.modules.items()):
                if name.startswith(prefix):
                    sys.modules.setdefault(old + name[len(module.__name__):], loaded)

    def get_code(self, fullname: str) -> "Any":
        """The new module's code (``python -m OLD`` runs it, through :mod:`runpy`)."""
        new = target(fullname) or fullname
        return self._real_loader(new).get_code(new)

    def get_source(self, fullname: str) -> str | None:
        """The new module's source."""
        new = target(fullname) or fullname
        return self._real_loader(new).get_source(new)

    def is_package(self, fullname: str) -> bool:
        """Whether the new module is a package."""
        new = target(fullname) or fullname
        return self._real_loader(new).is_package(new)

    @staticmethod
    def _real_loader(new: str) -> "Any":
        from importlib.util import find_spec

        spec = find_spec(new)
        if spec is None or spec.loader is None:
            raise ImportError(f"no module {new!r} behind this Atropos 0.4 path", name=new)
        loader = spec.loader
        return loader._loader if isinstance(loader, _NamesLoader) else loader


def install() -> "AliasFinder":
    """Put the one :class:`AliasFinder` at the front of ``sys.meta_path`` (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder):
            return finder
    finder = AliasFinder()
    sys.meta_path.insert(0, finder)
    return finder


__all__ = ["MOVED", "NAMES", "AliasFinder", "install", "module_getattr", "target"]
