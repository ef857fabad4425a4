"""The trainer's run log: metrics.jsonl, the console line and (offline) wandb."""

import json

from example_trainer.report import RunLog


def test_run_log_writes_metrics_and_logs_them_to_wandb_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    log = RunLog(tmp_path, use_wandb=True, wandb_project="atroposlib-tests", wandb_group="g",
                 config={"lr": 1e-3})
    try:
        assert wandb.run is not None and wandb.run.config["lr"] == 1e-3
        log.log(1, {"loss": 0.5, "reward/mean": 0.25, "kl": 0.0, "grad_norm": 1.5,
                    "tokens_per_second": 120.0, "sync/update_seconds": 0.4})
        log.log_eval(1, {"eval/accuracy": 0.6, "n": 10.0}, metric="eval/accuracy")
        # wandb commits a step's row when a later step arrives: the eval joined step 1's row
        log.log(2, {"loss": 0.25, "reward/mean": 0.5})
        summary = dict(wandb.run.summary)
        assert summary["_step"] == 1
        assert summary["loss"] == 0.5 and summary["reward/mean"] == 0.25
        assert summary["sync/update_seconds"] == 0.4
        assert summary["eval/accuracy"] == 0.6 and summary["eval_raw/n"] == 10.0
    finally:
        log.close()
    assert wandb.run is None  # close() finished the run
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 1, 2]
    assert lines[0]["loss"] == 0.5 and lines[1]["eval/accuracy"] == 0.6
    out = capsys.readouterr().out
    assert "[grpo] step 1: reward/mean=0.25 loss=0.5" in out
    assert list(tmp_path.glob("wandb/offline-run-*")), "the offline run was not written under run_dir"
