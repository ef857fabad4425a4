"""Poison stops at the edge: run-api refuses groups that would crash or corrupt training.

The thirteen bad groups of the issue-24 probe, posted to a real run-api (uvicorn on 127.0.0.1)
whose trainer registered ``vocab_size=49152`` and ``max_token_len=64``. Each is refused with a
4xx naming the group, its env and the likely cause; the good groups already queued stay and are
served. Before a trainer registers, what needs no vocabulary is still checked.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from atroposlib.api.checks import group_problem
from atroposlib.api.models import MAX_ABS_SCORE
from tests.fixtures.api_server import RunApi, start_run_api

from .conftest import REGISTRATION

VOCAB = 49152
MAX_LEN = 64


def good_group(env_id: int | None, seed: int = 0) -> dict[str, Any]:
    """Two sequences of 8 tokens, 3 prompt tokens masked, labels = token ids after."""
    tokens = [[(seed * 97 + 13 * i + 7 * t) % 1000 + 1 for t in range(8)] for i in range(2)]
    group = {"tokens": tokens, "masks": [[-100] * 3 + row[3:] for row in tokens],
             "scores": [1.0, -1.0]}
    if env_id is not None:
        group["env_id"] = env_id
    return group


def changed(edit: Callable[[dict[str, Any]], None]) -> Callable[[int | None], dict[str, Any]]:
    def make(env_id: int | None) -> dict[str, Any]:
        group = copy.deepcopy(good_group(env_id, seed=5))
        edit(group)
        return group
    return make


def _set(path: tuple, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(group: dict[str, Any]) -> None:
        target = group
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _both(row: int, token: int, label: int | None = None) -> Callable[[dict[str, Any]], None]:
    """Put ``token`` at position 5 of ``row``, with ``label`` (default: the token) in masks."""
    def edit(group: dict[str, Any]) -> None:
        group["tokens"][row][5] = token
        group["masks"][row][5] = token if label is None else label
    return edit


def _rows(tokens: list[int], masks: list[int]) -> Callable[[dict[str, Any]], None]:
    def edit(group: dict[str, Any]) -> None:
        group["tokens"][1] = tokens
        group["masks"][1] = masks
    return edit


def _all_masked(group: dict[str, Any]) -> None:
    group["masks"] = [[-100] * len(row) for row in group["tokens"]]


def _long(group: dict[str, Any]) -> None:
    row = [(7 * t) % 900 + 1 for t in range(500)]
    group["tokens"][0] = row
    group["masks"][0] = [-100] * 10 + row[10:]


def _mismatch(group: dict[str, Any]) -> None:
    group["masks"][1][6] = group["tokens"][1][6] + 1  # in the vocabulary, but not the token


#: (name, group maker, expected status, reason text expected in the answer)
CASES: list[tuple[str, Callable[[int | None], dict[str, Any]], int, str]] = [
    ("negative id", changed(_both(0, -3)), 422, "tokens"),
    ("masks longer than tokens", changed(lambda g: g["masks"][0].append(-100)), 422, "masks[0]"),
    ("NaN score", changed(_set(("scores", 0), math.nan)), 422, "scores"),
    ("id 49159", changed(_both(1, 49159)), 422, "outside the trainer's vocabulary [0, 49152)"),
    ("id 2**31-1", changed(_both(0, 2**31 - 1)), 422, "outside the trainer's vocabulary"),
    ("label -5", changed(_set(("masks", 0, 4), -5)), 422, "masks[0][4] is -5"),
    ("label 49155", changed(_set(("masks", 1, 6), 49155)), 422, "masks[1][6] is 49155"),
    ("all-masked group", changed(_all_masked), 422, "trains no token"),
    ("score 1e308", changed(_set(("scores", 1), 1e308)), 422, "|score| <= 1e+06"),
    ("score -1e308", changed(_set(("scores", 0), -1e308)), 422, "|score| <= 1e+06"),
    ("empty sequence", changed(_rows([], [])), 422, "tokens[1] is empty"),
    ("one-token sequence", changed(_rows([5], [5])), 422, "masks[1] trains no token"),
    ("labels differ from tokens", changed(_mismatch), 422, "the label must be the token id"),
    ("500 tokens, max_token_len 64", changed(_long), 422, "more than the trainer's max_token_len 64"),
]
#: Refused by the wire model (422 before any content check), on main already.
WIRE_REFUSED = {"negative id", "masks longer than tokens", "NaN score"}
#: Refusals that name the likely cause: a tokenizer that is not the trainer's.
TOKENIZER_CASES = {"id 49159", "id 2**31-1", "label -5", "label 49155", "labels differ from tokens"}


def post(api: RunApi, path: str, body: Any) -> httpx.Response:
    """POST ``body`` as JSON; ``json.dumps`` writes NaN as the bare token ``NaN`` (orjson: null)."""
    return httpx.post(api.url + path, content=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"}, timeout=10)


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[RunApi, int]]:
    """A run-api whose trainer registered vocab 49152 and max_token_len 64, with one env."""
    server = start_run_api()
    try:
        registration = {**REGISTRATION, "batch_size": 4, "max_token_len": MAX_LEN,
                        "vocab_size": VOCAB}
        assert post(server, "/register", registration).status_code == 200
        assert httpx.get(server.url + "/batch").status_code == 200
        env = post(server, "/register-env", {"max_token_length": MAX_LEN, "desired_name": "probe",
                                             "weight": 1.0, "group_size": 2}).json()["env_id"]
        yield server, env
    finally:
        server.stop()


@pytest.mark.parametrize(("name", "make", "status", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_probe_case_is_refused_with_its_cause(api, name, make, status, expected) -> None:
    server, env = api
    before = httpx.get(server.url + "/status").json()["queue_size"]
    response = post(server, "/scored_data", make(env))
    assert response.status_code == status, response.text
    assert expected in response.text, response.text
    if name not in WIRE_REFUSED:
        detail = response.json()["detail"]
        assert detail.startswith("the group (env 0 'probe_0'): "), detail
    if name in TOKENIZER_CASES:
        assert "tokenizer" in response.text
    assert httpx.get(server.url + "/status").json()["queue_size"] == before


def test_a_bad_group_in_a_list_names_its_index_and_nothing_accepted_is_lost(api) -> None:
    server, env = api
    queued = httpx.get(server.url + "/status").json()["queue_size"]
    assert post(server, "/scored_data", good_group(env, seed=1)).status_code == 200
    bad = changed(_both(1, 49159))(env)
    response = post(server, "/scored_data_list", [good_group(env, seed=2), bad])
    assert response.status_code == 422
    assert response.json()["detail"].startswith("group 1 of 2 in this request (env 0 'probe_0'): ")
    assert httpx.get(server.url + "/status").json()["queue_size"] == queued + 1
    assert post(server, "/scored_data", good_group(env, seed=3)).status_code == 200
    batch = httpx.get(server.url + "/batch").json()["batch"]
    assert [g["tokens"] for g in batch] == [good_group(env, 1)["tokens"], good_group(env, 3)["tokens"]]


def test_before_registration_what_needs_no_vocabulary_is_checked(run_api: RunApi) -> None:
    #: needs the trainer's vocab_size or max_token_len: accepted while nobody registered them
    unknowable = {"id 49159", "id 2**31-1", "500 tokens, max_token_len 64"}
    for name, make, _status, expected in CASES:
        response = post(run_api, "/scored_data", make(None))
        if name in unknowable:
            assert response.status_code == 200, (name, response.text)
            continue
        assert response.status_code == 422, (name, response.text)
        if name == "label 49155":  # no vocabulary yet, but it is not the token either
            expected = "the label must be the token id"
        assert expected in response.text, (name, response.text)


def test_an_atropos_0_4_trainer_without_vocab_size_still_works(run_api: RunApi) -> None:
    assert post(run_api, "/register", {**REGISTRATION, "batch_size": 2}).status_code == 200
    assert post(run_api, "/scored_data", changed(_both(1, 49159))(None)).status_code == 200
    assert len(httpx.get(run_api.url + "/batch").json()["batch"]) == 1


def test_an_atropos_0_4_trainer_gets_any_mask_values_as_there(run_api: RunApi) -> None:
    """No vocab_size registered: masks are not judged as labels (Atropos 0.4's own tests send
    0/1 masks); empty sequences and out-of-bounds scores are still refused."""
    assert post(run_api, "/register", {**REGISTRATION, "batch_size": 2}).status_code == 200
    zero_one = {"tokens": [[820, 821, 822]], "masks": [[1, 1, 1]], "scores": [0.5]}
    untrained = {"tokens": [[5, 6]], "masks": [[-100, -100]], "scores": [0.5]}
    for group in (zero_one, untrained):
        assert post(run_api, "/scored_data", group).status_code == 200, group
    assert [g["masks"] for g in httpx.get(run_api.url + "/batch").json()["batch"]] == [
        [[1, 1, 1]], [[-100, -100]]]
    empty = {"tokens": [[]], "masks": [[]], "scores": [0.5]}
    assert "empty" in post(run_api, "/scored_data", empty).text
    huge = {**zero_one, "scores": [MAX_ABS_SCORE * 2]}
    assert post(run_api, "/scored_data", huge).status_code == 422


def test_a_trainer_that_registers_vocab_size_gets_the_label_checks(run_api: RunApi) -> None:
    assert post(run_api, "/register", {**REGISTRATION, "batch_size": 2,
                                       "vocab_size": VOCAB}).status_code == 200
    response = post(run_api, "/scored_data",
                    {"tokens": [[820, 821, 822]], "masks": [[1, 1, 1]], "scores": [0.5]})
    assert response.status_code == 422 and "the label must be the token id" in response.text


def test_group_problem_is_a_pure_function_the_trainer_can_reuse() -> None:
    assert group_problem([[1, 2, 3]], [[-100, 2, 3]], [0.5], vocab_size=4) is None
    assert group_problem([[1, 2, 3]], [[-100, 2, 3]], [0.5], vocab_size=3).reason == "vocab"
    assert group_problem([[1, 2]], [[-100, -100]], [0.0]).reason == "no_trained_token"
    assert group_problem([[1, 2]], [[1, -100]], [0.0]).reason == "no_trained_token"  # t=0 only
    # interleaved masks (multi-turn): trained positions anywhere after the first
    assert group_problem([[1, 2, 3, 4]], [[-100, 2, -100, 4]], [0.0]) is None
    assert group_problem([[1, 2, 3, 4]], [[-100, 2, -100, 5]], [0.0]).reason == "label_mismatch"
    assert group_problem([[1, 2]], [[-100, 2]], [MAX_ABS_SCORE]) is None
    assert group_problem([[1, 2]], [[-100, 2]], [-MAX_ABS_SCORE * 1.01]).reason == \
        "score_out_of_bounds"
    assert group_problem([[1, 2, 3]], [[-100, 2, 3]], [0.0], max_token_len=3) is None
    assert group_problem([[1, 2, 3]], [[-100, 2, 3]], [0.0], max_token_len=2).reason == "too_long"
