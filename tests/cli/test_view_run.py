"""view-run: the page over a live run-api, checked in a real headless Chromium."""

import os
import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.cli.view_run import BEST, NEWEST, SORTS, WORST, refresh_view, sort_and_filter
from atroposlib.frontend.jsonl2html import create_html_for_group
from atroposlib.tools.observe import GroupObserver, ObservedGroup, RecentGroups
from tests.fixtures.api_server import free_port, start_run_api
from tests.tools.groups import load_tokenizer, make_group, register_trainer_and_envs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian chromium is not installed (apt-get install -y chromium)")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
ASSISTANT_BUBBLE_RGB = (0xFF, 0xF8, 0xC5)  # .atr-assistant background in render.CSS


@pytest.fixture(scope="module")
def live(bundled_model_dir):
    """run-api with two registered envs and three posted groups, plus a view-run subprocess."""
    tok = load_tokenizer(bundled_model_dir)
    api = start_run_api()
    viewer = None
    try:
        env_a, env_b = register_trainer_and_envs(api.url, 2)
        posts = [
            (env_a, "What is **2+2**? <script>alert('x')</script>", ["The answer is 4.", "five"], [1.0, -1.0]),
            (env_b, "Name a prime number.", ["Seven is prime.", "Nine"], [1.0, 0.0]),
        ]
        for env_id, q, answers, scores in posts:
            g = make_group(tok, q, answers, scores, system="Be brief.")
            g["env_id"] = env_id
            httpx.post(api.url + "/scored_data", json=g, timeout=10).raise_for_status()
        g = make_group(tok, "Tokens only here", ["decoded reply", "other"], [0.5, 0.0], with_messages=False)
        g["env_id"] = env_b
        httpx.post(api.url + "/scored_data", json=g, timeout=10).raise_for_status()
        port = free_port()
        log = open(os.devnull, "wb")
        viewer = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.view_run", "--api-url", api.url, "--port",
             str(port), "--tokenizer", str(bundled_model_dir), "--refresh-seconds", "1"],
            stdout=log, stderr=log, env=ENV, start_new_session=True)
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert viewer.poll() is None, "view-run exited early"
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            pytest.fail("view-run did not answer within 120 s")
        yield {"api": api, "url": url, "envs": (env_a, env_b)}
    finally:
        if viewer is not None and viewer.poll() is None:
            viewer.terminate()
            viewer.wait(15)
        api.stop()


def test_import_and_help_do_not_load_gradio():
    code = ("import sys; import atroposlib.cli.view_run as v; v.build_parser().format_help(); "
            "assert 'gradio' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_refresh_view_filters_by_env(live):
    env_a, env_b = live["envs"]
    with AtroposClient(live["api"].url) as client:
        feed = RecentGroups(GroupObserver(client))
        choices, value, status, html = refresh_view(feed, None, "U", "all envs", 20)
        assert choices == ["all envs", f"env {env_a}", f"env {env_b}"] and value == "all envs"
        assert status.startswith("3 groups received · showing 3")
        assert "Seven is prime." in html and "The answer is 4." in html
        _, value, status, html = refresh_view(feed, None, "U", f"env {env_a}", 20)
        assert value == f"env {env_a}" and "showing 1" in status
        assert "The answer is 4." in html and "Seven is prime." not in html
        _, value, _, _ = refresh_view(feed, None, "U", "env 999", 20)
        assert value == "all envs"


def test_view_run_serves_locally_without_share(live):
    page = httpx.get(live["url"], timeout=10)
    assert page.status_code == 200 and "Atropos run viewer" in page.text
    assert "gradio.live" not in page.text
    # the viewer only reads: the trainer's queue still holds all three groups
    assert httpx.get(live["api"].url + "/status").json()["queue_size"] == 3


def chromium(args, tmp_path, timeout=90):
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1400",
            "--virtual-time-budget=8000"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


@pytest.mark.browser
@needs_chromium
def test_page_shows_posted_groups_in_chromium(live, tmp_path):
    dom = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "Seven is prime." not in dom:
        dom = chromium(["--dump-dom", live["url"]], tmp_path).stdout
    assert "Seven is prime." in dom and "The answer is 4." in dom
    assert "<strong>2+2</strong>" in dom  # markdown rendered
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in dom  # model-written HTML shown, not run
    assert "<script>alert('x')" not in dom
    assert "decoded reply&lt;|im_end|&gt;" in dom  # token-only group decoded with --tokenizer
    assert "3 groups received" in dom


@pytest.mark.browser
@needs_chromium
def test_page_screenshot_has_chat_bubbles(live, tmp_path):
    from PIL import Image

    shot = tmp_path / "view-run.png"
    bubbles = 0
    deadline = time.monotonic() + 90  # a busy machine can take several tries to render the groups
    while time.monotonic() < deadline:
        r = chromium([f"--screenshot={shot}", live["url"]], tmp_path)
        assert shot.exists(), r.stderr[-2000:]
        with Image.open(shot) as image:
            pixels = image.convert("RGB").getdata()
            bubbles = sum(1 for p in pixels if p == ASSISTANT_BUBBLE_RGB)
        if bubbles > 5000:
            break
    assert bubbles > 5000, f"no assistant chat bubbles in the screenshot {shot}"


def _observed(cursor, scores, answers=None, question="q"):
    answers = answers or [f"a{i}" for i in range(len(scores))]
    msgs = [[{"role": "user", "content": question}, {"role": "assistant", "content": a}] for a in answers]
    return ObservedGroup(cursor=cursor, env_id=None, received_at=0,
                         group={"scores": list(scores), "messages": msgs})


def test_sort_and_filter_is_a_pure_function_of_mean_scores():
    newest_first = [_observed(4, [0.0, 1.0]), _observed(3, [1.0, 1.0]), _observed(2, ["n/a"]),
                    _observed(1, [-1.0, 0.0])]  # means 0.5, 1, none, -0.5
    before = list(newest_first)
    cursors = lambda gs: [g.cursor for g in gs]  # noqa: E731
    assert cursors(sort_and_filter(newest_first)) == [4, 3, 2, 1]
    assert cursors(sort_and_filter(newest_first, BEST)) == [3, 4, 1, 2]  # no score: last
    assert cursors(sort_and_filter(newest_first, WORST)) == [1, 4, 3, 2]
    assert cursors(sort_and_filter(newest_first, NEWEST, min_score=0.0)) == [4, 3]
    assert cursors(sort_and_filter(newest_first, WORST, max_score=0.5)) == [1, 4]
    assert cursors(sort_and_filter(newest_first, BEST, 0.5, 0.5)) == [4]
    assert sort_and_filter(newest_first, BEST, 2.0, 1.0) == []
    ties = [_observed(9, [1.0]), _observed(8, [1.0])]
    assert cursors(sort_and_filter(ties, BEST)) == [9, 8]  # stable
    assert newest_first == before  # input untouched
    with pytest.raises(ValueError, match="sort must be one of"):
        sort_and_filter(newest_first, "random")
    assert len(SORTS) == 3


class _Feed:
    """A stand-in for RecentGroups (refresh/snapshot/env_ids/observer.missed/last_error)."""

    def __init__(self, groups):
        self.groups, self.last_error = groups, None
        self.observer = type("O", (), {"missed": 0})()

    def refresh(self):
        return 0

    def snapshot(self):
        return list(self.groups)

    def env_ids(self):
        return [None]


TAGGED = "<think>x</think><answer>42</answer> <script>alert('pwn')</script>"


def _assistant_bubbles(html):
    return re.findall(r'<div class="atr-msg atr-assistant">.*?</div>\s*</div>', html, re.S)


def test_view_run_and_jsonl2html_render_tags_escaped_and_identically():
    feed = _Feed([_observed(5, [1.0, 0.0], [TAGGED, "**no**"], question="Use <think> tags"),
                  _observed(6, [-1.0, -1.0])])
    _, _, status, html = refresh_view(feed, None, "U", "all envs", 20, BEST, -0.5, None)
    assert "1 match the mean-score filter" in status and "Group #5" in html and "Group #6" not in html
    escaped = ("&lt;think&gt;x&lt;/think&gt;&lt;answer&gt;42&lt;/answer&gt; "
               "&lt;script&gt;alert('pwn')&lt;/script&gt;")
    static = create_html_for_group(feed.groups[0].group, 1)
    for view in (html, static):
        assert escaped in view and "<script" not in view and "<think>" not in view
        assert view.count("Use &lt;think&gt; tags") == 1  # the prompt once per group
    assert _assistant_bubbles(html) == _assistant_bubbles(static) != []
    assert "Shown groups: 1 group(s) · 2 rollouts · mean score 0.5 · 50% correct" in html
    _, _, status, html = refresh_view(feed, None, "U", "all envs", 20, NEWEST, "", None)
    assert "Group #6" in html and "match the mean-score filter" not in status


def test_score_bounds_typed_as_text_blank_means_none_and_junk_is_reported():
    # the browser sends the text boxes' contents; an empty box must not act as a bound of 0
    feed = _Feed([_observed(5, [1.0, 1.0]), _observed(6, [-1.0, -1.0])])
    _, _, status, html = refresh_view(feed, None, "U", "all envs", 20, NEWEST, "  ", "")
    assert "Group #5" in html and "Group #6" in html and "mean-score filter" not in status
    _, _, status, html = refresh_view(feed, None, "U", "all envs", 20, NEWEST, "0.5", "")
    assert "Group #5" in html and "Group #6" not in html
    _, _, status, html = refresh_view(feed, None, "U", "all envs", 20, NEWEST, "abc", "")
    assert "min score 'abc' is not a number: ignored" in status
    assert "Group #5" in html and "Group #6" in html
