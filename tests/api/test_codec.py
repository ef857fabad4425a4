"""The compact group blob renders back to exactly the JSON that was accepted."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.codec import decode_group, encode_group, group_json, group_python
from atroposlib.api.models import GROUP_FIELDS, ScoredData


@st.composite
def groups(draw):
    n = draw(st.integers(1, 4))
    lengths = [draw(st.integers(0, 6)) for _ in range(n)]
    # the wire bounds: token ids in [0, 2**31), labels in the signed 32-bit range
    token_ids = st.integers(0, 2**31 - 1) | st.integers(0, 60_000)
    labels = st.integers(-(2**31), 2**31 - 1) | st.integers(-200, 60_000)
    floats = st.floats(allow_nan=False, allow_infinity=False)
    tokens = [draw(st.lists(token_ids, min_size=t, max_size=t)) for t in lengths]
    group = {
        "tokens": tokens,
        "masks": [draw(st.lists(labels, min_size=t, max_size=t)) for t in lengths],
        "scores": draw(st.lists(floats, min_size=n, max_size=n)),
    }
    for name in ("advantages", "ref_logprobs", "inference_logprobs"):
        if draw(st.booleans()):
            group[name] = [draw(st.lists(floats, min_size=t, max_size=t)) for t in lengths]
    if draw(st.booleans()):
        group["messages"] = [[{"role": "user", "content": draw(st.text(max_size=5)), "x": None}]
                             for _ in range(n)]
    if draw(st.booleans()):
        group["generation_params"] = {"temperature": 0.7}
    if draw(st.booleans()):
        group["distill_token_ids"] = [[[1, 2]] * t for t in lengths]
        group["distill_logprobs"] = [[[-0.5, -1.5]] * t for t in lengths]
    return group


@given(groups())
@settings(max_examples=60, deadline=None)
def test_blob_renders_exact_json(raw: dict) -> None:
    model = ScoredData.model_validate(raw)
    expected = orjson.dumps({name: getattr(model, name) for name in GROUP_FIELDS})
    blob = encode_group(model)
    assert group_json(blob) == expected
    assert group_python(blob) == orjson.loads(expected)


def test_blob_keeps_64_bit_integers() -> None:
    """The codec itself stores any signed 64-bit value exactly (int64 when int32 is too small)."""
    group = {name: None for name in GROUP_FIELDS}
    group.update(tokens=[[2**63 - 1, 0], [-(2**63)]], masks=[[-100, 2**40], [7]], scores=[0.5, 1.0])
    assert orjson.loads(group_json(encode_group(group))) == group


def test_blob_is_compact() -> None:
    n, t = 8, 1024
    group = ScoredData(tokens=[[40_000 + i for i in range(t)]] * n, masks=[[-100] * t] * n,
                       scores=[0.5] * n, inference_logprobs=[[-0.123456789012345] * t] * n)
    blob = encode_group(group)
    assert len(blob) < 17 * n * t  # int32 tokens + int32 masks + float64 logprobs + header
    assert len(decode_group(blob)["tokens"]) == n
