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
        log.log(2, {"loss": 0.25, "reward/mean": 0.5}, progress="step 2/20 (30s, ETA 4m30s)")
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
    assert "[grpo] step 2/20 (30s, ETA 4m30s): reward/mean=0.5 loss=0.25" in out
    assert list(tmp_path.glob("wandb/offline-run-*")), "the offline run was not written under run_dir"


def _history(n: int) -> list[dict]:
    return [{"step": s, "reward/mean": -1.0 if s % 2 else 1.0, "reward/min": -1.0, "reward/max": 1.0,
             "loss": 0.1 * s, "kl": 0.01 * s, "clip_fraction": 0.05, "trained_tokens": 40 * s,
             "sequences": 8, "max_len": 90, "step_seconds": 1.5} for s in range(1, n + 1)]


def test_plot_axes_fit_negative_rewards_and_skip_empty_panels(tmp_path):
    from example_trainer.report import build_figure, write_plot

    history = _history(4)
    fig = build_figure(history, title="t")
    titles = [ax.get_title() for ax in fig.axes]
    assert "held-out accuracy" not in titles  # no eval record: no empty panel
    assert {"reward", "loss", "KL to reference", "clip fraction", "completion length (tokens)",
            "step time (s)"} <= set(titles)
    reward = fig.axes[titles.index("reward")]
    low, high = reward.get_ylim()
    assert low <= -1.0 and high >= 1.0
    length = fig.axes[titles.index("completion length (tokens)")]
    assert list(length.lines[0].get_ydata()) == [5.0, 10.0, 15.0, 20.0]  # trained tokens / sequences
    path = tmp_path / "plot.png"
    write_plot(path, history + [{"step": 4, "eval/accuracy": -0.5}])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]  # the temp file was renamed away


def test_run_log_redraws_the_plot_every_n_steps_during_training(tmp_path):
    log = RunLog(tmp_path, plot_every=2)
    plot = tmp_path / "plot.png"
    try:
        for record in _history(3)[:1]:
            log.log(record["step"], {k: v for k, v in record.items() if k != "step"})
        assert not plot.exists()  # step 1 is not a multiple of 2
        record = _history(2)[1]
        log.log(2, {k: v for k, v in record.items() if k != "step"})
        assert plot.exists()
        first = plot.stat().st_mtime_ns
        assert log.maybe_plot(3) is False and plot.stat().st_mtime_ns == first
        assert log.maybe_plot(4) is True
    finally:
        log.close()


def test_run_log_writes_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = RunLog(tmp_path, tensorboard_dir=tmp_path / "tb")
    try:
        log.log(1, {"loss": 0.5, "reward/mean": -1.0, "note": "text is skipped"})
        log.log(2, {"loss": 0.25, "reward/mean": 1.0})
    finally:
        log.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"loss", "reward/mean"}
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, -1.0), (2, 1.0)]
    assert [e.value for e in events.Scalars("loss")] == [0.5, 0.25]
