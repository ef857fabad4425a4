"""``make bench-docs`` renderers for the rollout-accounting benchmarks (learning under faults, serve mode's pace, the feature screen) and the quickstart's sync and precision settings.

Each renderer takes the JSON payload(s) of its result file(s) and returns the markdown of one
block of ``docs/benchmarks.md`` (see :mod:`benchmarks.bench_docs`).
"""

from __future__ import annotations

import statistics

from benchmarks.docs_tables import source, table

#: ``python benchmarks/bench_fault_curve.py --minutes 7 --loss gspo --rollout-timeout 60``
FAULT_CURVE = "bench_fault_curve_2026-12-07.json"
#: ``bench_learning.py --minutes 7 --contenders ours-gspo-lora`` with
#: ``--ours-env-arg env.follow_trainer_pace=false`` (fixed), then without (follow), one after the other
PACE = ("bench_pace_fixed_2026-12-07.json", "bench_pace_follow_2026-12-07.json")
#: ``bench_difficulty_filter.py --groups 300 --difficulty 4 --arms off,on --env-arg item_filter.screen=8
#: --env-arg item_filter.screen_signal=features``
FEATURE_SCREEN = "bench_difficulty_filter_features_d4_2026-12-07.json"


def feature_screen_table(payload: dict) -> str:
    """bench_difficulty_filter with the feature screen: groups kept and dropped per arm, and the model's calibration."""
    rows = []
    for arm in payload["arms"]:
        filt = (arm.get("settings") or {}).get("item_filter") or {}
        screened = arm.get("filter") and filt.get("screen", 1) > 1
        what = (f"best of {filt['screen']} by the feature model" if screened else "no screen")
        cal = arm.get("screen_calibration") or {}
        rows.append([what, str(arm["groups"]), str(arm["mixed"]), f"{arm['dropped_share']:.1%}",
                     str(arm.get("screen_warmup_items", 0)),
                     f"{cal['predicted']:.3f} / {cal['observed']:.3f}" if cal else "-"])
    return (table(["arm", "groups", "mixed groups", "dropped as all-same", "handed out unscreened (warm-up)",
                   "predicted / observed solve rate"], rows) + "\n\n" + source(FEATURE_SCREEN))


def fault_curve_table(payload: dict) -> str:
    """bench_fault_curve: accuracy of the clean and the faulted run at each wall point, and their ratios."""
    rows = []
    for point in payload["ratios"]:
        gain = point.get("gain_ratio")
        rows.append([f"{point['minute']:g}", f"{point['clean']:.3f}", f"{point['faults']:.3f}",
                     f"{point['ratio']:.3f}", "-" if gain is None else f"{gain:.2f}"])
    faults = payload["faults"]
    kinds = ", ".join(f"{n} {kind}" for kind, n in faults["by_kind"].items())
    rate = f"{100 * faults['rate']:g}%"
    text = table(["minute", "clean", f"{rate} faults", "accuracy ratio", "gain ratio"], rows)
    runs = payload.get("runs") or []
    steps = ", ".join(f"{run['label']} {run['steps']}" for run in runs if "steps" in run)
    ledgers = [(run["label"], run["ledger"]["rollouts"]) for run in runs if run.get("ledger")]
    failed = "; ".join(f"{label}: {r['failed']} of {r['sampled']} rollout attempts failed"
                       for label, r in ledgers)
    text += (f"\n\nOne pair (n = 1): {faults['injected']} faults injected ({kinds}), policy "
             f"`{faults['policy']}`, `rollout_timeout` {faults['rollout_timeout']:g} s in both runs"
             + (f"; training steps: {steps}" if steps else "") + (f"; run-api's ledger: {failed}" if failed else "")
             + ". The gain ratio is the accuracy "
             "gained over the base model, faulted over clean.\n\n" + source(FAULT_CURVE))
    return text



def _curve(run: dict, from_start: bool = True) -> str:
    """A run's held-out accuracy points, ``"3.5 min 0.638  7 min 0.743"`` (minute 0 only with ``from_start``)."""
    return "  ".join(f"{p['minute']:g} min {p['accuracy']:.3f}" for p in run["curve"] if from_start or p["minute"])


def pace_table(fixed: dict, follow: dict) -> str:
    """The quickstart with serve mode's window and cap as set, and following the trainer."""
    rows = []
    for label, payload in (("as set (`follow_trainer_pace=false`)", fixed), ("following the trainer", follow)):
        run = payload["runs"][0]
        final = run["groups"]["final"]
        curve = _curve(run)
        rows.append([label, curve, str(run["steps"]), f"{run['batch_wait_seconds']:.0f}",
                     f"{final['dropped_same_scores']} / {final['sampled']}",
                     f"{run['peak_rss_bytes'] / 2**30:.2f}"])
    text = table(["serve mode", "held-out accuracy", "steps", "trainer waited (s)",
                  "groups dropped as all-same / sampled", "peak RSS (GiB)"], rows)
    return text + ("\n\nOne run each (n = 1), one after the other; the quickstart sets no staleness "
                   "limit, so only the automatic rollout cap differs.\n\n" + source(*PACE))

#: ``bench_learning.py --minutes 7 --contenders ours-gspo-lora`` with the default ``weight_sync: auto``
#: (it then picked ``lora``), then with ``--ours-trainer-arg weight_sync=reload``, one after the other
LORA_SYNC = ("bench_lora_sync_auto_2026-12-07.json", "bench_lora_sync_reload_2026-12-07.json")


def lora_sync_table(adapter: dict, reload: dict) -> str:
    """The quickstart pushing the LoRA adapter alone against pushing the merged blocks."""
    rows = []
    for label, payload in (("the adapter alone (`lora`)", adapter), ("the merged blocks (`reload`)", reload)):
        run = payload["runs"][0]
        parts = run.get("peak_rss_by_part") or {}
        rows.append([label, f"{run['curve'][-1]['accuracy']:.3f}", str(run["steps"]),
                     f"{run['batch_wait_seconds']:.0f}", f"{run['peak_rss_bytes'] / 2**30:.2f}",
                     f"{parts.get('vllm-engine', 0) / 2**30:.2f}"])
    text = table(["what each step pushes", "held-out accuracy at 7 min", "steps", "trainer waited (s)",
                  "peak RSS (GiB)", "of which vLLM's engine (GiB)"], rows)
    cpu = (adapter.get("meta") or {}).get("machine") or {}
    bf16 = {True: "with", False: "without"}.get(cpu.get("cpu_native_bf16"), "")
    return text + ("\n\nOne run each (n = 1), one after the other" + (f", on a CPU {bf16} native bf16" if bf16 else "")
                   + ". Only the final policy is compared: the adapter run's intermediate points were "
                   "taken before the benchmark learned to copy pushed adapters.\n\n" + source(*LORA_SYNC))


#: ``bench_learning.py --minutes 7 --contenders ours-gspo-lora`` with the quickstart's bf16 settings
#: (``--ours-trainer-arg weight_sync=reload``), then with ``--ours-trainer-arg mixed_precision=no
#: --ours-trainer-arg vllm_dtype=float32``, the same day on one CPU without native bf16
PRECISION = ("bench_lora_sync_reload_2026-12-07.json", "bench_precision_fp32_2026-12-07.json")


def precision_table(bf16: dict, fp32: dict) -> str:
    """The quickstart in bf16 (trainer autocast, vLLM dtype) against fp32, on one machine."""
    rows = []
    for label, payload in (("bf16 autocast, bf16 vLLM", bf16), ("fp32 trainer, fp32 vLLM", fp32)):
        run = payload["runs"][0]
        parts = run.get("peak_rss_by_part") or {}
        curve = _curve(run)
        rows.append([label, curve, str(run["steps"]), f"{run['peak_rss_bytes'] / 2**30:.2f}",
                     f"{parts.get('trainer', 0) / 2**30:.2f}", f"{parts.get('vllm-engine', 0) / 2**30:.2f}"])
    text = table(["precision", "held-out accuracy", "steps", "peak RSS (GiB)", "of which the trainer (GiB)",
                  "of which vLLM's engine (GiB)"], rows)
    cpu = {k: ((p.get("meta") or {}).get("machine") or {}).get("cpu_native_bf16") for k, p in
           (("bf16", bf16), ("fp32", fp32))}
    where = ("a CPU without native bf16 (no AVX512_BF16 or AMX-BF16), so bf16 was emulated"
             if set(cpu.values()) == {False} else "the same machine")
    return text + (f"\n\nOne run each (n = 1), the same day, on {where}.\n\n" + source(*PRECISION))


#: ``bench_learning.py --minutes M --contenders ours-gspo-lora [--task-difficulty 4]``, without and with
#: ``--ours-env-arg env.item_filter.enabled=true --ours-env-arg env.item_filter.screen=8``, in pairs
#: (before, after): difficulty 2 for 7 minutes (its "before" is the fp32 run above), difficulty 4 for
#: 7 minutes, difficulty 2 for 14 minutes, and a second difficulty-4 pair
WASTE = ("bench_precision_fp32_2026-12-07.json", "bench_waste_d2_screen8_2026-12-07.json",
         "bench_waste_d4_off_2026-12-07.json", "bench_waste_d4_screen8_2026-12-07.json",
         "bench_waste_d2_off_14min_2026-12-07.json", "bench_waste_d2_screen8_14min_2026-12-07.json",
         "bench_waste_d4_off_run2_2026-12-07.json", "bench_waste_d4_screen8_run2_2026-12-07.json")


def _waste(run: dict) -> dict[str, float]:
    waste = run["ledger"]["waste"]
    return {"stale": waste["stale_token_frac"], "all_same": waste["all_same_token_frac"],
            "waste": waste["stale_token_frac"] + waste["filter_token_frac"]}


def _task(run: dict) -> str:
    return f"difficulty {run.get('env_args', {}).get('env.difficulty', '2')}, {run['budget_minutes']:g} min"


def waste_table(*payloads: dict) -> str:
    """Sampled tokens wasted (stale, filtered, all-same) without and with the screen, and what was learned.

    Args:
        payloads: bench_learning results in pairs, (without the screen, with it), each pair one
            task and budget; a task may have several pairs (numbered in the table, and given
            with each arm's mean final accuracy).
    """
    pairs = list(zip(payloads[::2], payloads[1::2], strict=True))
    tasks = [_task(before["runs"][0]) for before, _ in pairs]
    seen: dict[str, int] = {}
    rows, ratios = [], []
    finals: dict[str, tuple[list[float], list[float]]] = {}
    for task, (before, after) in zip(tasks, pairs, strict=True):
        seen[task] = seen.get(task, 0) + 1
        name = f"{task}, pair {seen[task]}" if tasks.count(task) > 1 else task
        wastes = []
        for arm, (label, payload) in enumerate((("no screen", before),
                                                ("best of 8 by the answer's probability", after))):
            run = payload["runs"][0]
            waste = _waste(run)
            wastes.append(waste["waste"])
            final = run["groups"]["final"]
            finals.setdefault(task, ([], []))[arm].append(run["curve"][-1]["accuracy"])
            rows.append([name, label, f"{waste['waste']:.1%}", f"{waste['stale']:.1%}", f"{waste['all_same']:.1%}",
                         f"{final['dropped_same_scores']} / {final['sampled']}", str(run["steps"]),
                         _curve(run, from_start=False)])
        ratios.append(f"{name}: {wastes[1] / wastes[0]:.2f}x" if wastes[0] else f"{name}: -")
    text = table(["task, training time", "arm", "sampled tokens wasted", "stale", "in all-same groups",
                  "groups dropped as all-same / sampled", "steps", "held-out accuracy"], rows)
    repeated = [f"{task}: {statistics.fmean(off):.3f} without, {statistics.fmean(on):.3f} with (n = {len(off)} "
                "per arm)" for task, (off, on) in finals.items() if len(off) > 1]
    return text + ("\n\nWaste with the screen against without (goal <= 0.5x): " + "; ".join(ratios) + "."
                   + (" Mean held-out accuracy at the end, " + "; ".join(repeated) + "." if repeated else "")
                   + " One run per row, one machine, the same day; the screen's scoring requests "
                   "sample no tokens, so they are not in the waste, but their time is in the steps and "
                   "the accuracy.\n\n" + source(*WASTE[:len(payloads)]))


__all__ = ["FAULT_CURVE", "FEATURE_SCREEN", "LORA_SYNC", "PACE", "PRECISION", "fault_curve_table",
           "feature_screen_table", "lora_sync_table", "pace_table", "precision_table", "WASTE", "waste_table"]
