"""A static check ``check_env`` runs: scoring code that turns an exception into a score of 0.

An env that catches its own scorer's error and scores the rollout 0 sends a fabricated reward:
the trainer learns that the reply was wrong when the env simply could not judge it. Letting the
exception out fails the rollout instead (outcome ``failed``, kind ``env_error``: no score, in
no group statistic); :func:`~atroposlib.envs.outcomes.exclude_member` masks a rollout the env
decides not to judge. This module finds the pattern in source code without running it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from atroposlib.errors import AtroposWarning

#: Function names (lower case) whose ``except`` blocks are checked: scoring code.
SCORING_WORDS = ("score", "reward", "judge", "grade", "collect_trajector")


class ZeroScoreOnErrorWarning(AtroposWarning):
    """An env's scoring code returns or assigns a score of 0 inside an ``except`` block."""


@dataclass(frozen=True)
class ZeroScoreFinding:
    """One place where an ``except`` block makes a zero score.

    Attributes:
        function: the enclosing function's name.
        line: 1-based line number in the source that was checked.
        what: ``"return 0"`` or ``"<target> = 0"`` (the offending statement, shortened).
    """

    function: str
    line: int
    what: str


def _is_zero(node: ast.AST | None) -> bool:
    """Whether ``node`` is the literal 0 / 0.0 / -0.0, or a tuple starting with one."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float) and node.value == 0
    if isinstance(node, ast.Tuple) and node.elts:
        return _is_zero(node.elts[0])
    return False


def _scoreish(target: ast.AST) -> bool:
    """Whether an assignment target names a score or a reward (``score``, ``self.reward``...)."""
    name = ""
    if isinstance(target, ast.Name):
        name = target.id
    elif isinstance(target, ast.Attribute):
        name = target.attr
    elif isinstance(target, ast.Subscript):
        return _scoreish(target.value)
    return any(word in name.lower() for word in ("score", "reward"))


def _findings_in_handler(function: str, handler: ast.ExceptHandler) -> list[ZeroScoreFinding]:
    found = []
    for node in ast.walk(handler):
        if isinstance(node, ast.Return) and _is_zero(node.value):
            found.append(ZeroScoreFinding(function, node.lineno, "return " + ast.unparse(node.value)))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and _is_zero(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if _scoreish(target):
                    found.append(ZeroScoreFinding(
                        function, node.lineno, f"{ast.unparse(target)} = {ast.unparse(node.value)}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "append" and _scoreish(node.func.value)
              and node.args and _is_zero(node.args[0])):
            found.append(ZeroScoreFinding(function, node.lineno, ast.unparse(node)))
    return found


def zero_scores_on_error(source: str) -> list[ZeroScoreFinding]:
    """Find the ``except`` blocks of scoring functions in ``source`` that make a score of 0.

    A scoring function is one whose name contains a word of :data:`SCORING_WORDS`. Flagged
    inside its ``except`` blocks: ``return 0`` (or ``0.0``, or a tuple starting with 0), an
    assignment of 0 to a name containing ``score`` or ``reward``, and ``scores.append(0)``.

    Args:
        source: Python source (a module, a class or a function; indentation is removed).

    Returns:
        The findings, in source order (empty when there are none).

    Raises:
        SyntaxError: ``source`` is not valid Python.
    """
    tree = ast.parse(textwrap.dedent(source))
    found: list[ZeroScoreFinding] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                word in node.name.lower() for word in SCORING_WORDS):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ExceptHandler):
                    found.extend(_findings_in_handler(node.name, inner))
    return sorted(set(found), key=lambda f: (f.line, f.what))


def env_zero_score_findings(env_cls: type[Any]) -> list[tuple[str, ZeroScoreFinding]]:
    """The findings of :func:`zero_scores_on_error` in ``env_cls`` and its bases outside atroposlib.

    Returns:
        ``(file, finding)`` pairs with line numbers of that file; classes whose source cannot
        be read (built in, made at runtime) are skipped.
    """
    results = []
    for cls in env_cls.__mro__:
        if cls is object or cls.__module__.startswith("atroposlib."):
            continue
        try:
            lines, start = inspect.getsourcelines(cls)
            path = inspect.getsourcefile(cls) or "<unknown>"
        except (OSError, TypeError):
            continue
        for finding in zero_scores_on_error("".join(lines)):
            line = finding.line + start - 1
            results.append((path, ZeroScoreFinding(finding.function, line, finding.what)))
    return results


def warn_zero_scores(env_cls: type[Any]) -> list[tuple[str, ZeroScoreFinding]]:
    """Issue a :class:`ZeroScoreOnErrorWarning` for each finding in ``env_cls``; return them."""
    import warnings

    findings = env_zero_score_findings(env_cls)
    for path, f in findings:
        warnings.warn(ZeroScoreOnErrorWarning(
            f"{path}:{f.line}: {env_cls.__name__}.{f.function} scores 0 in an except block "
            f"({f.what}): that sends a made-up reward for a rollout the env could not judge. "
            "Let the exception out (the rollout then fails with kind env_error and gets no "
            "score), or mask it with atroposlib.envs.outcomes.exclude_member."), stacklevel=2)
    return findings


__all__ = ["SCORING_WORDS", "ZeroScoreFinding", "ZeroScoreOnErrorWarning",
           "env_zero_score_findings", "warn_zero_scores", "zero_scores_on_error"]
