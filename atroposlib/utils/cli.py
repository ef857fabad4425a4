"""Command-line plumbing shared by every console script.

The ``ArgumentParser`` with did-you-mean errors, shared defaults, and the mapping of pydantic
config models to argparse options (``--prefix.field``) and back to dicts: parsing is argparse's and validation is pydantic's. Values stay
strings (pydantic coerces them), except ``None``/``null`` -> None and JSON lists/objects.
A flag given without a value means ``true`` (``--env.use_wandb``); negative numbers can be
written ``--env.x=-1`` or ``--env.x -1``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import types
import typing
from enum import Enum
from typing import Any

from pydantic import BaseModel, ValidationError

from atroposlib.defaults import DEFAULT_API_URL
from atroposlib.errors import ConfigError

#: Strings that mean None on the command line.
NONE_STRINGS = frozenset({"None", "none", "null", "~"})


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and args[0] is bool
    return False


def _type_label(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "{" + ",".join(str(m.value) for m in annotation) + "}"
    if typing.get_origin(annotation) is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(annotation)) + "}"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _type_label(args[0])
        return "|".join(_type_label(a) for a in args)
    return getattr(annotation, "__name__", str(annotation)).upper()


def _show_default(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    return repr(value) if isinstance(value, str) else str(value)


def add_model_options(
    parser: argparse.ArgumentParser | Any,
    model_cls: type[BaseModel],
    prefix: str | None,
    defaults: dict[str, Any] | None = None,
    title: str | None = None,
) -> None:
    """Add one ``--prefix.field`` option per field of ``model_cls`` to ``parser``.

    Args:
        parser: the argparse parser (or subparser).
        model_cls: the pydantic model whose fields become options.
        prefix: ``"env"`` gives ``--env.group_size``; None gives ``--group_size``.
        defaults: the values shown as defaults in ``--help`` (e.g. from ``config_init``);
            the option itself defaults to "not given" so layering can tell them apart.
        title: heading of the option group in ``--help``.
    """
    group = parser.add_argument_group(title or (f"{prefix} options" if prefix else "options"))
    defaults = defaults or {}
    for name, field in model_cls.model_fields.items():
        flag = f"--{prefix}.{name}" if prefix else f"--{name}"
        dest = f"{prefix}.{name}" if prefix else name
        shown = defaults.get(name, field.default)
        description = field.description or ""
        help_text = f"{description} (default: {_show_default(shown)})".replace("%", "%%")
        kwargs: dict[str, Any] = {
            "dest": dest,
            "default": argparse.SUPPRESS,
            "help": help_text,
            "metavar": _type_label(field.annotation),
        }
        if _is_bool(field.annotation):
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        group.add_argument(flag, **kwargs)


def convert_value(raw: Any) -> Any:
    """Turn a raw CLI string into the value handed to pydantic.

    ``None``/``null`` -> None; ``[...]``/``{...}`` -> parsed JSON; anything else unchanged.

    Raises:
        ConfigError: a ``[``/``{`` value that is not valid JSON.
    """
    if not isinstance(raw, str):
        return raw
    if raw in NONE_STRINGS:
        return None
    stripped = raw.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"value {raw!r} looks like JSON but does not parse: {exc}") from exc
    return raw


def collect_overrides(namespace: argparse.Namespace, prefixes: list[str]) -> dict[str, dict[str, Any]]:
    """Split parsed options into ``{prefix: {field: value}}`` (``""`` for unprefixed ones).

    Only options actually given on the command line appear.
    """
    out: dict[str, dict[str, Any]] = {p: {} for p in prefixes}
    for dest, raw in vars(namespace).items():
        if "." in dest:
            prefix, name = dest.split(".", 1)
        else:
            prefix, name = "", dest
        if prefix in out:
            out[prefix][name] = convert_value(raw)
    return out


def unknown_flag_message(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """Build an error naming each unknown flag and the closest known one, one line per flag.

    ``unknown flag --env.group_sze; did you mean --env.group_size?`` (closeness is
    :func:`difflib.get_close_matches`' ratio). A bare value right after an unknown flag
    (``--env.typo 8``) is taken as that flag's value.
    """
    known = [s for action in parser._actions for s in action.option_strings]
    lines = []
    previous_was_flag = False
    for arg in unknown:
        if not arg.startswith("-"):
            if not previous_was_flag:
                lines.append(f"unexpected argument {arg!r}")
            previous_was_flag = False
            continue
        flag = arg.split("=", 1)[0]
        previous_was_flag = "=" not in arg
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; see --help for every flag"
        lines.append(f"unknown flag {flag}{hint}")
    return "\n".join(lines)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors name the closest known flag, before the usage.

    A mistyped flag (``--num-seq 5``) fails with ``prog: error: unknown flag --num-seq; did
    you mean --num-seqs-to-save?`` first and the usage after it, so the hint is not lost
    below a long usage dump; a usage longer than a few lines (an env's dozens of
    ``--env.*`` flags) is shortened to ``usage: prog [-h] [flags]``. Every atroposlib
    command line builds its parser from this class (Python 3.14's ``suggest_on_error`` is not
    available on 3.11). Subparsers inherit it.
    """

    #: Usages longer than this many lines are shortened in error messages.
    max_usage_lines = 6

    def error(self, message: str) -> typing.NoReturn:
        """Print ``prog: error: message`` (with did-you-mean hints), then the usage; exit 2."""
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):  # argparse's own wording, also when a library parses
            message = unknown_flag_message(message[len(prefix):].split(), self)
        usage = self.format_usage()
        if usage.count("\n") > self.max_usage_lines:
            usage = f"usage: {self.prog} [-h] [flags]\n"
        self.exit(2, f"{self.prog}: error: {message}\n\n{usage}"
                  f"(run {self.prog} --help for every flag)\n")


def validation_error_message(
    exc: ValidationError, prefix: str | None, source: str = "configuration", kebab: bool = False
) -> str:
    """Rewrite a pydantic ValidationError so each problem names the flag to fix.

    Args:
        exc: the error from validating a config model.
        prefix: flag namespace (``env`` gives ``--env.field``), or None for top-level flags.
        source: what was being validated, for the first line.
        kebab: spell flags with dashes (``--lora-r``), as parsers with kebab-case flags do.

    Returns:
        ``invalid SOURCE:`` then one line per problem; a whole-model check (no field) is shown
        as its message alone, without pydantic's "Value error, " prefix.
    """
    lines = [f"invalid {source}:"]
    for error in exc.errors():
        msg = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:
            lines.append(f"  {msg}")
            continue
        loc = ".".join(str(p) for p in error["loc"])
        if kebab:
            loc = loc.replace("_", "-")
        flag = f"--{prefix}.{loc}" if prefix else f"--{loc}"
        given = error.get("input")
        if error["type"] == "extra_forbidden":
            lines.append(f"  {flag}: unknown field (check the spelling; see --help)")
        else:
            lines.append(f"  {flag}: {msg} (got {given!r})")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_API_URL",
    "NONE_STRINGS",
    "ArgumentParser",
    "add_model_options",
    "collect_overrides",
    "convert_value",
    "unknown_flag_message",
    "validation_error_message",
]
