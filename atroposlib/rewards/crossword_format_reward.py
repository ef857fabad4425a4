"""``crosswordformat``: reward answers laid out as ``1-Across: WORD, 2-Down: WORD``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import Completion, RewardFunction, get_content

#: One clue answer: number, direction, colon, then the answer up to a comma or line end.
_ENTRY = re.compile(r"(\d+)\s*-\s*(Across|Down)\s*:\s*([^,\n]*)", re.IGNORECASE)


@registry.register
class CrosswordFormatReward(RewardFunction):
    """``reward_value`` when a completion gives crossword answers as ``N-Across: WORD``.

    A completion earns the reward when it contains at least one ``N-Across:`` / ``N-Down:``
    entry (or matches one of ``format_patterns``) and, with ``penalize_invalid_chars``, every
    answer consists only of ``valid_chars`` (case-insensitive; spaces between words allowed).
    Otherwise it scores 0.0. Upstream (Atropos 0.4) extracted only the leading letters of each
    answer, so ``1-Across: CAT5`` passed its character check; here the whole answer is checked.

    Args:
        format_patterns: regexes (compiled or strings) a completion may match instead of the
            built-in ``N-Across: WORD`` entry form; searched anywhere in the text.
        reward_value: the reward for a well-formatted completion.
        penalize_invalid_chars: require every answer to use only ``valid_chars``.
        valid_chars: allowed answer letters (default A-Z).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(
        self,
        format_patterns: Sequence[re.Pattern[str] | str] | None = None,
        reward_value: float = 1.0,
        penalize_invalid_chars: bool = True,
        valid_chars: str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.format_patterns = [
            re.compile(p, re.IGNORECASE) if isinstance(p, str) else p
            for p in (format_patterns or [])
        ]
        self.reward_value = reward_value
        self.penalize_invalid_chars = penalize_invalid_chars
        self.valid_chars = set(valid_chars.upper())

    def _answer_ok(self, answer: str) -> bool:
        letters = answer.strip().upper().replace(" ", "")
        return bool(letters) and all(c in self.valid_chars for c in letters)

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion (no keywords are used)."""
        scores = []
        for completion in completions:
            text = get_content(completion)
            entries = _ENTRY.findall(text)
            formatted = bool(entries) or any(p.search(text) for p in self.format_patterns)
            valid = not self.penalize_invalid_chars or all(
                self._answer_ok(answer) for _, _, answer in entries
            )
            scores.append(self.reward_value if formatted and valid else 0.0)
        return scores


def crossword_format_reward(completions: Sequence[Completion], **kwargs: Any) -> list[float]:
    """Atropos 0.4's function form: :class:`CrosswordFormatReward` with its defaults (unweighted)."""
    return CrosswordFormatReward().compute(completions, **kwargs)
