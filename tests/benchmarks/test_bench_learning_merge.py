"""``bench_learning.py --merge``: one table from pairs or sweep parts measured separately."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_learning")


def _run(label, passno, final, steps, trl=None):
    return {"label": label, "pass": passno, "budget_minutes": 7.0, "steps": steps,
            "sequences": steps * 16, "train_seconds": 420.0, "peak_rss_bytes": 3 * 2**30,
            "peak_rss_by_part": {"trainer": 2**30}, "peak_pss_bytes": 2 * 2**30, "lr": 6e-5,
            "env_args": {}, "trl_setting": trl,
            "curve": [{"minute": 0.0, "accuracy": 0.1}, {"minute": 7.0, "accuracy": final}]}


def _write(path: Path, runs, sweep=None, **task):
    payload = {"task": {"model": "m", "env": "arithmetic", "difficulty": 4, "max_tokens": 24,
                        "group_size": 8, "batch_size": 16, "trainable_layers": 10,
                        "eval_problems": 200, "minutes": 7.0, "pairs": 1, "order": [], **task},
               "runs": runs, **({"trl_sweep": sweep} if sweep else {})}
    path.write_text(json.dumps(payload))
    return path


def test_pairs_from_two_days_make_one_table(bench, tmp_path):
    day1 = _write(tmp_path / "day1.json", [_run("ours-gspo", 1, 0.5, 300), _run("trl", 1, 0.2, 150)])
    day2 = _write(tmp_path / "day2.json", [_run("trl", 1, 0.3, 160), _run("ours-gspo", 1, 0.4, 310),
                                           _run("trl", 2, 0.25, 155), _run("ours-gspo", 2, 0.6, 290)])
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", str(day1), str(day2), "--json-out", str(out)]) == 0
    merged = json.loads(out.read_text())
    ours = merged["contenders"]["ours-gspo"]
    assert ours["runs"] == 3 and ours["accuracy"]["7"]["mean"] == pytest.approx(0.5)
    assert ours["accuracy"]["7"]["min"] == 0.4 and ours["steps"]["max"] == 310
    assert [(r["pass"], r["source"]) for r in merged["runs"]] == [
        (1, "day1.json"), (1, "day1.json"), (2, "day2.json"), (2, "day2.json"), (3, "day2.json"),
        (3, "day2.json")]
    assert merged["task"]["pairs"] == 3 and merged["task"]["merged_from"] == ["day1.json", "day2.json"]
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_merged_table_merges_again_and_keeps_its_files(bench, tmp_path):
    pair1 = _write(tmp_path / "pair1.json", [_run("ours-gspo", 1, 0.5, 300), _run("trl", 1, 0.2, 150)],
                   order=["ours-gspo", "trl"])
    pair2 = _write(tmp_path / "pair2.json", [_run("trl", 1, 0.3, 160), _run("ours-gspo", 1, 0.4, 310)],
                   order=["trl", "ours-gspo"])
    pair3 = _write(tmp_path / "pair3.json", [_run("ours-gspo", 1, 0.6, 290), _run("trl", 1, 0.25, 155)],
                   order=["ours-gspo", "trl"])
    two = tmp_path / "pairs2.json"
    assert bench.main(["--merge", str(pair1), str(pair2), "--json-out", str(two)]) == 0
    three = tmp_path / "pairs3.json"
    assert bench.main(["--merge", str(two), str(pair3), "--json-out", str(three)]) == 0
    merged = json.loads(three.read_text())
    assert [(r["pass"], r["source"]) for r in merged["runs"]] == [
        (1, "pair1.json"), (1, "pair1.json"), (2, "pair2.json"), (2, "pair2.json"), (3, "pair3.json"),
        (3, "pair3.json")]
    assert merged["task"]["merged_from"] == ["pair1.json", "pair2.json", "pair3.json"]
    assert merged["task"]["order"] == [["ours-gspo", "trl"], ["trl", "ours-gspo"], ["ours-gspo", "trl"]]
    assert merged["contenders"]["ours-gspo"]["accuracy"]["7"]["mean"] == pytest.approx(0.5)


def test_a_sweep_in_parts_names_the_best_over_all_parts(bench, tmp_path):
    a = {"lr": 3e-5, "bf16": True, "level": "token"}
    b = {"lr": 6e-5, "bf16": True, "level": "sequence"}
    part1 = _write(tmp_path / "p1.json", [_run("trl-a", 1, 0.2, 100, a)],
                   sweep={"settings": [a], "best": {"label": "trl-a", "setting": a}})
    part2 = _write(tmp_path / "p2.json", [_run("trl-b", 1, 0.35, 120, b)],
                   sweep={"settings": [b], "best": {"label": "trl-b", "setting": b}})
    out = tmp_path / "sweep.json"
    assert bench.main(["--merge", str(part1), str(part2), "--json-out", str(out)]) == 0
    sweep = json.loads(out.read_text())["trl_sweep"]
    assert sweep["settings"] == [a, b] and sweep["best"]["setting"] == b
    from benchmarks.learning.trl_side import TrlSetting, best_setting

    assert best_setting(out) == TrlSetting(**b)


def test_runs_of_one_label_run_differently_are_refused(bench, tmp_path, capsys):
    plain = _write(tmp_path / "plain.json", [_run("ours-gspo", 1, 0.5, 300)])
    changed = _run("ours-gspo", 1, 0.3, 320)
    changed["env_args"] = {"env.group_size": "16"}
    group16 = _write(tmp_path / "group16.json", [changed])
    with pytest.raises(SystemExit):
        bench.main(["--merge", str(plain), str(group16), "--json-out", str(tmp_path / "x.json")])
    assert ("ours-gspo: env_args differs: {} in plain.json, {'env.group_size': '16'} in "
            "group16.json") in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_different_tasks_are_refused_with_the_key_named(bench, tmp_path, capsys):
    d4 = _write(tmp_path / "d4.json", [_run("ours-gspo", 1, 0.5, 300)])
    d2 = _write(tmp_path / "d2.json", [_run("ours-gspo", 1, 0.8, 300)], difficulty=2)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--merge", str(d4), str(d2), "--json-out", str(tmp_path / "x.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'difficulty' differs: 4 in d4.json, 2 in d2.json" in err
    assert not (tmp_path / "x.json").exists()


def test_runs_with_other_trainer_overrides_are_refused_and_old_runs_count_as_none(bench, tmp_path, capsys):
    old = _run("ours-gspo-lora", 1, 0.5, 300)  # a JSON from before trainer_args was recorded
    plain = _run("ours-gspo-lora", 1, 0.55, 310)
    plain["trainer_args"] = {}
    deeper = _run("ours-gspo-lora", 1, 0.6, 220)
    deeper["trainer_args"] = {"train_last_layers": 20}
    a, b, c = (_write(tmp_path / f"{n}.json", [r]) for n, r in (("old", old), ("plain", plain), ("deeper", deeper)))
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", str(a), str(b), "--json-out", str(out)]) == 0
    row = json.loads(out.read_text())["contenders"]["ours-gspo-lora"]
    assert row["runs"] == 2 and row["trainer_args"] == {} and "batch_wait_seconds" not in row
    with pytest.raises(SystemExit):
        bench.main(["--merge", str(b), str(c), "--json-out", str(tmp_path / "x.json")])
    assert ("ours-gspo-lora: trainer_args differs: {} in plain.json, {'train_last_layers': 20} in "
            "deeper.json") in capsys.readouterr().err


def test_the_row_gives_how_long_the_trainer_waited_for_batches(bench, tmp_path, capsys):
    runs = [_run("ours-gspo-lora", n, 0.5, 200) for n in (1, 2)]
    for run, wait in zip(runs, (40.0, 60.0), strict=True):
        run["batch_wait_seconds"] = wait
    a, b = (_write(tmp_path / f"{n}.json", [r]) for n, r in (("a", runs[0]), ("b", runs[1])))
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", str(a), str(b), "--json-out", str(out)]) == 0
    wait = json.loads(out.read_text())["contenders"]["ours-gspo-lora"]["batch_wait_seconds"]
    assert (wait["mean"], wait["min"], wait["max"]) == (50.0, 40.0, 60.0)
    assert "trainer waited 50 s" in capsys.readouterr().out


def test_waste_fractions_come_from_each_runs_ledger(bench, tmp_path):
    def ledger(sampled, stale, same, other):
        return {"tokens": {"sampled": sampled, "trained": sampled - stale - same - other,
                           "dropped_stale": stale, "dropped_filter": same + other},
                "dropped_filter_by_reason": {"same_scores": {"groups": 3, "tokens": same},
                                             "too_long": {"groups": 1, "tokens": other}}}

    day1 = _write(tmp_path / "day1.json", [{**_run("ours-gspo", 1, 0.5, 300), "ledger": ledger(1000, 100, 400, 100)},
                                           _run("trl", 1, 0.2, 150)])
    day2 = _write(tmp_path / "day2.json", [{**_run("ours-gspo", 1, 0.5, 300), "ledger": ledger(2000, 0, 600, 0)}])
    out = tmp_path / "merged.json"
    assert bench.main(["--merge", str(day1), str(day2), "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["contenders"]
    waste = rows["ours-gspo"]["waste_token_frac"]
    assert waste["stale"]["max"] == pytest.approx(0.1) and waste["all_same"]["min"] == pytest.approx(0.3)
    assert waste["filtered"]["max"] == pytest.approx(0.5)
    assert waste["waste"]["mean"] == pytest.approx((0.6 + 0.3) / 2)
    assert "waste_token_frac" not in rows["trl"]  # no ledger, no row
