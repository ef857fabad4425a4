"""The one tokenizer loader: loads a local directory, and a failure names the input and the fix."""

from __future__ import annotations

import pytest

from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer
from atroposlib.utils.hf_tokenizer import load_tokenizer


def test_loads_a_local_directory(tmp_path):
    make_tiny_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.decode(tokenizer("hi there")["input_ids"], skip_special_tokens=True).strip()


def test_missing_tokenizer_names_it_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"cannot load teacher tokenizer '.*nope'.*atropos-bundled-model"):
        load_tokenizer(tmp_path / "nope", "teacher tokenizer")


def test_a_plain_fast_tokenizer_loads_like_autotokenizer_without_torch(bundled_model_dir):
    """The bundled tokenizer (``TokenizersBackend``) loads without importing torch, as
    AutoTokenizer would load it: same class, ids, chat template, special tokens."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    code = ("import sys; from atroposlib.utils.hf_tokenizer import load_tokenizer; "
            f"t = load_tokenizer({str(bundled_model_dir)!r}); "
            "print(type(t).__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["TokenizersBackend", "False"]

    ours, auto = load_tokenizer(bundled_model_dir), AutoTokenizer.from_pretrained(bundled_model_dir)
    assert type(ours) is type(auto)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 + 12?"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text = "Hello, wörld! 12 + 7 = 19 <|im_end|>"
    assert ours(text)["input_ids"] == auto(text)["input_ids"]
    assert ours.decode(auto(text)["input_ids"]) == auto.decode(auto(text)["input_ids"])
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id, ours.all_special_ids) == \
        (auto.eos_token_id, auto.pad_token_id, auto.bos_token_id, auto.all_special_ids)


def test_other_tokenizers_go_through_autotokenizer(tmp_path):
    from atroposlib.utils.hf_tokenizer import _plain_fast_tokenizer

    make_tiny_tokenizer(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    import json

    settings = json.loads(config.read_text())
    for tokenizer_class, extra, expected in (("TokenizersBackend", {}, True),
                                             ("TokenizersBackend", {"auto_map": {"AutoTokenizer": "x.Y"}}, False),
                                             ("LlamaTokenizer", {}, False)):
        config.write_text(json.dumps({**settings, "tokenizer_class": tokenizer_class, **extra}))
        assert _plain_fast_tokenizer(str(tmp_path)) is expected
    assert _plain_fast_tokenizer(str(tmp_path / "missing")) is False
