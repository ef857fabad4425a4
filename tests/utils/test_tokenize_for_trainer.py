"""tokenize_for_trainer against real HF tokenizers (tiny ChatML one, and SmolLM2 when present)."""

from __future__ import annotations

import pytest

from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def _ids(tok, chat, gen):
    return tok.encode(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen),
                      add_special_tokens=False)


def test_default_mode_masks_the_prompt_only(tok):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    out = tokenize_for_trainer(tok, chat)
    assert out["tokens"] == _ids(tok, chat, False)
    prefix = len(_ids(tok, chat[:1], True))
    assert out["masks"][:prefix] == [-100] * prefix
    assert out["masks"][prefix:] == out["tokens"][prefix:]
    assert tok.decode(out["tokens"][prefix:]).startswith("hello")
    assert "messages" not in out
    assert tokenize_for_trainer(tok, chat, include_messages=True)["messages"] is chat


def test_length_finish_drops_trailing_eos(tok):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    full = tokenize_for_trainer(tok, chat)
    # ChatML ends "<|im_end|>\n": the last token is "\n", not EOS, so nothing is dropped ...
    assert len(tokenize_for_trainer(tok, chat, finish_reason="length")["tokens"]) == len(full["tokens"])

    class EosLast:
        eos_token_id = tok.eos_token_id

        def apply_chat_template(self, chat, tokenize, add_generation_prompt):
            text = "".join(m["content"] for m in chat)
            return text + ("" if add_generation_prompt else "<|im_end|>")

        def encode(self, text, add_special_tokens):
            return tok.encode(text, add_special_tokens=add_special_tokens)

    # ... whereas a template ending in EOS loses it (and its mask) on "length".
    cut = tokenize_for_trainer(EosLast(), chat, finish_reason="length")
    kept = tokenize_for_trainer(EosLast(), chat)
    assert len(cut["tokens"]) == len(kept["tokens"]) - 1 == len(cut["masks"])
    assert kept["tokens"][-1] == tok.eos_token_id


def test_all_assistant_turns_are_trained(tok):
    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]
    out = tokenize_for_trainer(tok, chat, train_on_all_assistant_turns=True)
    trained = tok.decode([t for t, m in zip(out["tokens"], out["masks"], strict=True) if m != -100])
    assert "a1" in trained and "a2" in trained
    assert "q1" not in trained and "q2" not in trained and "sys" not in trained
    default = tokenize_for_trainer(tok, chat)
    trained_default = tok.decode([t for t, m in zip(default["tokens"], default["masks"], strict=True) if m != -100])
    assert "a1" not in trained_default and "a2" in trained_default


def test_empty_chat_is_an_error(tok):
    with pytest.raises(ValueError, match="non-empty"):
        tokenize_for_trainer(tok, [])


def test_with_the_bundled_smollm2_tokenizer(bundled_model_dir):
    from transformers import AutoTokenizer

    smol = AutoTokenizer.from_pretrained(str(bundled_model_dir))
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    out = tokenize_for_trainer(smol, chat)
    prefix = len(_ids(smol, chat[:1], True))
    assert out["masks"][:prefix] == [-100] * prefix and out["masks"][prefix:] == out["tokens"][prefix:]
    assert smol.decode(out["tokens"][prefix:]).startswith("hello")
    multi = tokenize_for_trainer(smol, chat + [{"role": "user", "content": "again"},
                                               {"role": "assistant", "content": "bye"}],
                                 train_on_all_assistant_turns=True)
    trained = smol.decode([t for t, m in zip(multi["tokens"], multi["masks"], strict=True) if m != -100])
    assert "hello" in trained and "bye" in trained and "again" not in trained
