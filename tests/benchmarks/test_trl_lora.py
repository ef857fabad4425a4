"""TRL's LoRA contender: its setting's grammar and record, and adapters placed as our quickstart's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.learning.ours import lora_placement
from benchmarks.learning.trl_side import TrlSetting

ROOT = Path(__file__).resolve().parents[2]


def test_lora_parses_names_and_records_itself():
    setting = TrlSetting.parse("lr=3e-4,lora=16")
    assert setting == TrlSetting(lr=3e-4, lora_r=16)
    assert setting.name == "trl-lr0.0003-fp32-token-lora16"
    assert TrlSetting(**setting.record()) == setting


def test_a_full_fine_tune_records_as_before_lora_existed():
    setting = TrlSetting.parse("lr=6e-5,bf16=1,level=sequence,lora=0")
    assert setting.record() == {"lr": 6e-5, "bf16": True, "level": "sequence"}
    assert setting.name == "trl-lr6e-05-bf16-sequence"


def test_a_bad_rank_is_refused_with_the_grammar():
    with pytest.raises(ValueError, match="lora=RANK"):
        TrlSetting.parse("lora=sixteen")


def test_trl_adapts_the_modules_and_layers_our_trainer_adapts(bundled_model_dir):
    """Both sides' peft models have the same LoRA parameters, by name and shape."""
    import torch
    from transformers import AutoModelForCausalLM

    from atroposlib.utils.yaml_file import load_yaml
    from example_trainer.config import TrainerConfig
    from example_trainer.lora import apply_lora

    ours = TrainerConfig(**load_yaml(ROOT / "configs" / "quickstart-cpu.yaml")["trainer"])
    placement = lora_placement(ours.lora_r)

    def adapters(**kwargs):
        model = AutoModelForCausalLM.from_pretrained(str(bundled_model_dir), dtype=torch.float32)
        peft_model = apply_lora(model, **kwargs)
        return {n: tuple(p.shape) for n, p in peft_model.named_parameters() if p.requires_grad}

    theirs = adapters(**placement)
    assert theirs == adapters(r=ours.lora_r, alpha=ours.lora_alpha, dropout=ours.lora_dropout,
                              target_modules=ours.lora_target_modules, last_layers=ours.train_last_layers)
    assert theirs and all("lora_" in n for n in theirs)
    layers = {int(n.split(".layers.")[1].split(".")[0]) for n in theirs}
    assert layers == set(range(30 - ours.train_last_layers, 30))
