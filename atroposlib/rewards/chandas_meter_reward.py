"""``chandasmeter``: does a Sanskrit verse scan in the target meter (optional ``chandas`` package)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import Completion, RewardFunction, get_content

#: IAST letters (and the aspirate/diphthong digraphs) that SLP1 writes with one ASCII letter.
#: Letters not listed (a, i, u, e, o, k, g, c, j, t, d, n, p, b, m, y, r, l, v, s, h) are the same
#: in both schemes. Source: the SLP1 table of Scharf & Hyman, "Linguistic Issues in Encoding
#: Sanskrit" (2011), App. B.
IAST_TO_SLP1: dict[str, str] = {
    "kh": "K", "gh": "G", "ch": "C", "jh": "J", "ṭh": "W", "ḍh": "Q", "th": "T", "dh": "D",
    "ph": "P", "bh": "B", "ai": "E", "au": "O",
    "ā": "A", "ī": "I", "ū": "U", "ṛ": "f", "ṝ": "F", "ḷ": "x", "ḹ": "X",
    "ṅ": "N", "ñ": "Y", "ṭ": "w", "ḍ": "q", "ṇ": "R", "ś": "S", "ṣ": "z",
    "ṃ": "M", "ṁ": "M", "ḥ": "H",
}
# Longest first, so "kh" wins over "k" + "h".
_IAST = re.compile("|".join(sorted(map(re.escape, IAST_TO_SLP1), key=len, reverse=True)))


def iast_to_slp1(text: str) -> str:
    """Transliterate IAST (``dharmakṣetre``) to SLP1 (``Darmakzetre``); input is lower-cased.

    Characters outside the table pass through unchanged.
    """
    return _IAST.sub(lambda m: IAST_TO_SLP1[m.group(0)], text.lower())


def resource_filename(package: str, resource: str) -> str:
    """Filesystem path of ``resource`` inside installed ``package`` (``pkg_resources`` style).

    Kept at this path because Atropos 0.4 imported ``pkg_resources.resource_filename`` here;
    implemented with :mod:`importlib.resources` (``pkg_resources`` is deprecated).
    """
    from importlib.resources import files

    return str(files(package).joinpath(resource))


@registry.register
class ChandasMeterReward(RewardFunction):
    """1.0 when the ``chandas`` classifier identifies the target meter, else 0.0.

    The completion is transliterated with :func:`iast_to_slp1` and classified; when the
    classifier's result carries a ``score`` in [0, 1], a match scores that instead of 1.0.
    Upstream (Atropos 0.4) gave a mismatch ``1 - score`` and scored 0.0 for every completion
    when ``chandas`` was missing; here a mismatch is 0.0 and a missing package is an error.

    Args:
        meter: the target meter's name as ``chandas`` reports it (``"tristubh"``).
        classifier: an object with ``classify(slp1_text)`` returning a result with ``name``
            (and optionally ``score``), or None to load ``chandas.Classifier``.
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.

    Raises:
        ImportError: ``classifier`` is None and the ``chandas`` package is not installed.
    """

    def __init__(self, meter: str = "tristubh", classifier: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.meter = meter.lower()
        if classifier is None:
            try:
                from chandas import Classifier  # type: ignore[import-not-found]
            except ImportError as exc:
                raise ImportError(
                    "the chandasmeter reward needs the optional 'chandas' package "
                    "(pip install chandas), or pass classifier=..."
                ) from exc
            classifier = Classifier.from_default_location()
        self.classifier = classifier

    def _score(self, text: str) -> float:
        result = self.classifier.classify(iast_to_slp1(text))
        if not result:
            return 0.0
        predicted = str(getattr(result, "name", result)).lower()
        if predicted != self.meter:
            return 0.0
        score = getattr(result, "score", 1.0)
        return min(max(float(score), 0.0), 1.0)

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion (no keywords are used)."""
        return [self._score(get_content(c)) for c in completions]
