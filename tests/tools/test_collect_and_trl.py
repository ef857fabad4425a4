import random

import pytest

from atroposlib.tools.collect import collect, dpo_builder, sft_builder
from atroposlib.tools.formats import JsonlOutput, LayoutResolver, OutputFormat
from atroposlib.tools.observe import ObservedGroup
from atroposlib.tools.rollouts import TokenDecoder
from tests.tools.groups import make_group


@pytest.fixture(scope="module")
def groups(tokenizer):
    """Three groups of 4: scores chosen so the counts below are known by hand."""
    specs = [
        ("What is 2+2?", ["4", "It is 4.", "5", "22"], [1.0, 0.9, 0.0, -1.0]),
        ("Capital of France?", ["Paris", "Lyon", "Nice", "Rome"], [1.0, 0.0, 0.0, 0.0]),
        ("Say hi <b>bold</b>", ["hi", "hello", "yo", "hey"], [0.0, 0.0, 0.0, 0.0]),
    ]
    return [make_group(tokenizer, q, a, s, system="Answer briefly.") for q, a, s in specs]


def observed(groups):
    return [ObservedGroup(cursor=i + 1, env_id=0, received_at=0.0, group=g) for i, g in enumerate(groups)]


class CountingBar:
    def __init__(self):
        self.n = 0

    def update(self, k):
        self.n += k

    def set_postfix(self, **kw):
        pass


def run_sft(tmp_path, groups, fmt, name, target=100, **kw):
    decoder = TokenDecoder(kw.pop("tokenizer_dir"))
    build = sft_builder(decoder, top_n=3, allow_negative_scores=False, minimum_score_diff_max_min=0.0)
    bar = CountingBar()
    with JsonlOutput(tmp_path / name) as out:
        stats = collect(observed(groups), build, out, LayoutResolver(fmt), target=target, progress=bar)
    return tmp_path / name, stats, bar


def run_dpo(tmp_path, groups, fmt, name, seed=0, tokenizer_dir=None):
    decoder = TokenDecoder(tokenizer_dir)
    build = dpo_builder(decoder, n_pairs=3, allow_negative_scores=False,
                        minimum_score_diff_max_min=0.5, rng=random.Random(seed))
    with JsonlOutput(tmp_path / name) as out:
        stats = collect(observed(groups), build, out, LayoutResolver(fmt), target=100)
    return tmp_path / name, stats


def test_sft_accounting_and_target(tmp_path, groups, bundled_model_dir):
    # group 1 keeps 2 (1.0, 0.9), group 2 keeps 1, group 3 none (all zero)
    path, stats, bar = run_sft(tmp_path, groups, OutputFormat.AUTO, "a.jsonl",
                               tokenizer_dir=str(bundled_model_dir))
    assert (stats.lines_written, stats.groups_seen, stats.groups_used) == (3, 3, 2)
    assert bar.n == 3 and len(path.read_text().splitlines()) == 3
    # a target reached mid-group: stop there and do not read further groups
    path, stats, bar = run_sft(tmp_path, groups, OutputFormat.AUTO, "b.jsonl", target=1,
                               tokenizer_dir=str(bundled_model_dir))
    assert (stats.lines_written, stats.groups_seen, bar.n) == (1, 1, 1)
    assert stats.last_cursor == 1


def test_tokens_only_groups_give_text_records(tmp_path, tokenizer, bundled_model_dir):
    g = make_group(tokenizer, "1+1?", ["2", "3"], [1.0, 0.0], with_messages=False)
    path, stats, _ = run_sft(tmp_path, [g], OutputFormat.AUTO, "t.jsonl",
                             tokenizer_dir=str(bundled_model_dir))
    import orjson

    (line,) = [orjson.loads(x) for x in path.read_text().splitlines()]
    assert line["completion"] == "2<|im_end|>" and "1+1?" in line["prompt"]


def test_chat_format_skips_token_only_groups_and_counts_them(tmp_path, tokenizer):
    g = make_group(tokenizer, "1+1?", ["2", "3"], [1.0, 0.5], with_messages=False)
    path, stats, _ = run_sft(tmp_path, [g], OutputFormat.CHAT, "c.jsonl", tokenizer_dir=None)
    assert stats.lines_written == 0 and sum(stats.skipped.values()) == 2
    assert "include_messages" in next(iter(stats.skipped))


@pytest.mark.parametrize("fmt", [OutputFormat.CHAT, OutputFormat.TEXT, OutputFormat.LEGACY])
def test_datasets_and_trl_read_the_files(tmp_path, groups, tokenizer, bundled_model_dir, fmt):
    from datasets import load_dataset
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    tok_dir = str(bundled_model_dir)
    sft_path, sft_stats, _ = run_sft(tmp_path, groups, fmt, "sft.jsonl", tokenizer_dir=tok_dir)
    dpo_path, dpo_stats = run_dpo(tmp_path, groups, fmt, "dpo.jsonl", tokenizer_dir=tok_dir)
    sft = load_dataset("json", data_files=str(sft_path), split="train")
    dpo = load_dataset("json", data_files=str(dpo_path), split="train")
    assert len(sft) == sft_stats.lines_written == 3
    # group 1: chosen {1.0, 0.9} vs pool of the 3 lowest {0.9, 0.0, -1.0} beyond margin 0.5;
    # group 2: 1.0 vs 0.0; group 3: nothing positive
    assert len(dpo) == dpo_stats.lines_written == 3
    assert sorted(sft["score"]) == [0.9, 1.0, 1.0]

    if fmt is OutputFormat.LEGACY:
        assert set(sft.column_names) == {"prefix", "completion", "score"}
        assert set(dpo.column_names) == {"prefix", "pos", "score", "neg"}
        return

    for row in sft:
        assert is_conversational(row) is (fmt is OutputFormat.CHAT)
        rendered = maybe_apply_chat_template(row, tokenizer)
        if fmt is OutputFormat.CHAT:
            text = rendered["text"]
            assert text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>")
            assert row["messages"][-1]["content"] + "<|im_end|>" in text
        else:
            assert rendered["prompt"] == row["prompt"] and rendered["completion"] == row["completion"]
    for row in dpo:
        assert is_conversational(row) is (fmt is OutputFormat.CHAT)
        assert row["score_chosen"] - row["score_rejected"] > 0.5
        rendered = maybe_apply_chat_template(row, tokenizer)
        assert set(rendered) >= {"prompt", "chosen", "rejected"}
        assert rendered["prompt"].endswith("<|im_start|>assistant\n")
        assert rendered["chosen"].endswith("<|im_end|>\n") or rendered["chosen"].endswith("<|im_end|>")
        # the same example in both layouts renders to the same token stream TRL trains on
    if fmt is OutputFormat.CHAT:
        text_path, _ = run_dpo(tmp_path, groups, OutputFormat.TEXT, "dpo_text.jsonl", tokenizer_dir=tok_dir)
        text_rows = load_dataset("json", data_files=str(text_path), split="train")
        for chat_row, text_row in zip(dpo, text_rows, strict=True):
            rendered = maybe_apply_chat_template(chat_row, tokenizer)
            assert rendered["prompt"] == text_row["prompt"]
            assert rendered["chosen"].strip() == text_row["chosen"].strip()


def test_dpo_is_reproducible_with_a_seed(tmp_path, tokenizer, bundled_model_dir):
    g = make_group(tokenizer, "pick", [str(i) for i in range(8)], [1, 1, 1, 0, 0, 0, 0, 0])
    a, _ = run_dpo(tmp_path, [g], OutputFormat.CHAT, "s1.jsonl", seed=3)
    b, _ = run_dpo(tmp_path, [g], OutputFormat.CHAT, "s2.jsonl", seed=3)
    assert a.read_text() == b.read_text() and len(a.read_text().splitlines()) == 3


def test_summary_reports_missed_groups_with_the_fix():
    from atroposlib.tools.collect import CollectStats

    assert "MISSED" not in CollectStats().summary()
    text = CollectStats(missed_groups=2).summary()
    assert "MISSED 2 groups" in text and "--observe-retention-groups" in text
