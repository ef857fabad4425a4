"""``--weight-sync lora``: the adapter is saved and hot-loaded into vLLM through its HTTP API.

A stand-in server (uvicorn on 127.0.0.1) plays vLLM's ``POST /v1/load_lora_adapter``; whether a
real vLLM applies the adapter is an e2e/GPU check, this one pins what the trainer sends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atroposlib.errors import InferenceError
from example_trainer.config import TrainerConfig
from example_trainer.lora import apply_lora
from example_trainer.vllm_sync import VLLMSync
from tests.fixtures.app_thread import AppThread

torch = pytest.importorskip("torch")


class FakeLoraVLLM:
    """Answers ``/health`` and ``/v1/load_lora_adapter`` (200, or ``status`` when set)."""

    def __init__(self, status: int = 200) -> None:
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        self.loads: list[dict] = []
        app = FastAPI()

        @app.get("/health")
        def health() -> dict:
            return {}

        @app.post("/v1/load_lora_adapter")
        def load(body: dict) -> JSONResponse:
            adapter = Path(body["lora_path"])
            self.loads.append({**body, "files": sorted(p.name for p in adapter.iterdir())})
            return JSONResponse({"detail": "LoRA is not enabled"} if status != 200 else {}, status_code=status)

        self.app = AppThread(app)
        self.port = self.app.port

    def __enter__(self) -> FakeLoraVLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.app.stop()


def _base_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=32))


def _lora_model():
    return apply_lora(_base_model(), r=4, alpha=8, dropout=0.0,
                      target_modules=TrainerConfig(lora_r=4).lora_target_modules)


def test_lora_sync_hot_loads_the_saved_adapter_in_place_under_one_name(tmp_path):
    model = _lora_model()
    with FakeLoraVLLM() as vllm:
        config = TrainerConfig(lora_r=4, weight_sync="lora", served_model_name="policy",
                               vllm_url=f"http://127.0.0.1:{vllm.port}/v1")
        sync = VLLMSync(config, tmp_path)
        assert sync.model_name == "policy-lora"  # what rollouts must request
        metrics = sync.sync(model, tokenizer=None)
        sync.sync(model, tokenizer=None)
    assert set(metrics) == {"sync/save_seconds", "sync/update_seconds", "sync/path", "sync/bytes",
                            "sync/full_bytes", "sync/seconds", "sync/changed_fraction"}
    assert metrics["sync/path"] == "lora" and metrics["sync/bytes"] > 0
    assert [(x["lora_name"], x["load_inplace"]) for x in vllm.loads] == [("policy-lora", True)] * 2
    # each push from a new folder: vLLM's prefix cache keys LoRA blocks by the adapter's path
    adapter, second = (Path(x["lora_path"]) for x in vllm.loads)
    assert adapter.is_absolute() and adapter == (tmp_path / "vllm_weights" / "adapters" / "push_0").resolve()
    assert second == adapter.parent / "push_1" == sync.adapters.latest
    assert "adapter_config.json" in vllm.loads[0]["files"]
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4


def test_lora_sync_refused_names_the_vllm_flags_to_add(tmp_path):
    with FakeLoraVLLM(status=400) as vllm:
        config = TrainerConfig(lora_r=4, weight_sync="lora", vllm_url=f"http://127.0.0.1:{vllm.port}/v1")
        with pytest.raises(InferenceError, match=r"answered 400.*--enable-lora --max-lora-rank 8.*--weight-sync reload"):
            VLLMSync(config, tmp_path).sync(_lora_model(), tokenizer=None)


def test_stop_reports_a_failed_background_sync_instead_of_dropping_it(tmp_path, capsys):
    from concurrent.futures import Future

    sync = VLLMSync(TrainerConfig(vllm_url="http://127.0.0.1:9/v1"), tmp_path)
    failed: Future = Future()
    failed.set_exception(InferenceError("vLLM at 127.0.0.1:9 refused the reload"))
    sync.background.pending = failed  # what sync(background=True) leaves when its thread fails
    sync.stop()  # shutting down: no raise
    assert "background weight sync failed while stopping: vLLM at 127.0.0.1:9 refused" \
        in capsys.readouterr().err
    assert sync.background.pending is None


class _ReloadRecorder:
    """Stands in for the trainer's own VLLMProcess: records what each reload would read."""

    heap_released_bytes = None

    def __init__(self) -> None:
        self.files: list[dict] = []

    def reload_weights(self, weights_dir: Path) -> float:
        from safetensors.torch import load_file

        self.files.append(load_file(str(weights_dir / "model.safetensors")))
        return 0.0


@pytest.mark.parametrize("background", [False, True])
def test_a_lora_reload_writes_only_the_adapted_blocks_merged(tmp_path, background):
    """vLLM already holds the frozen weights it started on: a LoRA reload writes the merged
    weights of the adapted decoder blocks (whole blocks: vLLM fuses q/k/v), nothing else."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.lora import merged_state_dict

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=3, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=32))
    model = apply_lora(base, r=4, alpha=8, dropout=0.0,
                       target_modules=TrainerConfig(lora_r=4).lora_target_modules, last_layers=1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    sync = VLLMSync(TrainerConfig(lora_r=4, vllm_dtype="bfloat16"), tmp_path)
    sync.process = recorder = _ReloadRecorder()
    sync.sync(model, tokenizer=None, background=background)
    sync.wait()
    (written,) = recorder.files
    assert written and all(name.startswith("model.layers.2.") for name in written)
    assert {n.rsplit(".", 2)[-2] for n in written} >= {"q_proj", "down_proj", "input_layernorm"}
    merged = merged_state_dict(model)
    for name, tensor in written.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, merged[name].to(torch.bfloat16))
    # the update is really in there: the adapted weights moved off the base ones
    q = "model.layers.2.self_attn.q_proj.weight"
    base_q = model.get_base_model().state_dict()["model.layers.2.self_attn.q_proj.base_layer.weight"]
    assert not torch.equal(written[q], base_q.to(torch.bfloat16))


def test_importing_peft_through_the_trainer_shows_no_qlora_kernel_warning():
    # on CPUs with AVX512_BF16, bitsandbytes (imported by peft) warns that it cannot load a 4-bit
    # kernel LoRA never uses; the trainer's LoRA module keeps that warning out of the logs. On
    # other CPUs peft prints no such warning in the first place: the import through the trainer
    # must then be just as clean (no skip: the hardware decides which half is exercised).
    import subprocess
    import sys

    def stderr_of(code: str) -> str:
        code = "import logging; logging.basicConfig(level=logging.WARNING); " + code
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stderr

    after = stderr_of("import example_trainer.lora; import peft")
    assert "kernels-community" not in after and "Error" not in after, after


def test_auto_pushes_the_adapter_when_it_is_smaller_than_the_merged_modules(tmp_path, capsys, monkeypatch):
    from example_trainer.sync_choice import choose_weight_sync, lora_push_bytes

    model = _lora_model()  # 2 layers, hidden 16, intermediate 32, r=4, all 7 projections
    adapter, merged = lora_push_bytes(model, "bfloat16")
    # per layer: q,k,v,o [16,16]; gate,up [32,16]; down [16,32] -> A [4,in] + B [out,4] in fp32
    per_layer_adapter = 4 * 4 * (16 + 16) + 2 * 4 * (16 + 32) + 4 * (32 + 16)
    per_layer_merged = 4 * 16 * 16 + 3 * 32 * 16
    assert (adapter, merged) == (2 * per_layer_adapter * 4, 2 * per_layer_merged * 2)
    config = TrainerConfig(lora_r=4, vllm_dtype="float32")
    assert config.weight_sync == "auto"  # the default
    choice = choose_weight_sync(config, model, managed=True, cpu_build=False)
    assert (choice.mode, choice.adapter_bytes, choice.merged_bytes) == ("lora", 2 * per_layer_adapter * 4,
                                                                        2 * per_layer_merged * 4)
    assert "adapter 0.01 MiB, merged modules 0.02 MiB at float32" in choice.why
    # --vllm-url servers would serve the adapter under another name: the weight push stays
    assert choose_weight_sync(config, model, managed=False, cpu_build=False).mode == "reload"
    # a CPU build keeps the weight push: sampling through an adapter costs more than it saves
    on_cpu = choose_weight_sync(config, model, managed=True, cpu_build=True)
    assert on_cpu.mode == "reload" and "on a CPU vLLM" in on_cpu.why and on_cpu.adapter_bytes > 0
    # a rank this high makes the adapter larger than the modules it adapts
    big = apply_lora(_base_model(), r=16, alpha=8, dropout=0.0, target_modules=["q_proj"])
    assert choose_weight_sync(TrainerConfig(lora_r=16), big, managed=True, cpu_build=False).mode == "reload"
    # a full fine-tune, and a mode the user set, are left alone
    assert choose_weight_sync(TrainerConfig(), _base_model(), managed=True).mode == "reload"
    assert choose_weight_sync(TrainerConfig(lora_r=4, weight_sync="reload"), model, True).mode == "reload"
    # VLLMSync logs the choice once, with both byte counts (a GPU build of vLLM)
    import atroposlib.inference.vllm_process as vllm_process

    monkeypatch.setattr(vllm_process, "vllm_is_cpu_build", lambda: False)
    sync = VLLMSync(TrainerConfig(lora_r=4, vllm_dtype="float32"), tmp_path)
    assert sync.choose(model) == "lora" and sync.choose(model) == "lora"
    out = capsys.readouterr().out
    assert out.count("[grpo] weight sync (auto): lora (adapter") == 1 and sync.serves_adapter_as_policy


def test_a_vllm_launched_for_lora_serves_the_adapter_under_the_served_name(tmp_path):
    from example_trainer.sync_choice import lora_rank_slot
    from example_trainer.vllm_sync import vllm_process

    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 64, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="up to 512.*--weight-sync reload"):
        lora_rank_slot(600)
    config = TrainerConfig(lora_r=4, served_model_name="policy", model=str(tmp_path / "m"),
                           vllm_kv_cache_gib=0.1, vllm_max_num_seqs=4)
    adapter = tmp_path / "adapters" / "push_0"
    command = vllm_process(config, tmp_path / "vllm.log", "lora", adapter).command()
    flag = command.index("--served-model-name")
    assert command[flag + 1] == "policy-base"
    assert command[command.index("--lora-modules") + 1] == f"policy={adapter}"
    assert command[command.index("--max-lora-rank") + 1] == "8"
    reload = vllm_process(config, tmp_path / "vllm.log", "reload").command()
    assert reload[reload.index("--served-model-name") + 1] == "policy" and "--enable-lora" not in reload
