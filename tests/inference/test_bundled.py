"""The bundled model: cache location, CLI, atomic idempotent build, logits equal to the GGUF."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.inference import bundled
from atroposlib.inference.bundled import (
    REQUIRED_FILES,
    bundled_gguf_path,
    bundled_model_dir,
    is_prepared,
    prepare_bundled_model,
)


def test_cache_dir_env_overrides_root(monkeypatch, tmp_path):
    monkeypatch.setenv("ATROPOS_CACHE_DIR", str(tmp_path / "c"))
    assert bundled_model_dir() == tmp_path / "c" / "bundled" / "SmolLM2-135M-Instruct"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundled_model_dir() == tmp_path / "c" / "bundled" / "SmolLM2-135M-Instruct"
    monkeypatch.delenv("ATROPOS_CACHE_DIR")
    assert bundled_model_dir() == tmp_path / "xdg/atroposlib/bundled/SmolLM2-135M-Instruct"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bundled_model_dir() == tmp_path / "home/.cache/atroposlib/bundled/SmolLM2-135M-Instruct"


def test_cli_prints_the_prepared_dir(bundled_model_dir):
    out = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.bundled_model"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert Path(out.stdout.strip()) == bundled_model_dir
    assert is_prepared(bundled_model_dir)


def test_incomplete_dir_is_not_prepared(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not is_prepared(tmp_path)


def test_fresh_build_is_atomic_idempotent_reproducible_and_exact(
    monkeypatch, tmp_path, bundled_model_dir
):
    """Build into a new cache root; the result equals the session dir and the GGUF's logits."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Reuse the already extracted GGUF (no second 93 MB download) in a brand-new cache root.
    gguf = bundled_gguf_path()
    root = tmp_path / "cache"
    (root / "gguf").mkdir(parents=True)
    os.symlink(gguf.parent, root / "gguf" / gguf.parent.name)
    monkeypatch.setenv("ATROPOS_CACHE_DIR", str(root))
    seen_during_build = []
    loaded = []
    real_convert, real_load = bundled._convert, bundled.load_gguf_model

    def spying_convert(gguf_path, out_dir):
        real_convert(gguf_path, out_dir)
        # Before the rename the final directory must not exist: readers never see half a model.
        seen_during_build.append(bundled.bundled_model_dir().exists())

    def spying_load(*args, **kwargs):
        loaded.append(real_load(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(bundled, "_convert", spying_convert)
    monkeypatch.setattr(bundled, "load_gguf_model", spying_load)
    out = prepare_bundled_model()
    assert out == root / "bundled" / "SmolLM2-135M-Instruct"
    assert seen_during_build == [False]
    assert oct(out.stat().st_mode & 0o777) == "0o755"
    # The same layout, byte for byte, as the session's model dir (lead-made or ours).
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in bundled_model_dir.iterdir()
    )
    for name in REQUIRED_FILES:
        assert (out / name).read_bytes() == (bundled_model_dir / name).read_bytes(), name
    # No temp/old directories left next to it.
    assert [p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")] == [out.name]
    # Idempotent: a second call does not rebuild.
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert prepare_bundled_model() == out
    assert seen_during_build == [False]
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime

    # Reloading the saved directory gives exactly the GGUF model's logits (and tokenization).
    ((gguf_model, gguf_tokenizer),) = loaded
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30? Answer in \\boxed{}."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tokenizer(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        expected = gguf_model(ids).logits
        got = model(ids).logits
    assert expected.shape == (1, ids.shape[1], 49152)
    assert torch.equal(got, expected)
