"""check_env warns when an env's scoring code scores 0 inside an except block."""

from __future__ import annotations

import inspect
import warnings

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.env_runtime.score_lint import (
    ZeroScoreOnErrorWarning,
    env_zero_score_findings,
    zero_scores_on_error,
)
from atroposlib.testing.fake_server import FakeServer
from tests.envs import zero_score_env
from tests.fixtures.sample_envs import SingleRolloutEnv


async def test_check_env_warns_on_the_sample_env_file(tiny_tokenizer_dir):
    cls = zero_score_env.ZeroOnErrorEnv
    with pytest.warns(ZeroScoreOnErrorWarning) as caught:
        groups = await check_env(cls, FakeServer(['{"answer": 4}', "four"]),
                                 {"tokenizer_name": str(tiny_tokenizer_dir), "group_size": 2,
                                  "ensure_scores_are_not_same": False})
    assert groups  # a warning, not a failure: the env still runs
    messages = [str(w.message) for w in caught if w.category is ZeroScoreOnErrorWarning]
    assert len(messages) == 1
    line = inspect.getsource(zero_score_env).splitlines().index("            return 0.0") + 1
    assert f"zero_score_env.py:{line}: ZeroOnErrorEnv.score scores 0 in an except block" in messages[0]
    assert "(return 0.0)" in messages[0] and "kind env_error" in messages[0]


async def test_a_clean_env_gets_no_warning(tiny_tokenizer):
    assert env_zero_score_findings(SingleRolloutEnv) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroScoreOnErrorWarning)
        await check_env(SingleRolloutEnv, tokenizer=tiny_tokenizer,
                        config_overrides={"group_size": 2, "ensure_scores_are_not_same": False})


@pytest.mark.parametrize(("body", "what"), [
    ("try:\n    s = f()\nexcept Exception:\n    return 0\nreturn s", "return 0"),
    ("try:\n    return f()\nexcept ValueError:\n    return -0.0", "return -0.0"),
    ("try:\n    return f()\nexcept ValueError:\n    return 0, {'error': 1}", "return (0, {'error': 1})"),
    ("try:\n    score = f()\nexcept Exception:\n    score = 0.0\nreturn score", "score = 0.0"),
    ("try:\n    self.reward = f()\nexcept Exception:\n    self.reward = 0", "self.reward = 0"),
    ("for x in xs:\n    try:\n        scores.append(f(x))\n    except Exception:\n"
     "        scores.append(0)", "scores.append(0)"),
])
def test_zero_scores_in_except_blocks_are_found(body: str, what: str) -> None:
    source = "async def score_reply(self, xs):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    [finding] = zero_scores_on_error(source)
    assert (finding.function, finding.what) == ("score_reply", what)


@pytest.mark.parametrize("source", [
    "def score(x):\n    try:\n        return f(x)\n    except Exception:\n        raise\n",
    "def score(x):\n    try:\n        return f(x)\n    except Exception:\n        return None\n",
    "def score(x):\n    try:\n        return f(x)\n    except Exception:\n        count = 0\n        raise\n",
    "def score(x):\n    if not x:\n        return 0\n    return 1\n",  # a real 0, not an error
    "def parse(x):\n    try:\n        return int(x)\n    except ValueError:\n        return 0\n",
])
def test_other_code_is_not_flagged(source: str) -> None:
    assert zero_scores_on_error(source) == []
