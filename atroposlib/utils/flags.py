"""Command-line flags: the parser every console script uses, and settings models as flags.

Atropos 0.4's path for this module, ``atroposlib.utils.cli``, is this module (:mod:`atroposlib.compat.aliases`).

Every command builds its flags with :func:`settings_parser` (one option per field of a pydantic
model) on :class:`ArgumentParser` (did-you-mean errors, no prefix matching, and each flag in both
spellings, ``--a_b`` and ``--a-b``). Two grammars: kebab-case flags parsed by pydantic-settings
(run-api, atropos-grpo, atropos-inference-node, the proxy; :func:`parse_settings`), and
Atropos 0.4's env grammar ``--prefix.field`` (:func:`add_model_options`, :func:`collect_overrides`):
parsing is argparse's and validation is pydantic's. Env values stay strings (pydantic coerces
them), except ``None``/``null`` -> None and JSON lists/objects. A flag given without a value
means ``true`` (``--env.use_wandb``); negative numbers can be written ``--env.x=-1`` or
``--env.x -1``. ``config`` subcommands print resolved settings with :func:`settings_text`.
"""

from __future__ import annotations

import argparse
import json
import re
import types
import typing
from enum import Enum
from typing import Any

# Field and create_model: Atropos 0.4's module exported them
from pydantic import BaseModel, Field, ValidationError, create_model  # noqa: F401

from atroposlib.defaults import DEFAULT_API_URL
from atroposlib.errors import ConfigError

# the error messages (closest_flag ...) live in flag_errors; importable from here as before
from atroposlib.utils.flag_errors import (
    SUGGEST_CUTOFF,
    closest_flag,
    unknown_flag_message,
    validation_error_message,
)

#: Strings that mean None on the command line (except for a field whose choices are words
#: such as ``none``, and that cannot be None: there the word is the value).
NONE_STRINGS = frozenset({"None", "none", "null", "~"})


class _Verbatim(str):
    """A flag value kept as typed, never read as None (see :data:`NONE_STRINGS`)."""


def _choice_is_a_none_word(annotation: Any) -> bool:
    """True for ``Literal[..., "none", ...]`` (not Optional): ``--x none`` means the word."""
    if typing.get_origin(annotation) is not typing.Literal:
        return False
    return any(isinstance(a, str) and a in NONE_STRINGS for a in typing.get_args(annotation))


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
    if value is None:  # spelled as on the command line and in YAML, and as atropos-grpo shows it
        return "null"
    if isinstance(value, Enum):
        return str(value.value)
    return repr(value) if isinstance(value, str) else str(value)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (its section becomes ``--prefix.field.sub``), or None."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _field_default(field: Any) -> Any:
    """A field's default, calling its default factory (a nested section's defaults)."""
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def add_model_options(
    parser: argparse.ArgumentParser | Any,
    model_cls: type[BaseModel],
    prefix: str | None,
    defaults: dict[str, Any] | None = None,
    title: str | None = None,
) -> None:
    """Add one ``--prefix.field`` option per field of ``model_cls`` to ``parser``.

    A field that holds a pydantic model (a nested section such as ``item_filter``) becomes one
    option per field of that model, ``--prefix.field.sub`` (dest ``prefix.field/sub``;
    :func:`collect_overrides` nests the values again). A field whose name holds dots (a
    verifiers knob, ``taskset.data_file``) is one option and one key. The model class's ``legacy_keys``
    (old flat key -> dotted field it sets) become hidden options of the old names, typed as
    the field they set, so earlier command lines keep working.

    Args:
        parser: the argparse parser (or subparser).
        model_cls: the pydantic model whose fields become options.
        prefix: ``"env"`` gives ``--env.group_size``; None gives ``--group_size``.
        defaults: the values shown as defaults in ``--help`` (e.g. from ``config_init``);
            the option itself defaults to "not given" so layering can tell them apart.
        title: heading of the option group in ``--help``.
    """
    group = parser.add_argument_group(title or (f"{prefix} options" if prefix else "options"))
    _add_field_options(group, model_cls, prefix, defaults or {})
    for old, target in (getattr(model_cls, "legacy_keys", None) or {}).items():
        if old in model_cls.model_fields:
            continue
        owner: Any = model_cls
        *sections, name = target.split(".")
        for section in sections:
            owner = _nested_model(owner.model_fields[section].annotation)
        group.add_argument(f"--{prefix}.{old}" if prefix else f"--{old}",
                           **_option_kwargs(owner.model_fields[name].annotation,
                                            f"{prefix}.{old}" if prefix else old, argparse.SUPPRESS))


def _option_kwargs(annotation: Any, dest: str, help_text: str) -> dict[str, Any]:
    """``add_argument`` keywords of one field's option (booleans take an optional value)."""
    kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": help_text,
                              "metavar": _type_label(annotation)}
    if _is_bool(annotation):
        kwargs.update(nargs="?", const="true", metavar="BOOL")
    elif _choice_is_a_none_word(annotation):
        kwargs["type"] = _Verbatim
    return kwargs


#: Joins a nested section and its field in an option's dest (``env.item_filter/floor`` for
#: ``--env.item_filter.floor``): a field whose own name holds dots (a verifiers knob such as
#: ``taskset.data_file``) stays one key.
SECTION_SEP = "/"


def _add_field_options(group: Any, model_cls: type[BaseModel], prefix: str | None,
                       defaults: Any, dest_prefix: str | None = None, sep: str = ".") -> None:
    """The options of ``model_cls``'s fields (nested sections recursively) on ``group``.

    ``prefix`` starts each flag (``--env.group_size``); ``dest_prefix`` (default: ``prefix``)
    and ``sep`` each dest: ``env.group_size`` at the top, ``env.item_filter/floor`` inside a
    nested section (:data:`SECTION_SEP`).
    """
    if isinstance(defaults, BaseModel):
        defaults = defaults.model_dump()
    dest_prefix = prefix if dest_prefix is None else dest_prefix
    for name, field in model_cls.model_fields.items():
        flag = f"{prefix}.{name}" if prefix else name
        dest = f"{dest_prefix}{sep}{name}" if dest_prefix else name
        shown = defaults.get(name, _field_default(field)) if isinstance(defaults, dict) else _field_default(field)
        nested = _nested_model(field.annotation)
        if nested is not None:
            _add_field_options(group, nested, flag, shown, dest_prefix=dest, sep=SECTION_SEP)
            continue
        description = field.description or ""
        help_text = f"{description} (default: {_show_default(shown)})".replace("%", "%%")
        group.add_argument(f"--{flag}", **_option_kwargs(field.annotation, dest, help_text))


def convert_value(raw: Any) -> Any:
    """Turn a raw CLI string into the value handed to pydantic.

    ``None``/``null`` -> None (unless the option is a choice among words such as ``none``);
    ``[...]``/``{...}`` -> parsed JSON; anything else unchanged.

    Raises:
        ConfigError: a ``[``/``{`` value that is not valid JSON.
    """
    if not isinstance(raw, str):
        return raw
    if isinstance(raw, _Verbatim):
        return str(raw)
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

    Only options actually given on the command line appear. A nested section's options
    (``--env.item_filter.floor 0.2``) come back nested: ``{"env": {"item_filter": {"floor":
    "0.2"}}}``.
    """
    out: dict[str, dict[str, Any]] = {p: {} for p in prefixes}
    for dest, raw in vars(namespace).items():
        if "." in dest:
            prefix, name = dest.split(".", 1)
        else:
            prefix, name = "", dest
        if prefix in out:
            target = out[prefix]
            *sections, name = name.split(SECTION_SEP)
            for section in sections:
                target = target.setdefault(section, {})
            target[name] = convert_value(raw)
    return out


def merge_sections(base: dict[str, Any], new: dict[str, Any], model_cls: type[BaseModel]) -> dict[str, Any]:
    """``base`` updated with ``new``; a nested section of ``model_cls`` is merged field by field.

    So ``--env.item_filter.floor 0.2`` changes that one field of the section ``config_init``
    or the YAML set, instead of replacing the whole section. Other values replace.

    Args:
        base: the lower layer's values (not changed).
        new: the higher layer's values.
        model_cls: the model whose nested-model fields are merged.

    Returns:
        A new mapping.
    """
    out = dict(base)
    for key, value in new.items():
        field = model_cls.model_fields.get(key)
        nested = _nested_model(field.annotation) if field is not None else None
        old = out.get(key)
        if isinstance(old, BaseModel):
            old = old.model_dump(exclude_unset=True)
        if nested is not None and isinstance(value, dict) and isinstance(old, dict):
            out[key] = merge_sections(old, value, nested)
        else:
            out[key] = value
    return out


def api_key_arg(value: str) -> str:
    """Argparse ``type`` of an ``--api-key`` flag: a non-empty bearer token.

    Raises:
        argparse.ArgumentTypeError: the value is empty or blank (it would send no token).
    """
    if not value.strip():
        raise argparse.ArgumentTypeError("the token is empty: give the one run-api was started "
                                         "with, or leave the flag out ($ATROPOS_API_KEY is used)")
    return value


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``ArgumentDefaultsHelpFormatter`` without ``(default: None)``.

    Plain argparse tools (``run-api``, ``atropos-sft-gen``/``atropos-dpo-gen``, ``view-run``)
    cannot take ``null`` for an option, so an option whose default is "not given" shows no
    default; its help says what leaving it out does. Other defaults show as argparse shows them.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def add_argument(container: Any, *args: Any, **kwargs: Any) -> argparse.Action:
    """``container.add_argument(*args, **kwargs)`` with one metavar style for every command line.

    A metavar spelled as a Python type (``str``, ``int``, ``Path``, ``list[str]``: what
    pydantic-settings passes) becomes the flag's name in capitals (``--max-model-len
    MAX_MODEL_LEN``), as argparse names the options of every other command. Choices
    (``{a,b}``) and explicit names stay. A trailing ``(default: null)`` is dropped: an option
    whose default is "not given" shows no default, on every command line, and a hand-written
    ``(default X)`` reads ``(default: X)``.

    Args:
        container: an ``argparse`` parser or argument group.
        *args: the option strings (or the positional's name).
        **kwargs: ``add_argument``'s keyword arguments.

    Returns:
        The ``argparse.Action`` added.
    """
    metavar = kwargs.get("metavar")
    help_text = kwargs.get("help")
    if isinstance(help_text, str):
        # as for argparse options whose default is None: no default shown; the help says
        # what leaving the flag out does. Defaults written by hand read like argparse's own.
        help_text = help_text.removesuffix(" (default: null)")
        # pydantic-settings' spelling of a default factory: the empty value, or nothing
        help_text = help_text.replace("(default factory: list)", "(default: [])").replace(
            "(default factory: dict)", "(default: {})")
        help_text = re.sub(r" \(default factory: [^()]*\)$", "", help_text)
        kwargs["help"] = re.sub(r"\(default (?![:)])", "(default: ", help_text)
    longs = [a for a in args if isinstance(a, str) and a.startswith("--")]
    if isinstance(metavar, str) and longs and _TYPE_METAVAR.fullmatch(metavar):
        kwargs["metavar"] = re.sub(r"[-.]", "_", longs[0].lstrip("-")).upper()
    return argparse._ActionsContainer.add_argument(container, *args, **kwargs)


def settings_cli_source(model: type[Any], parser: argparse.ArgumentParser) -> Any:
    """A pydantic-settings ``CliSettingsSource`` for ``model`` on ``parser``, in the house style.

    Its options are added through :func:`add_argument`, so ``atropos-grpo`` and
    ``atropos-inference-node`` show metavars as every other command does.
    """
    from pydantic_settings import CliSettingsSource

    return CliSettingsSource(model, root_parser=parser, add_argument_method=add_argument)


def settings_parser(
    model: type[BaseModel],
    prefix: str | None = None,
    *,
    parser: argparse.ArgumentParser | None = None,
    defaults: dict[str, Any] | None = None,
    title: str | None = None,
    docs: str | None = None,
    **parser_kwargs: Any,
) -> argparse.ArgumentParser:
    """The command line of a settings model: one option per field, in the house style.

    Every atroposlib command builds its flags here (run-api, atropos-grpo,
    atropos-inference-node, the proxy, and each env's ``serve|process|evaluate``). Each flag
    takes both spellings, ``--a_b`` and ``--a-b`` (:class:`ArgumentParser`), and shows one metavar
    and default style (:func:`add_argument`).

    Two grammars, by ``prefix``:

    * ``prefix=None``: kebab-case flags parsed by pydantic-settings' ``CliSettingsSource``
      (``--training-steps 20``, ``--reload``/``--no-reload``, lists as ``a,b`` or JSON).
      Read the settings with :func:`parse_settings`. A plain ``BaseModel`` reads flags only; a
      ``BaseSettings`` model also its environment variables, as its own config says.
    * ``prefix="env"``: Atropos 0.4's env grammar, ``--env.group_size 8`` (values handed to
      pydantic as strings, ``null`` for None, JSON lists; a bare boolean flag means true);
      several models can share one parser. Read them with :func:`collect_overrides`.

    Args:
        model: the pydantic model whose fields become flags.
        prefix: the flag namespace (``env`` gives ``--env.group_size``), or None.
        parser: add the flags to this parser (or subparser); a new :class:`ArgumentParser` made
            with ``parser_kwargs`` when None.
        defaults: with a prefix: the defaults ``--help`` shows (e.g. ``config_init``'s).
        title: with a prefix: the heading of the flags in ``--help``.
        docs: a docs page (``docs/guides/trainer.md``) named at the end of ``--help``.
        **parser_kwargs: ``ArgumentParser`` arguments (``prog``, ``description``, ...).

    Returns:
        The parser; without a prefix it carries the pydantic-settings source as
        ``settings_source`` and the model as ``settings_model``.
    """
    if parser is None:
        parser = ArgumentParser(**parser_kwargs)
    if docs:
        parser.epilog = f"{parser.epilog} Guide: {docs}." if parser.epilog else f"Guide: {docs}."
    if prefix is not None:
        add_model_options(parser, model, prefix, defaults, title)
        return parser
    from pydantic_settings import BaseSettings, SettingsConfigDict

    settings_cls = model
    if not issubclass(model, BaseSettings):  # flags only: no environment variables are read
        config = SettingsConfigDict(extra="forbid", cli_kebab_case=True, cli_implicit_flags=True,
                                    cli_hide_none_type=True)
        settings_cls = type(f"{model.__name__}Flags", (BaseSettings, model),
                            {"model_config": config, "__doc__": model.__doc__})
    parser.settings_source = settings_cli_source(settings_cls, parser)  # type: ignore[attr-defined]
    parser.settings_model = model  # type: ignore[attr-defined]
    return parser


def parse_settings(parser: argparse.ArgumentParser,
                   argv: list[str] | argparse.Namespace | None = None) -> Any:
    """The settings a :func:`settings_parser` parser (no prefix) makes of ``argv``.

    Args:
        parser: what :func:`settings_parser` returned.
        argv: the arguments (``sys.argv[1:]`` when None), or what ``parser.parse_args`` made of
            them (to read flags of its own too, such as :func:`add_config_flags`').

    Returns:
        An instance of the parser's model.

    Raises:
        SystemExit: 2 with ``prog: error: ...`` naming each bad flag and the fix; 0 after
            ``--help``.
    """
    import sys

    from pydantic_settings import BaseSettings, CliApp

    model = parser.settings_model  # type: ignore[attr-defined]
    source = parser.settings_source  # type: ignore[attr-defined]
    if not isinstance(argv, argparse.Namespace):
        argv = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if issubclass(model, BaseSettings):
            return CliApp.run(model, cli_args=argv, cli_settings_source=source)
        return model.model_validate(source(parsed_args=argv)())
    except ValidationError as exc:
        parser.error(validation_error_message(exc, None, "flags", kebab=True))


#: Keys whose values :func:`settings_text` never prints (bearer tokens).
SECRET_KEYS = ("api_key", "vllm_api_key")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` to the parser of a ``config`` subcommand (see :func:`settings_text`)."""
    parser.add_argument("--json", action="store_true", default=False,
                        help="Print JSON (one object) instead of YAML.")


def settings_text(data: dict[str, Any], as_json: bool) -> str:
    """Resolved settings as a ``config`` subcommand prints them: YAML, or JSON with ``--json``.

    Every key named in :data:`SECRET_KEYS` that holds a value, at any depth, prints as
    ``"***"``. Values JSON cannot hold print as their ``str()``.

    Args:
        data: the settings, e.g. ``model.model_dump(mode="json")``.
        as_json: JSON (one line per key, indented) instead of YAML.
    """
    def masked(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "***" if k in SECRET_KEYS and value[k] not in (None, "") else masked(v)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [masked(v) for v in value]
        return value

    plain = json.loads(json.dumps(masked(data), default=str))
    if as_json:
        return json.dumps(plain, indent=2)
    import yaml

    return yaml.safe_dump(plain, sort_keys=False).rstrip("\n")


#: A metavar that spells a Python type (``int``, ``SecretStr``, ``list[str]``, ``dict[str,int]``).
_TYPE_METAVAR = re.compile(r"[a-z][a-z_]*(\[[\w, \[\]]*\])?|[A-Z][a-z]+(?:[A-Z][a-z]+)*")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors name the closest known flag, before the usage.

    A mistyped flag (``--num-seq-to-save 5``) fails with ``prog: error: unknown flag
    --num-seq-to-save; did you mean --num-seqs-to-save?`` (or, for a flag that names a
    positional argument, how to give that) first and the usage after it, so the hint is not lost
    below a long usage dump; a usage longer than a few lines (an env's dozens of
    ``--env.*`` flags) is shortened to ``usage: prog [-h] [flags]``. Every atroposlib
    command line builds its parser from this class (Python 3.14's ``suggest_on_error`` is not
    available on 3.11). Subparsers inherit it.

    Flags must be spelled out: argparse's prefix matching (``--por`` for ``--port``) is off,
    so a typo is reported with the flag it resembles instead of being taken silently, and a
    script keeps its meaning when a later release adds a flag that shares the prefix. Pass
    ``allow_abbrev=True`` to turn it back on.
    """

    #: Usages longer than this many lines are shortened in error messages.
    max_usage_lines = 6

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: typing.Any, **kwargs: typing.Any) -> argparse.Action:
        """``argparse``'s ``add_argument`` through :func:`add_argument` (one metavar style)."""
        return add_argument(self, *args, **kwargs)

    def parse_known_args(self, args: typing.Any = None, namespace: typing.Any = None) -> typing.Any:
        """``argparse``'s ``parse_known_args``, each flag taken in either spelling.

        ``--a_b`` and ``--a-b`` name the same option (:func:`other_spelling`), whichever one the
        parser declares; a parser that declares both keeps them apart. Arguments after ``--``
        are left as given.
        """
        import sys

        raw = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([self.other_spelling(a) for a in _before_double_dash(raw)]
                                        + raw[len(_before_double_dash(raw)):], namespace)

    def other_spelling(self, arg: str) -> str:
        """``arg`` respelt as the option this parser declares, when only the other spelling is.

        ``--env.group-size=8`` -> ``--env.group_size=8`` when the parser has ``--env.group_size``;
        anything else (values, known or unknown flags) is returned unchanged.
        """
        if not arg.startswith("--") or arg == "--":
            return arg
        flag, sep, value = arg.partition("=")
        known = self._option_string_actions
        if flag in known:
            return arg
        for twin in ("--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")):
            if twin in known:
                return twin + sep + value
        return arg

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


def _before_double_dash(args: list[str]) -> list[str]:
    """The arguments before the first ``--`` (all of them when there is none)."""
    return args[:args.index("--")] if "--" in args else args


# Atropos 0.4's helpers, at their old import path (their home: atroposlib.utils.flags_compat)
from atroposlib.utils.flags_compat import (  # noqa: E402
    adjust_model_defaults,
    extract_namespace,
    get_double_dash_flags,
    get_prefixed_pydantic_model,
    merge_dicts,
)

__all__ = [
    "DEFAULT_API_URL",
    "NONE_STRINGS",
    "ArgumentParser",
    "HelpFormatter",
    "SUGGEST_CUTOFF",
    "SECRET_KEYS",
    "add_argument",
    "add_config_flags",
    "add_model_options",
    "adjust_model_defaults",
    "api_key_arg",
    "closest_flag",
    "collect_overrides",
    "convert_value",
    "extract_namespace",
    "get_double_dash_flags",
    "get_prefixed_pydantic_model",
    "merge_dicts",
    "merge_sections",
    "parse_settings",
    "settings_parser",
    "settings_text",
    "unknown_flag_message",
    "validation_error_message",
    "settings_cli_source",
]
