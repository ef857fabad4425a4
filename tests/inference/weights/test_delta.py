"""Weight deltas: applying encode(old, new) to old gives new bit for bit, in both encodings."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.inference.weights import delta
from atroposlib.inference.weights.delta import DeltaError

DTYPES = {"bfloat16": (torch.bfloat16, torch.int16), "float16": (torch.float16, torch.int16),
          "float32": (torch.float32, torch.int32)}


@st.composite
def tensor_pairs(draw):
    """(old, new): random raw bits (NaNs, infinities, -0.0 included), some elements changed."""
    dtype, bits = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    shape = draw(st.lists(st.integers(1, 7), min_size=1, max_size=3))
    numel = 1
    for d in shape:
        numel *= d
    info = torch.iinfo(bits)
    values = draw(st.lists(st.integers(info.min, info.max), min_size=numel, max_size=numel))
    old = torch.tensor(values, dtype=bits).view(dtype).reshape(shape)
    new = old.clone()
    flat = new.view(bits).reshape(-1)
    for position, value in draw(st.lists(st.tuples(st.integers(0, numel - 1),
                                                   st.integers(info.min, info.max)), max_size=numel)):
        flat[position] = value
    return old, new


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(delta._bits(a), delta._bits(b))


@settings(max_examples=150, deadline=None)
@given(pairs=st.lists(tensor_pairs(), min_size=1, max_size=4), encoding=st.sampled_from(delta.ENCODINGS))
def test_apply_of_encode_gives_new_bit_for_bit(pairs, encoding):
    old = {f"model.layers.{i}.w": o for i, (o, _) in enumerate(pairs)}
    new = {f"model.layers.{i}.w": n for i, (_, n) in enumerate(pairs)}
    payload, stats = delta.encode(old, new, base_version=3, version=4, encoding=encoding)
    changed, header = delta.apply(payload, old, 3)
    assert (header.base_version, header.version, header.encoding) == (3, 4, encoding)
    result = {**old, **changed}
    assert all(_same_bits(result[k], new[k]) for k in new)
    differing = sum(int((delta._bits(old[k]) != delta._bits(new[k])).sum()) for k in new)
    assert stats.changed == differing
    assert set(changed) == {k for k in new if not _same_bits(old[k], new[k])}


@settings(max_examples=60, deadline=None)
@given(pair=tensor_pairs(), encoding=st.sampled_from(delta.ENCODINGS))
def test_apply_tensor_inverts_encode_tensor(pair, encoding):
    old, new = pair
    entries = delta.encode_tensor(old, new, encoding)
    if not entries:
        assert _same_bits(old, new)
        return
    assert _same_bits(delta.apply_tensor(old, entries, encoding), new)


@pytest.mark.parametrize("encoding", delta.ENCODINGS)
def test_a_receiver_on_another_base_or_copy_is_refused_and_left_alone(encoding):
    old = {"a": torch.arange(12, dtype=torch.float32).bfloat16().reshape(3, 4)}
    new = {"a": old["a"].clone()}
    new["a"][2, 3] = -1.0
    payload, _ = delta.encode(old, new, base_version=5, version=6, encoding=encoding)
    with pytest.raises(DeltaError) as wrong_version:
        delta.apply(payload, old, 4)
    assert wrong_version.value.reason == "base"
    drifted = {"a": old["a"].clone()}
    drifted["a"][0, 0] = 100.0
    kept = drifted["a"].clone()
    with pytest.raises(DeltaError) as mismatch:
        delta.apply(payload, drifted, 5)
    assert mismatch.value.reason == "checksum" and "a:" in mismatch.value.detail
    assert torch.equal(drifted["a"], kept)
    with pytest.raises(DeltaError) as missing:
        delta.apply(payload, {}, 5)
    assert missing.value.reason == "base"
    with pytest.raises(DeltaError) as garbage:
        delta.apply(b"not a delta", old, 5)
    assert garbage.value.reason == "payload"


def test_unchanged_tensors_cost_nothing_and_changes_are_counted():
    old = {"a": torch.zeros(1000, dtype=torch.bfloat16), "b": torch.ones(10, dtype=torch.bfloat16)}
    new = {"a": old["a"].clone(), "b": old["b"].clone()}
    new["a"][[3, 500]] = 2.0
    payload, stats = delta.encode(old, new, base_version=0, version=1, encoding="index")
    assert (stats.changed, stats.elements, stats.tensors_changed) == (2, 1010, 1)
    assert stats.full_nbytes == 2020 and stats.nbytes == len(payload)
    assert list(delta.read_header(payload).tensors) == ["a"]
    with pytest.raises(ValueError, match="tensor sets differ"):
        delta.encode(old, {"a": new["a"]}, base_version=0, version=1)
    with pytest.raises(ValueError, match="shape or dtype"):
        delta.encode_tensor(old["a"], old["a"].float())


def test_checksum_is_sha256_of_the_raw_bytes():
    import hashlib

    t = torch.tensor([1.0, -0.0, 2.5], dtype=torch.bfloat16)
    assert delta.checksum(t) == hashlib.sha256(t.view(torch.int16).numpy().tobytes()).hexdigest()
    assert delta.checksum(t) != delta.checksum(torch.tensor([1.0, 0.0, 2.5], dtype=torch.bfloat16))


def test_an_unchanged_tensor_that_differs_at_the_receiver_is_caught():
    old = {"a": torch.zeros(8, dtype=torch.bfloat16), "b": torch.ones(8, dtype=torch.bfloat16)}
    new = {"a": old["a"].clone(), "b": old["b"].clone()}
    new["a"][0] = 1.0
    payload, stats = delta.encode(old, new, base_version=1, version=2)
    assert set(stats.checksums) == {"a", "b"}
    receiver = {"a": old["a"].clone(), "b": old["b"].clone()}
    receiver["b"][5] = 3.0  # the trainer never sends "b": its checksum still catches this
    with pytest.raises(DeltaError) as mismatch:
        delta.apply(payload, receiver, 1)
    assert mismatch.value.reason == "checksum" and mismatch.value.detail.startswith("b:")
