"""A dead vLLM ends the run in seconds, named as dead, with a checkpoint and the error in summary.json."""

import json
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.inference import vllm_process
from example_trainer import grpo
from example_trainer.config import TrainerConfig
from example_trainer.health import HealthWatch, VLLMDiedError
from tests.example_trainer.test_grpo_loop import _group, needs_tokenizer, tiny_model  # noqa: F401

# what the trainer launches as "vLLM": answers /health, says so in its log, runs until killed
STANDIN = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    print("stand-in vLLM serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


@needs_tokenizer
def test_a_killed_vllm_ends_the_run_with_a_checkpoint_and_names_vllm(tiny_model, run_api, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    monkeypatch.setattr(vllm_process.VLLMProcess, "command",
                        lambda self: [sys.executable, str(script), str(self.port)])
    run = tmp_path / "run"
    # no interval checkpoint and no weight sync before the end: only the exit checkpoint saves step 1
    config = TrainerConfig(model=str(tiny_model), run_dir=str(run), api_url=run_api.url,
                           weight_sync="reload", weight_sync_interval=100, training_steps=3,
                           batch_size=8, micro_batch_size=8, checkpoint_interval=0, batch_timeout=120)
    with AtroposClient(run_api.url) as client:
        for seed in range(2):  # one batch: step 1 trains, then the trainer waits for step 2
            client.post_scored_data(_group(seed))

    def kill_vllm_while_waiting_for_step_2():
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or '"loss"' not in (run / "metrics.jsonl").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(_standin_pid(script), signal.SIGKILL)

    killer = threading.Thread(target=kill_vllm_while_waiting_for_step_2)
    killer.start()
    with pytest.raises(VLLMDiedError, match=r"(?s)vLLM died: .*killed by SIGKILL.*stand-in vLLM serving"):
        grpo.train(config)
    killer.join()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped"] == "error"
    assert summary["failed_part"] == "vllm" and summary["error"].startswith("VLLMDiedError: vLLM died")
    assert summary["last_checkpoint"] == str(run / "checkpoints" / "step_1")
    assert json.loads((run / "checkpoints" / "step_1" / "checkpoint.json").read_text())["step"] == 1


def _standin_pid(script) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1] == str(script).encode():
                return int(entry)
    raise AssertionError("the stand-in vLLM is not running")


def test_watch_waits_out_the_grace_for_a_failing_check_but_not_for_an_exit():
    failures = []
    answers = iter([("no answer", False), None, ("no answer", False), ("no answer", False)])
    watch = HealthWatch(lambda: next(answers), failures.append, grace=0.0)
    since = watch.check_once()
    assert failures and isinstance(failures[0], VLLMDiedError)  # grace 0: the first failure counts
    watch = HealthWatch(lambda: next(answers), failures.append, grace=3600)
    assert watch.check_once() is None  # healthy
    since = watch.check_once()
    assert watch.check_once(since) == since and watch.failure is None  # within the grace: alive
    exited = HealthWatch(lambda: ("exited with code 1", True), failures.append, grace=3600)
    exited.check_once()
    assert str(exited.failure) == "vLLM died: exited with code 1"
    raising = HealthWatch(lambda: 1 / 0, failures.append, grace=3600)
    assert raising.check_once() is not None and raising.failure is None  # counted as a failed check
