import pytest

from atroposlib.errors import ConfigError
from atroposlib.tools.formats import (
    JsonlOutput,
    Layout,
    LayoutResolver,
    OutputFormat,
    dpo_record,
    layout_of_record,
    read_existing_layout,
    sft_record,
)
from atroposlib.tools.rollouts import (
    RolloutFormatError,
    TokenDecoder,
    first_trained_position,
    split_messages,
)
from tests.tools.groups import make_group


@pytest.fixture(scope="module")
def decoder(bundled_model_dir):
    return TokenDecoder(str(bundled_model_dir))


def test_split_messages_after_last_user_turn():
    convo = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "call", "tool_calls": []},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": "final"},
    ]
    prompt, completion = split_messages(convo)
    assert prompt == convo[:4] and completion == convo[4:]


def test_split_messages_rejects_conversations_without_an_answer():
    # what BaseEnv synthesises from tokens when include_messages is set
    with pytest.raises(RolloutFormatError, match="no assistant"):
        split_messages([{"role": "user", "content": "whole decoded sequence"}])
    with pytest.raises(RolloutFormatError, match="no assistant message after"):
        split_messages([{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}])


def test_first_trained_position_uses_masks():
    assert first_trained_position([-100, -100, 5, -100, 7]) == 2
    with pytest.raises(RolloutFormatError, match="no completion"):
        first_trained_position([-100, -100])


def test_decoder_split_roundtrips_the_trained_sequence(tokenizer, decoder):
    group = make_group(tokenizer, "What is 2+3?", ["5", "It is 6."], [1.0, 0.0])
    prompt, completion = decoder.split(group["tokens"][1], group["masks"][1])
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
    assert "What is 2+3?" in prompt
    assert completion == "It is 6.<|im_end|>"
    assert tokenizer.encode(prompt + completion, add_special_tokens=False) == group["tokens"][1]


def test_decoder_split_works_when_sequences_share_no_character_prefix(decoder):
    # upstream split decoded texts at their common character prefix and crashed on ""
    group = {"tokens": [[1, 2, 3], [4, 5, 6]], "masks": [[-100, 2, 3], [-100, -100, 6]]}
    a = decoder.split(group["tokens"][0], group["masks"][0])
    b = decoder.split(group["tokens"][1], group["masks"][1])
    assert a[0] == decoder.decode([1]) and b[0] == decoder.decode([4, 5])
    assert a[1] == decoder.decode([2, 3]) and b[1] == decoder.decode([6])


def test_decoding_needs_no_torch_and_matches_transformers(bundled_model_dir, tmp_path):
    import subprocess
    import sys

    # the tools load tokenizer.json with `tokenizers` alone: no torch import (~4 s of CPU)
    code = ("import sys; from atroposlib.tools.rollouts import TokenDecoder; "
            f"d = TokenDecoder({str(bundled_model_dir)!r}); "
            "print(repr(d.decode([1, 9690, 198, 2683, 359, 253, 2]))); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text, torch_loaded = out.stdout.splitlines()
    assert torch_loaded == "False"
    from transformers import AutoTokenizer

    slow_route = AutoTokenizer.from_pretrained(bundled_model_dir)
    assert text == repr(slow_route.decode([1, 9690, 198, 2683, 359, 253, 2], skip_special_tokens=False))
    # a directory without tokenizer.json goes to transformers, whose failure names the fix
    with pytest.raises(ConfigError, match="pass --tokenizer"):
        TokenDecoder(str(tmp_path)).decode([1, 2])


def test_decoder_without_tokenizer_says_how_to_fix():
    with pytest.raises(ConfigError, match="--tokenizer"):
        TokenDecoder(None).split([1, 2], [-100, 2])
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        TokenDecoder("/nonexistent/tokenizer-dir").decode([1])


def test_sft_layouts(tokenizer, decoder):
    group = make_group(tokenizer, "Name a color.", ["Blue."], [0.75], system="Be brief.")
    chat = sft_record(group, 0, Layout.CHAT, decoder)
    assert chat == {"messages": group["messages"][0], "score": 0.75}
    text = sft_record(group, 0, Layout.TEXT, decoder)
    assert set(text) == {"prompt", "completion", "score"}
    assert text["completion"] == "Blue.<|im_end|>" and "Be brief." in text["prompt"]
    legacy = sft_record(group, 0, Layout.LEGACY_TEXT, decoder)
    assert legacy == {"prefix": text["prompt"], "completion": text["completion"], "score": 0.75}
    assert sft_record(group, 0, Layout.LEGACY_MESSAGES, decoder) == chat


def test_sft_chat_layout_needs_messages(tokenizer, decoder):
    group = make_group(tokenizer, "q", ["a"], [1.0], with_messages=False)
    with pytest.raises(RolloutFormatError, match="include_messages"):
        sft_record(group, 0, Layout.CHAT, decoder)


def test_dpo_layouts(tokenizer, decoder):
    group = make_group(tokenizer, "2+2?", ["4", "5"], [1.0, 0.0])
    chat = dpo_record(group, 0, 1, Layout.CHAT, decoder)
    assert chat == {
        "prompt": [{"role": "user", "content": "2+2?"}],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
        "score_chosen": 1.0,
        "score_rejected": 0.0,
    }
    text = dpo_record(group, 0, 1, Layout.TEXT, decoder)
    assert text["chosen"] == "4<|im_end|>" and text["rejected"] == "5<|im_end|>"
    assert text["prompt"].endswith("assistant\n")
    legacy = dpo_record(group, 0, 1, Layout.LEGACY_TEXT, decoder)
    assert legacy == {"prefix": text["prompt"], "pos": "4<|im_end|>", "score": 1.0,
                      "neg": "5<|im_end|>"}
    legacy_m = dpo_record(group, 0, 1, Layout.LEGACY_MESSAGES, decoder)
    assert legacy_m == {"pos": group["messages"][0], "neg": group["messages"][1], "score": 1.0}


def test_dpo_refuses_pairs_with_different_prompts(tokenizer, decoder):
    a = make_group(tokenizer, "first?", ["x"], [1.0])
    b = make_group(tokenizer, "second?", ["y"], [0.0])
    mixed = {k: a[k] + b[k] for k in ("tokens", "masks", "scores", "messages")}
    with pytest.raises(RolloutFormatError, match="different prompts"):
        dpo_record(mixed, 0, 1, Layout.CHAT, decoder)
    with pytest.raises(RolloutFormatError, match="different prompt tokens"):
        dpo_record(mixed, 0, 1, Layout.TEXT, decoder)


def test_auto_layout_follows_the_first_group_then_sticks(tokenizer):
    with_msgs = make_group(tokenizer, "q", ["a"], [1.0])
    tokens_only = make_group(tokenizer, "q", ["a"], [1.0], with_messages=False)
    resolver = LayoutResolver(OutputFormat.AUTO)
    assert resolver.resolve(with_msgs) is Layout.CHAT
    assert resolver.resolve(tokens_only) is Layout.CHAT
    resolver = LayoutResolver(OutputFormat.AUTO)
    assert resolver.resolve(tokens_only) is Layout.TEXT
    assert resolver.resolve(with_msgs) is Layout.TEXT
    synthesised = dict(tokens_only, messages=[[{"role": "user", "content": "all"}]])
    assert LayoutResolver(OutputFormat.AUTO).resolve(synthesised) is Layout.TEXT
    assert LayoutResolver(OutputFormat.AUTO, save_messages=True).layout is Layout.CHAT
    assert LayoutResolver(OutputFormat.LEGACY, save_messages=True).layout is Layout.LEGACY_MESSAGES
    assert LayoutResolver(OutputFormat.LEGACY).layout is Layout.LEGACY_TEXT


def test_append_keeps_the_file_layout(tmp_path):
    path = tmp_path / "sft.jsonl"
    with JsonlOutput(path) as out:
        out.write({"prompt": "p", "completion": "c", "score": 1.0})
    assert read_existing_layout(path, "sft") is Layout.TEXT
    assert LayoutResolver(OutputFormat.AUTO, existing=Layout.TEXT).layout is Layout.TEXT
    with pytest.raises(ConfigError, match="mixing them"):
        LayoutResolver(OutputFormat.CHAT, existing=Layout.TEXT)
    # chat SFT lines and legacy --save-messages lines are the same schema: allowed
    LayoutResolver(OutputFormat.LEGACY, save_messages=True, existing=Layout.CHAT)
    with pytest.raises(ConfigError, match="already exists"):
        JsonlOutput(path)
    with JsonlOutput(path, append=True) as out:
        out.write({"prompt": "p2", "completion": "c2", "score": 0.5})
    assert len(path.read_text().splitlines()) == 2
    (tmp_path / "other.jsonl").write_text('{"foo": 1}\n')
    with pytest.raises(ConfigError, match="not a SFT dataset"):
        read_existing_layout(tmp_path / "other.jsonl", "sft")


def test_layout_of_dpo_records():
    assert layout_of_record({"prompt": [], "chosen": [], "rejected": []}, "dpo") is Layout.CHAT
    assert layout_of_record({"prompt": "", "chosen": "", "rejected": ""}, "dpo") is Layout.TEXT
    assert layout_of_record({"prefix": "", "pos": "", "neg": "", "score": 1}, "dpo") is Layout.LEGACY_TEXT
    assert layout_of_record({"pos": [], "neg": [], "score": 1}, "dpo") is Layout.LEGACY_MESSAGES
    assert layout_of_record({"x": 1}, "dpo") is None
