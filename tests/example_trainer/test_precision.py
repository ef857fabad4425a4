"""``bf16_if_native``: the trainer's autocast and the launched vLLM's dtype follow the hardware."""

from __future__ import annotations

import pytest

import atroposlib.utils.cpu_features as cpu_features
from example_trainer.config import TrainerConfig
from example_trainer.precision import resolve_precision


@pytest.mark.parametrize(("native", "mixed", "dtype"), [(True, "bf16", "bfloat16"), (False, "no", "float32")])
def test_if_native_follows_the_cpus_flags(monkeypatch, native, mixed, dtype):
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: native)
    config = TrainerConfig(mixed_precision="bf16_if_native", vllm_dtype="bfloat16_if_native")
    resolved = resolve_precision(config, "cpu", vllm_on_cpu=True)
    assert (resolved.mixed_precision, resolved.vllm_dtype) == (mixed, dtype)
    assert config.mixed_precision == "bf16_if_native"  # the config given is left as it was


def test_a_gpu_is_native_and_concrete_settings_stay(monkeypatch):
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)
    config = TrainerConfig(mixed_precision="bf16_if_native", vllm_dtype="bfloat16_if_native")
    resolved = resolve_precision(config, "cuda", vllm_on_cpu=False)
    assert (resolved.mixed_precision, resolved.vllm_dtype) == ("bf16", "bfloat16")
    # a trainer on the CPU beside a GPU vLLM: each side by its own hardware
    split = resolve_precision(config, "cpu", vllm_on_cpu=False)
    assert (split.mixed_precision, split.vllm_dtype) == ("no", "bfloat16")
    concrete = TrainerConfig(mixed_precision="bf16", vllm_dtype="float32")
    assert resolve_precision(concrete, "cpu", vllm_on_cpu=True) is concrete


def test_the_flag_is_accepted_and_a_typo_is_refused():
    from pydantic import ValidationError

    assert TrainerConfig(mixed_precision="bf16_if_native").mixed_precision == "bf16_if_native"
    with pytest.raises(ValidationError, match="bf16_if_native"):
        TrainerConfig(mixed_precision="bf16-if-native")


def test_an_unquoted_yaml_no_is_no(tmp_path):
    from atroposlib.utils.yaml_file import load_yaml

    (tmp_path / "t.yaml").write_text("mixed_precision: no\n")  # PyYAML reads it as False
    assert TrainerConfig(**load_yaml(tmp_path / "t.yaml")).mixed_precision == "no"


def test_a_vllm_dtype_for_a_node_resolves_the_same_way(monkeypatch):
    from example_trainer.precision import vllm_dtype_for

    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)
    assert vllm_dtype_for("bfloat16_if_native", vllm_on_cpu=True) == "float32"
    assert vllm_dtype_for("bfloat16_if_native", vllm_on_cpu=False) == "bfloat16"
    assert vllm_dtype_for("float16", vllm_on_cpu=True) == "float16"
