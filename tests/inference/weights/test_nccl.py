"""The NCCL path (never run here: no GPU) still matches the installed vLLM's weight-transfer API.

What can be checked without CUDA: the control-plane client satisfies vLLM's
``VLLMWeightSyncClient`` protocol, the weight source satisfies ``WeightSource`` (metadata in step
with iteration), and the init info the trainer builds is what vLLM's NCCL engine takes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
weight_transfer = pytest.importorskip("vllm.distributed.weight_transfer")


def test_the_node_client_is_a_vllm_weight_sync_client():
    from atroposlib.inference.weights.nccl import NodeWeightSyncClient

    client = NodeWeightSyncClient("http://node:9100", {}, 5.0)
    assert isinstance(client, weight_transfer.VLLMWeightSyncClient)


def test_the_weight_source_declares_what_it_yields():
    from atroposlib.inference.weights.nccl import _DictSource

    holder = _DictSource(torch.device("cpu"))
    holder.tensors = {"model.layers.1.w": torch.ones(2, 3, dtype=torch.bfloat16),
                      "model.norm.weight": torch.ones(3)}
    source = holder.build()
    assert isinstance(source, weight_transfer.WeightSource)
    assert [(m.name, m.dtype, m.shape) for m in source.metadata()] == [
        ("model.layers.1.w", torch.bfloat16, (2, 3)), ("model.norm.weight", torch.float32, (3,))]
    assert [name for name, _ in source] == list(holder.tensors)
    assert [names for names, _ in source.iter_groups()] == [["model.layers.1.w"], ["model.norm.weight"]]


def test_the_trainer_init_info_is_vllms_nccl_one():
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    info = NCCLTrainerInitInfo(master_address="10.0.0.1", master_port=29555, world_size=3, rank=0)
    assert info.backend == "nccl" and info.is_sender


def test_sparse_patches_turn_what_a_node_holds_into_the_new_weights():
    """What a ``--weight-transfer nccl-sparse`` node receives, applied the way vLLM's checkpoint
    patch loader does (flat index -> value): every element on a first round, the changes after."""
    from vllm.distributed.weight_transfer.sparse_nccl_engine import (
        SparseNCCLTrainerInitInfo,
        SparseNCCLTrainerWeightTransferEngine,
        SparseWeightPatch,
    )

    from atroposlib.inference.weights.nccl import sparse_patch_arrays

    old = {"model.layers.1.w": torch.randn(4, 5).bfloat16(), "model.norm.weight": torch.ones(5).bfloat16()}
    new = {n: t.clone() for n, t in old.items()}
    new["model.layers.1.w"][2, 3] += 1.0

    def applied(held, patches):
        out = {n: t.clone() for n, t in held.items()}
        for name, indices, values, shape in patches:
            assert tuple(out[name].shape) == shape and indices.dtype == torch.int32
            out[name].view(-1)[indices.long()] = values
        return out

    first = sparse_patch_arrays(None, new)
    blank = {n: torch.zeros_like(t) for n, t in new.items()}
    assert [p[0] for p in first] == list(new) and all(torch.equal(applied(blank, first)[n], new[n]) for n in new)
    changes = sparse_patch_arrays(old, new)
    assert [(p[0], p[1].tolist()) for p in changes] == [("model.layers.1.w", [13])]
    assert all(torch.equal(applied(old, changes)[n], new[n]) for n in new)
    for name, indices, values, shape in changes:  # vLLM's own checks accept them
        SparseNCCLTrainerWeightTransferEngine._validate_patch(
            SparseWeightPatch(name=name, indices=indices, values=values, full_shape=shape))
    assert SparseNCCLTrainerInitInfo.backend == "sparse_nccl"
