"""benchmarks/bench_vllm_health.py against a stand-in server: what it times and records."""

from __future__ import annotations

import json
import sys

from atroposlib.inference import bundled, vllm_process
from tests.example_trainer.test_health import STANDIN


def test_each_kill_is_timed_for_both_watches_against_the_interval(tmp_path, monkeypatch):
    from benchmarks.bench_vllm_health import main

    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    # the stand-in answers /health like vLLM and dies of SIGKILL like it; no model is loaded
    monkeypatch.setattr(vllm_process.VLLMProcess, "command",
                        lambda self: [sys.executable, str(script), str(self.port)])
    monkeypatch.setattr(bundled, "prepare_bundled_model", lambda: tmp_path)
    out = tmp_path / "result.json"
    assert main(["--kills", "2", "--interval", "0.2", "--grace", "1", "--seed", "3",
                 "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())

    assert result["kills"] == 2 and len(result["trials"]) == 2
    assert result["interval_s"] == 0.2 and result["grace_s"] == 1
    assert result["meta"]["seeds"] == {"wait_before_kill": 3}
    assert result["meta"]["command"].startswith("python benchmarks/bench_vllm_health.py --kills 2")
    assert len({t["pid"] for t in result["trials"]}) == 2  # restarted between the kills
    for trial in result["trials"]:
        assert trial["alive_at_kill"] == {"launched": True, "external": True}
        assert 0.2 <= trial["wait_before_kill_s"] < 0.4  # 1 to 2 poll intervals
        launched, external = trial["launched"], trial["external"]
        assert "killed by SIGKILL" in launched["message"]
        assert "did not answer" in external["message"]
        # a process exit is found at the next poll; a failing /health only after the grace
        assert 0 < launched["detected_s"] < 1 <= external["detected_s"]
        for watch in (launched, external):
            assert abs(watch["ratio_to_interval"] - watch["detected_s"] / 0.2) < 1e-9
    launched = result["summary"]["launched"]
    assert launched["n"] == 2
    assert launched["max_s"] == max(t["launched"]["detected_s"] for t in result["trials"])
