"""Atropos 0.4's config helpers, kept importable from ``atroposlib.utils.flags`` (and ``atroposlib.utils.cli``).

Prefixed copies of config models, dict merging, namespace extraction, default overrides and a
flag scan of the command line. They live apart from :mod:`atroposlib.utils.flags` so that
module holds only the parser every command line uses.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model


def _field_spec(field: Any, default: Any = ...) -> tuple[Any, Any]:
    """``(annotation, Field(...))`` re-declaring a pydantic field for ``create_model``.

    Keeps the description; the default is ``default`` when given, else the field's own default
    or default factory.
    """
    kwargs: dict[str, Any] = {}
    if field.description is not None:
        kwargs["description"] = field.description
    if default is not ...:
        kwargs["default"] = default
    elif field.default_factory is not None:
        kwargs["default_factory"] = field.default_factory
    else:
        kwargs["default"] = field.default
    return field.annotation, Field(**kwargs)


def get_prefixed_pydantic_model(base_model: type[BaseModel], prefix: str) -> type[BaseModel]:
    """A new pydantic model with every field of ``base_model`` renamed ``prefix + name``.

    Args:
        base_model: the model class whose fields are copied (type, default or default factory,
            description; validators are not carried over).
        prefix: prepended to each field name, e.g. ``"env."``.

    Returns:
        A model class named ``Prefix`` + ``base_model``'s name (``prefix.capitalize()``).
    """
    fields = {f"{prefix}{name}": _field_spec(field) for name, field in base_model.model_fields.items()}
    return create_model(f"{prefix.capitalize()}{base_model.__name__}", **fields)


def merge_dicts(*dicts: dict[str, Any]) -> dict[str, Any]:
    """Merge dicts left to right; a later value wins, and two dicts at one key merge recursively.

    Args:
        *dicts: the dicts to merge (none are modified).

    Returns:
        A new dict (``{}`` when given none).
    """
    merged: dict[str, Any] = {}
    for current in dicts:
        for key, value in current.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge_dicts(merged[key], value)
            else:
                merged[key] = value
    return merged


def extract_namespace(model: Any, prefix: str) -> dict[str, Any]:
    """The entries of ``model`` whose key starts with ``prefix``, with the prefix removed.

    Args:
        model: a pydantic model (``model_dump()``), an object with ``to_dict()``, or a dict.
        prefix: e.g. ``"env."``.

    Returns:
        ``{key without prefix: value}`` for the matching keys.

    Raises:
        TypeError: ``model`` is none of the above.
    """
    if hasattr(model, "model_dump"):
        data = model.model_dump()
    elif hasattr(model, "to_dict"):
        data = model.to_dict()
    elif isinstance(model, dict):
        data = model
    else:
        raise TypeError(f"expected a pydantic model, an object with to_dict() or a dict, got "
                        f"{type(model).__name__}")
    return {key[len(prefix):]: value for key, value in data.items() if key.startswith(prefix)}


def adjust_model_defaults(
    model_class: type[BaseModel], defaults: dict[str, Any] | BaseModel
) -> type[BaseModel]:
    """A subclass of ``model_class`` whose listed fields get new defaults.

    Args:
        model_class: the pydantic model to derive from; other fields are inherited unchanged.
        defaults: ``{field: new default}`` or a model instance (its ``model_dump()``); keys that
            are not fields of ``model_class`` are ignored. A ``None`` default for a field with a
            default factory keeps the factory.

    Returns:
        A class named ``<model_class name>WithDefaults``.
    """
    values = defaults.model_dump() if isinstance(defaults, BaseModel) else dict(defaults)
    overridden = {}
    for name, field in model_class.model_fields.items():
        if name not in values:
            continue
        keep_factory = values[name] is None and field.default_factory is not None
        overridden[name] = _field_spec(field) if keep_factory else _field_spec(field, values[name])
    return create_model(f"{model_class.__name__}WithDefaults", __base__=model_class, **overridden)


def get_double_dash_flags(argv: list[str] | None = None) -> dict[str, Any]:
    """Every ``--flag`` of the command line as a dict, without declaring the flags first.

    ``--key=value`` and ``--key value`` give the string value (``"None"`` gives None); a flag
    followed by nothing or by another option gives ``True``. Single-dash options and bare
    arguments are skipped. Parsing is argparse's: each ``--name`` seen is declared as an
    optional-value option of an ``argparse.ArgumentParser`` (prefix matching off), then the
    arguments are parsed.

    Args:
        argv: the arguments to read; ``sys.argv[1:]`` when None.

    Returns:
        ``{flag name without "--": value}``.
    """
    import argparse
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    seen: set[str] = set()
    for arg in args:
        name = arg[2:].split("=", 1)[0]
        if arg.startswith("--") and name and name not in seen:
            seen.add(name)
            parser.add_argument(f"--{name}", dest=name, nargs="?", const=True,
                                default=argparse.SUPPRESS)
    namespace, _ = parser.parse_known_args(args)
    return {key: None if value == "None" else value for key, value in vars(namespace).items()}


__all__ = [
    "adjust_model_defaults",
    "extract_namespace",
    "get_double_dash_flags",
    "get_prefixed_pydantic_model",
    "merge_dicts",
]
