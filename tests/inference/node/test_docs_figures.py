"""docs/inference-node.md states the figures its end-to-end tests assert."""

import re
from pathlib import Path

from tests.e2e.test_inference_node_e2e import LOGPROB_GAP
from tests.e2e.test_node_rollback_e2e import SAME_WEIGHTS

DOC = Path(__file__).resolve().parents[3] / "docs" / "inference-node.md"


def _stated(pattern: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, " ".join(DOC.read_text().split()))]


def test_the_node_page_states_the_log_prob_gaps_the_e2e_tests_assert():
    assert _stated(r"within (\d(?:\.\d+)?e-\d+) of an HF forward") == [LOGPROB_GAP]
    assert _stated(r"stays within (\d(?:\.\d+)?e-\d+) of before") == [SAME_WEIGHTS]
