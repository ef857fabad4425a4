from atroposlib.frontend.observed import render_group, render_groups, render_markdown
from atroposlib.tools.observe import ObservedGroup
from atroposlib.tools.rollouts import TokenDecoder
from tests.tools.groups import make_group


def test_markdown_is_rendered_and_html_is_escaped_not_run():
    out = render_markdown("**bold** <script>alert(1)</script> <img src=x onerror=alert(2)>\n"
                          "[x](javascript:alert(3))\n```\nif a<b: pass\n```")
    assert "<strong>bold</strong>" in out
    assert "<script" not in out and "<img" not in out and "javascript:" not in out.split("[x]")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out  # shown as the model wrote it
    assert "if a&lt;b: pass" in out
    assert 'href="javascript' not in out


def test_group_shows_messages_scores_best_first(tokenizer):
    g = make_group(tokenizer, "Pick <b>one</b>", ["low answer", "high answer"], [-0.5, 2.0])
    html = render_group(ObservedGroup(cursor=7, env_id=3, received_at=1.7e9, group=g))
    assert "Group #7" in html and "env 3" in html and "2 rollouts" in html
    assert html.index("high answer") < html.index("low answer")
    assert "atr-score atr-pos" in html and "atr-score atr-neg" in html
    assert "Pick &lt;b&gt;one&lt;/b&gt;" in html and "<b>one</b>" not in html
    assert html.count('class="atr-msg atr-assistant"') == 2
    # the shared prompt is shown once, above the completions
    assert "prompt shared by all 2 rollouts" in html
    assert html.count('class="atr-msg atr-user"') == 1
    assert html.index("Pick &lt;b&gt;") < html.index("high answer")


def test_different_prompts_are_shown_per_rollout(tokenizer):
    a = make_group(tokenizer, "first question", ["x"], [1.0])
    b = make_group(tokenizer, "second question", ["y"], [0.0])
    mixed = {k: a[k] + b[k] for k in ("tokens", "masks", "scores", "messages")}
    html = render_group(ObservedGroup(cursor=1, env_id=None, received_at=0, group=mixed))
    assert "prompt shared" not in html and html.count('class="atr-msg atr-user"') == 2


def test_token_only_shared_prompt_is_decoded_once(tokenizer, bundled_model_dir):
    g = make_group(tokenizer, "decode <me>", ["one", "two"], [1.0, 0.0], with_messages=False)
    html = render_group(ObservedGroup(cursor=1, env_id=None, received_at=0, group=g),
                        TokenDecoder(str(bundled_model_dir)))
    assert html.count("decode &lt;me&gt;") == 1 and "prompt shared by all 2 rollouts" in html
    assert "one&lt;|im_end|&gt;" in html and "two&lt;|im_end|&gt;" in html


def test_token_only_group_is_decoded_with_a_tokenizer(tokenizer, bundled_model_dir):
    g = make_group(tokenizer, "decode <me>", ["tok answer"], [0.0], with_messages=False)
    observed = ObservedGroup(cursor=1, env_id=None, received_at=0, group=g)
    html = render_group(observed, TokenDecoder(str(bundled_model_dir)))
    assert "tok answer&lt;|im_end|&gt;" in html and "decode &lt;me&gt;" in html
    assert "atr-zero" in html and "no env id" in html
    plain = render_group(observed, None)
    assert f"{len(g['tokens'][0])} tokens (decode them with a tokenizer" in plain and "tok answer" not in plain
    broken = render_group(observed, TokenDecoder("/nonexistent/tok"))
    assert "cannot decode" in broken


def test_empty_state():
    assert "waiting" in render_groups([], empty_message="waiting <for> data")
    assert "&lt;for&gt;" in render_groups([], empty_message="waiting <for> data")
