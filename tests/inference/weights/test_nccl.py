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
