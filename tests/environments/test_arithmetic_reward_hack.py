"""The arithmetic reward scores the reply's final number, not an echo of the question."""

import pytest

from atroposlib.environments.arithmetic_server import final_number, score_reply


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("12", 1.0),
        ("The answer is 12.", 1.0),
        ("7 + 5 = 12", 1.0),
        (r"\boxed{12}", 1.0),
        ("7 + 5", 0.0),  # math-verify alone would evaluate the echoed question to 12
        ("7 + 5 = x", 0.0),
        (r"\boxed{13} but maybe 12", 0.0),  # the boxed answer is the commitment
        ("no idea", 0.0),
    ],
)
def test_score_reply_uses_final_number(reply, expected):
    assert score_reply(reply, 12, "stop") == expected


def test_truncated_reply_scores_zero():
    assert score_reply("12", 12, "length") == 0.0


def test_final_number_prefers_boxed_and_handles_negatives():
    assert final_number(r"first 3, then \boxed{-4} and 9") == "-4"
    assert final_number("nothing") is None
