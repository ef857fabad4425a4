"""Render a pydantic model as a markdown table (field, CLI flag, type, default, description).

Generic: knows no particular config. ``atroposlib.envs.config_docs`` uses it for the configuration reference.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(value: Any) -> str:
    if value is PydanticUndefined:
        return "*required*"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`"


def model_table(
    model: type[BaseModel], flag_prefix: str | None, exclude: type[BaseModel] | None = None
) -> str:
    """Render one model as a markdown table (flag, type, default, description).

    A field holding a pydantic model (a nested section) shows ``--prefix.field.<field>``;
    render that model with its own table (``flag_prefix="prefix.field"``).

    Args:
        model: the pydantic model.
        flag_prefix: ``"env"`` renders ``--env.<field>``; None renders ``--<field>``.
        exclude: a base model whose fields are left out (to show only what a subclass adds).
    """
    rows = ["| field | CLI flag | type | default | description |", "|---|---|---|---|---|"]
    skip = set(exclude.model_fields) if exclude is not None else set()
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flag = f"--{flag_prefix}.{name}" if flag_prefix else f"--{name}"
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        nested = isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        # a nested section: one flag per field of its model (its own table), its defaults there
        rows.append(
            f"| `{name}` | `{flag}.<field>` | {_type_name(field.annotation)} | "
            f"see its table | {description} |" if nested else
            f"| `{name}` | `{flag}` | {_type_name(field.annotation)} | "
            f"{_default(field.default)} | {description} |"
        )
    return "\n".join(rows)
