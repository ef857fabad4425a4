"""The errors of atroposlib's command lines: unknown flags with did-you-mean, invalid values by flag.

:class:`atroposlib.utils.flags.ArgumentParser` reports through these; they live apart from it so
that module holds only the parser and its options.
"""

from __future__ import annotations

import argparse
import difflib
import re

from pydantic import ValidationError

#: How alike (``difflib`` ratio, 0..1) an unknown flag's name must be to a known one to be suggested.
SUGGEST_CUTOFF = 0.75

#: Words that say nothing about what an argument is, left out when matching flags to positionals.
_FILLER_WORDS = frozenset({"a", "an", "the", "of", "to", "for", "and", "or", "e.g", "eg", "by", "in", "on"})


def _words(text: str) -> list[str]:
    """Lower-case words of a flag or argument name: ``--output-file`` -> ``["output", "file"]``."""
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w and w not in _FILLER_WORDS]


def _split_prefix(flag: str) -> tuple[str, str]:
    """``--env.group_size`` -> ``("env", "group_size")``; ``--lr`` -> ``("", "lr")``."""
    name = flag.lstrip("-")
    prefix, _, rest = name.rpartition(".")
    return prefix, rest


def closest_flag(flag: str, known: list[str]) -> str | None:
    """The known flag ``flag`` most likely misspells, or None when none is close.

    Names are compared without their dashes and, among flags of the same ``--prefix.``, without
    the shared prefix (which would make any two ``--env.*`` flags look alike): a ``difflib``
    ratio of at least :data:`SUGGEST_CUTOFF` (``--trainng-steps`` -> ``--training-steps``). When
    none is that close, a single known flag whose words are all in ``flag``'s, or the other way
    round, is suggested (``--model-name`` -> ``--model``).
    """
    prefix, name = _split_prefix(flag)
    candidates = {k: _split_prefix(k) for k in known if k.startswith("--")}
    same = {k: n for k, (p, n) in candidates.items() if p == prefix}
    scored = [(difflib.SequenceMatcher(None, name, n).ratio(), k) for k, n in same.items()]
    scored += [(difflib.SequenceMatcher(None, flag.lstrip("-"), k.lstrip("-")).ratio(), k)
               for k in candidates if k not in same]
    best = max(scored, default=(0.0, ""))
    if best[0] >= SUGGEST_CUTOFF:
        return best[1]
    words = set(_words(name))
    nested = [k for k, n in same.items() if words and (set(_words(n)) <= words or words <= set(_words(n)))]
    return nested[0] if len(nested) == 1 else None


def _positional_hint(flag: str, parser: argparse.ArgumentParser) -> str | None:
    """Explain that ``flag`` names a positional argument of ``parser`` (``--output`` for FILEPATH).

    A positional matches when one of the flag's words is part of, or contains, one of the words of
    its name, its metavar or the first words of its help (``--output``, ``--outfile`` and
    ``--output-file`` all match ``filepath`` helped as "output JSONL file").
    """
    flag_words = [w for w in _words(flag) if len(w) >= 3]
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        help_text = action.help if isinstance(action.help, str) and action.help != argparse.SUPPRESS else ""
        summary = re.split(r"[,;(]| - ", help_text, maxsplit=1)[0].strip().rstrip(".")
        metavar = action.metavar if isinstance(action.metavar, str) else ""
        names = set(_words(action.dest) + _words(metavar) + _words(summary)[:3])
        if not any(w in n or (len(n) >= 4 and n in w) for w in flag_words for n in names):
            continue
        shown = metavar or action.dest.upper()
        if summary[1:2].islower():  # "Output file" -> "output file", but "JSONL file" stays
            summary = summary[0].lower() + summary[1:]
        what = f"the {summary} is " if summary else ""
        return (f"{what}the positional argument {shown}, given without a flag: "
                f"{parser.prog} {shown} [flags]")
    return None


def unknown_flag_message(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """Build an error naming each unknown flag and the closest known one, one line per flag.

    ``unknown flag --env.group_sze; did you mean --env.group_size?`` (closeness: see
    :func:`closest_flag`); a flag that names a positional argument says so instead
    (``unknown flag --output; the output JSONL file is the positional argument FILEPATH, given
    without a flag: atropos-sft-gen FILEPATH [flags]``). A bare value right after an unknown
    flag (``--env.typo 8``) is taken as that flag's value.
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
        close = closest_flag(flag, known)
        positional = None if close else _positional_hint(flag, parser)
        hint = (f"; did you mean {close}?" if close else f"; {positional}" if positional
                else "; see --help for every flag")
        lines.append(f"unknown flag {flag}{hint}")
    return "\n".join(lines)


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


__all__ = ["SUGGEST_CUTOFF", "closest_flag", "unknown_flag_message", "validation_error_message"]
