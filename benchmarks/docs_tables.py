"""The renderers of ``make bench-docs``: how each published block turns result files into markdown.

Formatting helpers (percentages, ranges, GiB, tables) and one function per block, named in
:data:`benchmarks.bench_docs.BLOCKS` with the result files each reads.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import Any

GiB = 2**30


# ---------------------------------------------------------------- formatting


def pct(x: float) -> str:
    """``0.8476`` -> ``"84.8%"``."""
    return f"{100 * x:.1f}%"


def span(values: list[float], fmt: Callable[[float], str], unit: str = "") -> str:
    """``"84.8-87.6% (n=3)"`` for several values, ``"84.8% (n=1)"`` for one."""
    lo, hi = min(values), max(values)
    body = fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo).removesuffix('%').removesuffix('x')}-{fmt(hi)}"
    return f"{body}{unit} (n={len(values)})"


def gib(x: float) -> str:
    """A size in GiB, two decimals."""
    return f"{x:.2f}"


def ratio(x: float) -> str:
    """A ratio, two decimals and an ``x``."""
    return f"{x:.2f}x"


def source(*names: str) -> str:
    """The sentence naming the result files a table comes from."""
    return "Source: " + ", ".join(f"`benchmarks/results/{n}`" for n in names) + "."


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- bench_learning payloads


def runs_of(payload: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """The runs of one contender, in pass order."""
    runs = [r for r in payload["runs"] if r["label"] == label]
    if not runs:
        raise KeyError(f"no runs of {label!r}; the file has {sorted({r['label'] for r in payload['runs']})}")
    return runs


def accuracy_at(run: dict[str, Any], minute: float) -> float:
    """A run's held-out accuracy (fraction) at ``minute`` of training.

    Raises:
        KeyError: the run was not evaluated at that minute.
    """
    for point in run["curve"]:
        if abs(point["minute"] - minute) < 1e-6:
            return point["accuracy"]
    raise KeyError(f"no evaluation at minute {minute:g}")


def trl_label(payload: dict[str, Any]) -> str:
    """The one TRL contender of a bench_learning payload.

    Raises:
        ValueError: none, or several.
    """
    labels = [lab for lab, row in payload["contenders"].items() if row.get("trl_setting")]
    if len(labels) != 1:
        raise ValueError(f"expected one TRL contender, found {labels}")
    return labels[0]


def describe(label: str, row: dict[str, Any], mark_unrecorded: bool = False) -> str:
    """A contender's label with the settings it changed from its default.

    ``mark_unrecorded`` appends a dagger when the file predates recording ``--ours-trainer-arg``.
    """
    setting = row.get("trl_setting")
    if setting:
        lora = f", LoRA r={setting['lora_r']}" if setting.get("lora_r") else ""
        return f"TRL, lr {setting['lr']:g}, {'bf16' if setting['bf16'] else 'fp32'}, {setting['level']}{lora}"
    changes = [f"lr={row['lr']:g}"] if row.get("lr") is not None else []
    changes += [f"{k.removeprefix('env.')}={v}" for k, v in (row.get("env_args") or {}).items()
                if k != "env.difficulty"]
    changes += [f"{k}={v}" for k, v in (row.get("trainer_args") or {}).items()]
    dagger = "†" if mark_unrecorded and "trainer_args" not in row else ""
    return label + (f" ({', '.join(changes)})" if changes else "") + dagger


def curve_cells(runs: list[dict[str, Any]], minutes: list[float]) -> str:
    """Mean accuracy at each minute, the last one with its range: ``32.4 / ... / **87.0%** [83.8-89.5]``."""
    means = [statistics.fmean(accuracy_at(r, m) for r in runs) for m in minutes]
    last = [accuracy_at(r, minutes[-1]) for r in runs]
    head = " / ".join(f"{100 * m:.1f}" for m in means[:-1])
    spread = f"{100 * min(last):.1f}-{100 * max(last):.1f}" if min(last) != max(last) else "the same in each"
    tail = f"**{pct(means[-1])}**" + (f" [{spread}]" if len(runs) > 1 else "")
    return f"{head} / {tail}"


def minutes_of(payload: dict[str, Any]) -> list[float]:
    """The minutes at which a payload's runs were evaluated."""
    return [p["minute"] for p in payload["runs"][0]["curve"]]


def dropped(run: dict[str, Any]) -> float | None:
    """The share of sampled groups a run dropped as all-same, or None when not recorded."""
    final = (run.get("groups") or {}).get("final")
    return final["dropped_same_scores"] / final["sampled"] if final and final["sampled"] else None


def contender_table(payload: dict[str, Any], labels: list[str] | None = None) -> str:
    """One row per contender: runs, accuracy curve (mean; last point with its range), steps, peak RSS."""
    minutes = minutes_of(payload)
    header = ["contender", "runs", "held-out at " + " / ".join(f"{m:g}" for m in minutes) + " min (mean)",
              "steps", "samples/s", "peak RSS, GiB", "groups dropped as all-same"]
    rows = []
    for label in labels or list(payload["contenders"]):
        runs, row = runs_of(payload, label), payload["contenders"][label]
        drops = [d for d in map(dropped, runs) if d is not None]
        rows.append([describe(label, row), str(len(runs)), curve_cells(runs, minutes),
                     _range([float(r["steps"]) for r in runs], "{:.0f}"),
                     _range([r["sequences"] / r["train_seconds"] for r in runs], "{:.2f}"),
                     _range([r["peak_rss_bytes"] / GiB for r in runs], "{:.2f}"),
                     _range(drops, "{:.0%}") if drops else "-"])
    return table(header, rows)


def _range(values: list[float], fmt: str) -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo.removesuffix('%')}-{hi}"


def pair_ratios(payload: dict[str, Any], ours: str, peer: str) -> list[tuple[int, float, float, float, float]]:
    """``(pass, ours RSS GiB, peer RSS GiB, RSS ratio, PSS ratio)`` for each pass that ran both."""
    out = []
    peers = {r["pass"]: r for r in runs_of(payload, peer)}
    for run in runs_of(payload, ours):
        other = peers.get(run["pass"])
        if other is None:
            continue
        out.append((run["pass"], run["peak_rss_bytes"] / GiB, other["peak_rss_bytes"] / GiB,
                    run["peak_rss_bytes"] / other["peak_rss_bytes"],
                    run["peak_pss_bytes"] / other["peak_pss_bytes"]))
    return out


# ---------------------------------------------------------------- the blocks

QUICKSTART = "bench_learning_gspo_full_lora_3pairs_d2_14min_2026-11-29.json"
FAIR_D2 = "bench_learning_gspo_trl_d2_pairs3_14min_2026-11-28.json"
FAIR_D4 = "bench_learning_gspo_trl_d4_pairs3_14min_2026-11-27.json"
LORA_TRL_FULL = "bench_learning_gspo_lora_trl_full_d2_14min_2026-11-29.json"
SWEEP_D2 = "bench_learning_trl_sweep_d2_7min_2026-11-27.json"
SWEEP_D4 = "bench_learning_trl_sweep_d4_7min_2026-11-27.json"
COSINE = "bench_learning_gspo_lora_d4_group4_layers20_cosine_runs4_14min_2026-12-05.json"
CONSTANT = "bench_learning_gspo_lora_d4_group4_layers20_runs5_14min_2026-12-05.json"
QUICKSTART_D4 = "bench_learning_gspo_lora_d4_runs2_14min_2026-12-05.json"
MEMORY_LORA = "bench_memory_lora_trl_pairs3_4min_2026-12-07.json"
MEMORY_LORA_HF = "bench_memory_hf_trl_pairs3_4min_2026-12-07.json"
MEMORY_VLLM_FP32 = "bench_memory_vllm_fp32_4min_2026-12-07.json"


def rng(values: list[float], fmt: Callable[[float], str]) -> str:
    """``"84.8-87.6%"`` (or one value when all agree); the caller states ``n``."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo.removesuffix('%').removesuffix('x')}-{hi}"


def wrap(text: str) -> str:
    """Markdown prose wrapped at 100 columns (links and code spans kept whole)."""
    import textwrap

    return textwrap.fill(" ".join(text.split()), 100, break_long_words=False, break_on_hyphens=False)


def readme_quickstart(quick: dict, fair2: dict, fair4: dict, mixed: dict, lora_pairs: dict,
                      hf_pairs: dict) -> str:
    """The README's quickstart paragraph: LoRA, full fine-tune, TRL like for like (vLLM, then the in-process sampler)."""
    lora, full = runs_of(quick, "ours-gspo-lora"), runs_of(quick, "ours-gspo")
    t2, t4 = trl_label(fair2), trl_label(fair4)
    like = pair_ratios(mixed, "ours-gspo", trl_label(mixed))
    like_lora = pair_ratios(lora_pairs, "ours-gspo-lora", trl_label(lora_pairs))
    like_hf = pair_ratios(hf_pairs, "ours-gspo-lora", trl_label(hf_pairs))
    hf_ours, hf_trl = runs_of(hf_pairs, "ours-gspo-lora"), runs_of(hf_pairs, trl_label(hf_pairs))
    pairs = pair_ratios(fair2, "ours-gspo", t2)
    final = lambda runs: rng([accuracy_at(r, 14) for r in runs], pct)  # noqa: E731
    peak = lambda runs: rng([r["peak_rss_bytes"] / GiB for r in runs], gib) + " GiB"  # noqa: E731
    return wrap(
        f"The quickstart trains LoRA adapters on the top 10 layers. In three 14-minute runs (n={len(lora)}) "
        f"it took the held-out accuracy from {pct(accuracy_at(lora[0], 0))} to {final(lora)} "
        f"({rng([accuracy_at(r, 7) for r in lora], pct)} at 7 minutes), with the whole loop at {peak(lora)} "
        f"of peak memory. `configs/quickstart-cpu-full.yaml` fine-tunes the same layers whole: "
        f"{final(full)} in the same pairs (n={len(full)}), at {peak(full)}. "
        f"Against TRL's `GRPOTrainer` training the same layers whole, at the best setting of TRL's own "
        f"sweep, the full fine-tune reached {final(runs_of(fair2, 'ours-gspo'))} against "
        f"{final(runs_of(fair2, t2))} in three same-run pairs (n={len(runs_of(fair2, t2))}), and on a "
        f"harder task (operands to 99) {final(runs_of(fair4, 'ours-gspo'))} against "
        f"{final(runs_of(fair4, t4))} (n={len(runs_of(fair4, t4))}). Its whole loop peaked at "
        f"{rng([x[3] for x in like], ratio)} TRL's memory in the latest same-run comparison "
        f"(n={len(like)}), {rng([x[3] for x in pairs], ratio)} in those three pairs (n={len(pairs)}, "
        f"the config of that day). Against TRL training LoRA adapters on the same layers, the LoRA loop "
        f"peaked at {rng([x[3] for x in like_lora], ratio)} TRL's memory (PSS "
        f"{rng([x[4] for x in like_lora], ratio)}; n={len(like_lora)} pairs of "
        f"{lora_pairs['task']['minutes']:g}-minute runs in fp32). Sampling in the trainer's own "
        f"process instead of vLLM (`trainer.rollout_engine: hf`, as TRL samples), it peaked at "
        f"{rng([x[3] for x in like_hf], ratio)} TRL's memory (PSS {rng([x[4] for x in like_hf], ratio)}; "
        f"n={len(like_hf)} pairs of {hf_pairs['task']['minutes']:g}-minute runs in fp32), with slower "
        f"sampling: {rng([float(r['steps']) for r in hf_ours], lambda x: f'{x:.0f}')} steps to TRL's "
        f"{rng([float(r['steps']) for r in hf_trl], lambda x: f'{x:.0f}')}. Tables and commands: "
        f"[Benchmarks](docs/benchmarks.md).")


def quickstart_table(payload: dict) -> str:
    """The quickstart's LoRA and full fine-tune rows."""
    return contender_table(payload, ["ours-gspo-lora", "ours-gspo"]) + "\n\n" + source(QUICKSTART)


def fair_table(name: str) -> Callable[[dict], str]:
    """The renderer of a fair table: contenders, each pair, ours minus TRL per pair."""
    def render(payload: dict) -> str:
        ours, peer = "ours-gspo", trl_label(payload)
        minutes = minutes_of(payload)
        rows = []
        for run in sorted(payload["runs"], key=lambda r: (r["pass"], r["label"] != ours)):
            rows.append([str(run["pass"]), describe(run["label"], payload["contenders"][run["label"]]),
                         str(run["steps"]), " / ".join(f"{100 * accuracy_at(run, m):.1f}" for m in minutes),
                         f"{run['peak_rss_bytes'] / GiB:.2f}"])
        per_pass = table(["pair", "contender", "steps",
                          "held-out at " + " / ".join(f"{m:g}" for m in minutes) + " min", "peak RSS, GiB"], rows)
        gaps = [accuracy_at(a, minutes[-1]) - accuracy_at(b, minutes[-1])
                for a, b in zip(runs_of(payload, ours), runs_of(payload, peer), strict=True)]
        return (contender_table(payload, [ours, peer]) + "\n\n" + per_pass + "\n\n"
                f"Ours minus TRL at {minutes[-1]:g} minutes, per pair: "
                + ", ".join(f"{100 * g:+.1f}" for g in gaps) + f" points (n={len(gaps)}). " + source(name))
    return render


def sweep_table(name: str) -> Callable[[dict], str]:
    """The renderer of TRL's sweep: one row per setting, and the pick."""
    def render(payload: dict) -> str:
        best = payload["trl_sweep"]["best"]["label"]
        text = contender_table(payload)
        return (text + f"\n\nThe sweep's pick (highest final accuracy, one run each): `{best}`. " + source(name))
    return render


#: the whole loop's peak RSS against TRL's, like for like, that the memory work aims at
MEMORY_GOAL = 1.1
#: the parts of our loop, in the order the memory table lists them (as process_tree names them)
LOOP_PARTS = ("trainer", "vllm-engine", "vllm-api", "env", "run-api", "launcher")


def memory_lora_table(name: str, ours_header: str = "ours (LoRA)") -> Callable[[dict], str]:
    """The renderer of result ``name``: our LoRA loop against TRL training LoRA adapters on the same layers.

    Per pair: both sides' peak RSS and the RSS and PSS ratios; then where each side's memory
    sits at its peak (mean over the runs; parts the loop did not run are left out), and the
    held-out accuracy at the end of the budget.
    """

    def render(payload: dict) -> str:
        ours, peer = "ours-gspo-lora", trl_label(payload)
        minutes = payload["task"]["minutes"]
        pairs = pair_ratios(payload, ours, peer)
        text = table(["pair", f"{ours_header}, GiB", "TRL (LoRA), GiB", "RSS ratio", "PSS ratio"],
                     [[str(p), f"{a:.2f}", f"{b:.2f}", f"{r:.2f}x", f"{s:.2f}x"] for p, a, b, r, s in pairs])
        runs, theirs = runs_of(payload, ours), runs_of(payload, peer)

        def mean_part(part: str) -> float:
            return statistics.fmean(r["rss_by_part_at_peak"].get(part, 0) for r in runs) / GiB

        parts = ", ".join(f"{part} {mean_part(part):.2f}" for part in LOOP_PARTS
                          if any(part in r["rss_by_part_at_peak"] for r in runs))
        trl_peak = statistics.fmean(r["peak_rss_bytes"] for r in theirs) / GiB
        # fp32 where the CPU has no native bf16 (the quickstart's bf16_if_native) or where the
        # run set mixed_precision: no (False: YAML 1.1 reads a bare `no` so); recorded with the run
        no_bf16 = (payload.get("meta", {}).get("machine", {}).get("cpu_native_bf16") is False
                   or runs[0].get("trainer_args", {}).get("mixed_precision") in ("no", False))
        fp32 = no_bf16 and not theirs[0]["trl_setting"]["bf16"]
        precision = "fp32 on both sides" if fp32 else "each side's configured precision"
        return (f"{minutes:g}-minute runs, {precision}, one after another, every other pair in "
                f"reverse order. RSS {span([p[3] for p in pairs], ratio)}, PSS "
                f"{span([p[4] for p in pairs], ratio)}; the goal, at most {MEMORY_GOAL:.1f}x, is "
                f"{'met' if max(p[3] for p in pairs) <= MEMORY_GOAL else 'not met'}.\n\n" + text + "\n\n"
                f"Where the memory sits at the whole loop's peak (GiB, mean of {len(runs)} runs): {parts}. "
                f"TRL is one process (mean peak {trl_peak:.2f}). Held-out accuracy at {minutes:g} minutes: ours "
                f"{span([accuracy_at(r, minutes) for r in runs], pct)}, TRL "
                f"{span([accuracy_at(r, minutes) for r in theirs], pct)}; steps: ours "
                f"{span([float(r['steps']) for r in runs], lambda x: f'{x:.0f}')}, TRL "
                f"{span([float(r['steps']) for r in theirs], lambda x: f'{x:.0f}')}. " + source(name))

    return render


def memory_hf_table(hf: dict, vllm: dict) -> str:
    """The in-process sampler's pairs against TRL, then the same loop sampling from vLLM on that machine.

    ``vllm`` is a run of ``ours-gspo-lora`` alone, in the same precision, measured the same day:
    what sampling from vLLM buys in steps, and costs in memory, beside the pairs.
    """
    text = memory_lora_table(MEMORY_LORA_HF, "ours (LoRA, hf sampler)")(hf)
    runs, minutes = runs_of(vllm, "ours-gspo-lora"), vllm["task"]["minutes"]
    steps = lambda rs: span([float(r["steps"]) for r in rs], lambda x: f"{x:.0f}")  # noqa: E731
    return (text.removesuffix(source(MEMORY_LORA_HF)) + "The same loop sampling from vLLM instead "
            f"(the quickstart's way), on the same machine in the same precision: steps {steps(runs)} in "
            f"{minutes:g} minutes, peak RSS {span([r['peak_rss_bytes'] / GiB for r in runs], gib, ' GiB')}, "
            f"held-out accuracy at {minutes:g} minutes {span([accuracy_at(r, minutes) for r in runs], pct)}. "
            + source(MEMORY_LORA_HF, MEMORY_VLLM_FP32))


def memory_table(mixed: dict, fair2: dict) -> str:
    """Peak memory against TRL, like for like: the latest same-run trio, then the three pairs."""
    rows = []
    peer = trl_label(mixed)
    trl_rss = runs_of(mixed, peer)[0]["peak_rss_bytes"] / GiB
    for label in mixed["contenders"]:
        run = runs_of(mixed, label)[0]
        rss = run["peak_rss_bytes"] / GiB
        if label == peer:
            like = "1.00x (the baseline)"
        elif label == "ours-gspo":
            like = f"{rss / trl_rss:.2f}x (both train the top 10 layers whole)"
        else:
            like = "TRL ran without LoRA here; LoRA against LoRA: the table above"
        rows.append([describe(label, mixed["contenders"][label]), f"{rss:.2f}",
                     f"{run['peak_pss_bytes'] / GiB:.2f}", like])
    first = table(["contender (one run each, one after another)", "peak RSS, GiB", "peak PSS, GiB",
                   "RSS against TRL"], rows)
    pairs = pair_ratios(fair2, "ours-gspo", trl_label(fair2))
    second = table(["pair", "ours (full fine-tune), GiB", "TRL, GiB", "RSS ratio", "PSS ratio"],
                   [[str(p), f"{a:.2f}", f"{b:.2f}", f"{r:.2f}x", f"{s:.2f}x"] for p, a, b, r, s in pairs])
    return (first + "\n\n" + source(LORA_TRL_FULL) + "\n\nThe three same-run pairs of the difficulty-2 "
            "table (the full fine-tune's config of that day: micro-batch 8, no activation checkpointing): "
            f"RSS {span([p[3] for p in pairs], ratio)}.\n\n" + second + "\n\n" + source(FAIR_D2))


def _fingerprints(payload: dict) -> set[tuple]:
    """One key per run (merged files keep their runs' numbers, not their files' names)."""
    return {(r["label"], r["steps"], r["peak_rss_bytes"], r.get("sequences")) for r in payload["runs"]}


def is_merged_source(name: str, files: dict[str, dict]) -> bool:
    """Whether every run of ``name`` is also in a larger file (so its rows would count twice)."""
    own = _fingerprints(files[name])
    return any(other != name and own < _fingerprints(p) for other, p in files.items())


def settings_table(difficulty: int, minutes: float) -> Callable[[dict[str, dict]], str]:
    """Every stored run of our loop at one difficulty and budget: one row per contender and file."""
    def render(files: dict[str, dict]) -> str:
        learning = {n: p for n, p in files.items() if "runs" in p and p.get("task", {}).get("difficulty") == difficulty
                    and p["task"].get("minutes") == minutes}
        rows = []
        for name, payload in sorted(learning.items(), key=lambda kv: (_date(kv[0]), kv[0])):
            if is_merged_source(name, learning):
                continue
            for label, row in payload["contenders"].items():
                if row.get("trl_setting"):
                    continue
                runs = runs_of(payload, label)
                finals = [accuracy_at(r, minutes) for r in runs]
                rows.append((statistics.fmean(finals), [
                    _date(name), f"`{name.removeprefix('bench_learning_').removesuffix('.json')}`",
                    describe(label, row, mark_unrecorded=True), str(len(runs)),
                    _range([accuracy_at(r, minutes / 2) for r in runs], "{:.1%}"),
                    pct(statistics.fmean(finals)) + (f" [{100 * min(finals):.1f}-{100 * max(finals):.1f}]"
                                                     if len(runs) > 1 else ""),
                    _range([float(r["steps"]) for r in runs], "{:.0f}")]))
        best = max(rows, key=lambda r: r[0])[1]
        best[5] = f"**{best[5]}** (best of the {len(rows)} rows: a selection)"
        body = table(["date", "result file (`bench_learning_...`)", "contender and what it changed", "runs",
                      f"held-out at {minutes / 2:g} min", f"at {minutes:g} min (mean [range])", "steps"],
                     [r for _, r in rows])
        return (body + f"\n\n{len(rows)} rows from {len({r[1][1] for r in rows})} result files. The code, and "
                "the machine's speed, changed between dates: compare rows of one date. † The file predates "
                "the recording of `--ours-trainer-arg`: its name says what changed.")
    return render


def _date(name: str) -> str:
    match = re.search(r"(\d{4}-\d{2}-\d{2})\.json$", name)
    return match.group(1) if match else "?"


def d4_goal(cosine: dict, constant: dict, quick: dict) -> str:
    """The three settings of the 2026-12-05 session at difficulty 4, side by side."""
    rows = []
    for payload, name in ((cosine, COSINE), (constant, CONSTANT), (quick, QUICKSTART_D4)):
        for label, row in payload["contenders"].items():
            runs = runs_of(payload, label)
            rows.append([describe(label, row), str(len(runs)), curve_cells(runs, minutes_of(payload)),
                         _range([float(r["steps"]) for r in runs], "{:.0f}"), f"`{name}`"])
    return table(["difficulty 4, 14 minutes, 2026-12-05", "runs",
                  "held-out at " + " / ".join(f"{m:g}" for m in minutes_of(cosine)) + " min (mean; last: range)",
                  "steps", "result file"], rows)


def readme_d4(cosine: dict, quick: dict) -> str:
    """The README's difficulty-4 sentence: the best setting, labelled a selection, beside the defaults."""
    finals = [accuracy_at(r, 14) for r in runs_of(cosine, "ours-gspo-lora")]
    plain = [accuracy_at(r, 14) for r in runs_of(quick, "ours-gspo-lora")]
    return wrap(
        f"At difficulty 4 the best of the settings tried (groups of 4, LoRA on the top 20 layers, a "
        f"cosine learning-rate decay) averaged {pct(statistics.fmean(finals))} held-out at 14 minutes "
        f"({rng(finals, pct)}, n={len(finals)}). It is a selection: the best of every setting tried. The "
        f"quickstart's own settings read {rng(plain, pct)} (n={len(plain)}) the same day.")


def screen_table(name: str) -> Callable[[dict], str]:
    """The renderer of a difficulty-filter screen table: one row per arm."""
    def render(payload: dict) -> str:
        arms = _arms(payload)
        timed = all("seconds" in a for a in arms)
        has_run = any("run" in a for a in arms)
        rows = []
        for arm in arms:
            settings = arm.get("settings") or {}
            # the item_filter section; results written before it was nested: difficulty_filter_<field>
            filt = settings.get("item_filter") or {k.removeprefix("difficulty_filter_"): v for k, v in
                                                   settings.items() if k.startswith("difficulty_filter_")}
            screen = filt.get("screen", 1) if arm.get("filter") else 1
            rule = filt.get("screen_rule", "best")
            what = "no screen" if screen <= 1 else (f"best of {screen}" if rule == "best"
                                                    else f"{rule}, {screen} candidates")
            row = ([arm.get("run", "-")] if has_run else []) + [what, str(arm.get("group_size", settings.get("group_size", 8))),
                   arm.get("reference_reply") or "-", str(arm["groups"]), str(arm["mixed"]), f"{arm['dropped_share']:.1%}"]
            if timed:
                row += [f"{arm['seconds']:.1f}", f"{arm['mixed'] / arm['seconds']:.2f}"]
            rows.append(row)
        header = (["run"] if has_run else []) + ["arm", "group size", "the screen's reference reply", "groups",
                                                 "mixed groups", "dropped as all-same"]
        if timed:
            header += ["seconds", "mixed groups per second"]
        return table(header, rows) + "\n\n" + source(name)
    return render


def _arms(payload: dict | list) -> list[dict]:
    return payload["arms"] if isinstance(payload, dict) else payload


def signal_table(payload: dict) -> str:
    """The screen's signal (the answer's probability after the working) by fifth of the problems."""
    arm = next(a for a in _arms(payload) if a.get("signal_by_fifth"))
    fifths = arm["signal_by_fifth"]
    header = ["answer's probability, by fifth of the problems"] + [
        f"{lo:.2g}-{hi:.2g}" for lo, hi in (f["answer_probability"] for f in fifths)]
    rows = [["share of replies solved"] + [f"{f['solved_share']:.2f}" for f in fifths],
            ["groups all-same"] + [f"{f['all_same_share']:.0%}" for f in fifths]]
    return (table(header, rows) + f"\n\n{arm['groups']} problems, one group of 8 each. " + source(SIGNAL))


def errors_table(payload: dict) -> str:
    """The policy's errors by operator (bench_arithmetic_errors)."""
    rows = [[f"`{op}`", str(payload["n"][op]), pct(payload["accuracy"][op]),
             *(str(payload["counts"][op].get(k, 0)) for k in ("carry", "units digit", "other"))]
            for op in payload["n"]]
    return (table(["operator", "problems", "right", "off by exactly 1, 10 or 100 (carry)",
                   "otherwise off by under 10", "other wrong"], rows)
            + f"\n\nOverall {pct(payload['accuracy_overall'])} of {payload['problems']}. "
            + source("bench_arithmetic_errors_d4policy_2026-11-29.json"))


def step_memory_table(*payloads: dict, names: tuple[str, ...]) -> str:
    """One table per bench_step_memory file: seconds and RSS rise per setting."""
    out = []
    for payload, name in zip(payloads, names, strict=True):
        rows = [[", ".join(f"{k}={v}" for k, v in row["setting"].items()), f"{row['median_seconds']:.2f}",
                 f"{row['seconds_ratio']:.2f}x", f"{row['median_rss_rise_mib']:.0f}", f"{row['rss_rise_ratio']:.2f}x"]
                for row in payload["rows"]]
        out.append(table(["setting", "s/step (median)", "time ratio", "RSS rise over rest, MiB", "rise ratio"], rows)
                   + "\n\n" + source(name))
    return "\n\n".join(out)


def reload_table(*payloads: dict, names: tuple[str, ...]) -> str:
    """vLLM's log-prob gap after reloads, per cache setting and round (bench_reload_logprobs)."""
    rows: list[list[str]] = []
    for payload in payloads:
        for row in payload["rows"]:
            prev = row["mean_abs_gap_previous_weights"]
            rows.append([", ".join(f"{k}={v}" for k, v in payload["env"].items()) or "-", str(row["round"]),
                         str(row["tokens"]), f"{row['mean_abs_gap']:.3f}", "-" if prev is None else f"{prev:.2f}"])
    return (table(["vLLM environment", "round", "sampled tokens", "mean abs gap, weights just pushed",
                   "mean abs gap, weights of the round before"], rows) + "\n\n" + source(*names))


def trainer_gpu_table(files: dict[str, dict]) -> str:
    """Every GPU row of bench_trainer: one table, the sub-runs of a file with several (``runs``) included."""
    rows = []
    for name in sorted(files, key=lambda n: (_date(n), n)):
        payload = files[name]
        parts = payload["runs"].items() if "runs" in payload else [("", payload)]
        short = name.removeprefix("bench_trainer_gpu_qwen0.5b").removesuffix(".json")
        for part, run in parts:
            for row in run["rows"]:
                peak = row.get("peak_memory_mib") or max(row.get("peak_memory_mib_per_process") or [0])
                rows.append([f"`{short}`" + (f" {part}" if part else ""), row["name"],
                             f"{row['seconds_per_step']:.3f}", f"{row['tokens_per_second'] / 1e3:.1f}k",
                             f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-", f"{peak / 1024:.1f}"])
            for sync in run.get("weight_sync") or []:
                rows.append([f"`{short}`" + (f" {part}" if part else ""), f"weight sync, trainer side ({sync['name']})",
                             f"{sync['seconds']:.2f}", "-", "-", f"{sync['bytes'] / 2**20:.0f} MiB written"])
    return (table(["file (`bench_trainer_gpu_qwen0.5b...`)", "setting", "s/step", "tokens/s", "MFU", "peak GiB"], rows)
            + "\n\nThe files dated 2026-11-27 were not timed to the step's end (the next step's launches "
              "overlapped the last one's backward): they do not compare with those dated 2026-11-28.")


API_ROWS = (("end to end (post + drain), s", "end_to_end_s", "{:.1f}"),
            ("POST throughput, groups/s", "groups_per_s", "{:.0f}"),
            ("POST p50 / p99, ms", ("post_p50_ms", "post_p99_ms"), "{:.0f}"),
            ("drain, s", "drain_s", "{:.2f}"),
            ("`/batch` p50 / p99, ms", ("batch_p50_ms", "batch_p99_ms"), "{:.0f}"),
            ("server RSS per queued token, bytes", "bytes_per_queued_token", "{:.0f}"),
            ("`/batch` of 64 x 4096 tokens, client-side ms", "big_batch_client_ms", "{:.0f}"),
            ("the same, server time (Server-Timing), ms", "big_batch_server_ms", "{:.0f}"))


def api_table(payload: dict) -> str:
    """bench_api: each server's measurements, and the ratios against upstream."""
    results = payload["results"]
    rows = []
    for label, keys, fmt in API_ROWS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        rows.append([label] + [" / ".join("-" if r.get(k) is None else fmt.format(r[k]) for k in keys)
                               for r in results])
    text = table(["", *(r["name"] for r in results)], rows)
    if "ratios" in payload:
        r = payload["ratios"]
        text += ("\n\nRatios against upstream, same run: end to end "
                 f"{r['end_to_end_speedup']:.1f}x faster, POST throughput {r['post_throughput_ratio']:.1f}x, "
                 f"drain {r['drain_speedup']:.1f}x faster, `/batch` p50 {r['batch_p50_speedup']:.1f}x faster, "
                 f"memory per queued token {r['memory_per_token_ratio']:.2f}x, the 64 x 4096 `/batch` "
                 f"{r['big_batch_speedup']:.1f}x faster (client-side).")
    return text + "\n\n" + source(API)


def readme_api(payload: dict) -> str:
    """The README's "Fast" bullet from bench_api's ratios."""
    r = payload["ratios"]
    return (f"- **Fast**: {r['end_to_end_speedup']:.1f}x faster than upstream end to end in "
            f"`benchmarks/bench_api.py` (one run, both servers measured in the same run), at "
            f"{r['memory_per_token_ratio']:.2f}x its memory per queued token.")


API = "bench_api_2026-12-06.json"


def import_failures(records: list[dict]) -> dict[str, int]:
    """Why env files failed to import, by kind: a module not installed, a relative import run
    outside its package, a name the package lacks, anything else (files, credentials, the Hub)."""
    kinds = {"missing module": 0, "relative import": 0, "missing name": 0, "other": 0}
    for rec in records:
        error = rec["import_error"] or ""
        if rec["import_ok"]:
            continue
        if error.startswith("ModuleNotFoundError"):
            kinds["missing module"] += 1
        elif error.startswith("ImportError: attempted relative import"):
            kinds["relative import"] += 1
        elif error.startswith("ImportError: cannot import name"):
            kinds["missing name"] += 1
        else:
            kinds["other"] += 1
    return kinds


def compat_table(payload: dict) -> str:
    """compat_upstream: upstream's env files on each side, what differs, and why files fail here."""
    sides = payload["sides"]
    order = sorted(sides, key=lambda name: name == "ours")  # upstream first, ours last
    rows = []
    for name in order:
        t = sides[name]["totals"]
        rows.append([name, sides[name]["atroposlib_version"], str(t["files"]), str(t["import_ok"]),
                     str(t["files_with_env"]), str(t["files_config_init_ok"]),
                     f"{t['config_init_ok']} / {t['env_classes']}"])
    text = table(["side", "atroposlib", "files", "import", "`BaseEnv` subclass found",
                  "`config_init()` (files)", "`config_init()` (classes)"], rows)
    git = (payload.get("meta") or {}).get("git") or {}
    text += (f"\n\nUpstream's repository at `{payload['upstream_sha'][:7]}`, ours at "
             f"`{(git.get('sha') or '?')[:7]}`{' with uncommitted changes' if git.get('dirty') else ''}.")
    if "compare" in payload:
        c = payload["compare"]
        text += (f" On {c['base']} and not here: {len(c['import_lost'])} files import, "
                 f"{len(c['config_init_lost'])} env classes configure. Here and not on {c['base']}: "
                 f"{len(c['import_gained'])} files import.")
    ours = sides["ours"]
    kinds = import_failures(ours["files"])
    missing = ours["totals"]["missing_modules"]
    top = ", ".join(f"`{m}` {n}" for m, n in list(missing.items())[:3])
    text += (f" Of the {sum(kinds.values())} files that fail here, {kinds['missing module']} need a "
             f"module that is not installed ({len(missing)} modules; most files: {top}), "
             f"{kinds['relative import']} are modules with relative imports, run outside their "
             f"package, {kinds['missing name']} import a name that this package lacks")
    if "compare" in payload:
        base = {r["file"]: r for r in sides[payload["compare"]["base"]]["files"]}
        named = [r["file"] for r in ours["files"] if not r["import_ok"]
                 and (r["import_error"] or "").startswith("ImportError: cannot import name")]
        both = sum(not base[f]["import_ok"] for f in named)
        text += f" ({both} of them fail on {payload['compare']['base']} too)"
    text += f", and {kinds['other']} need files, credentials or the Hub, or exit."
    return text + "\n\n" + source(COMPAT)


def health_table(payload: dict) -> str:
    """bench_vllm_health: seconds from a SIGKILL to vLLM until each health watch reports it."""
    interval, grace = payload["interval_s"], payload["grace_s"]
    watches = (("launched", "the vLLM process the trainer started", "its exit"),
               ("external", "a `--vllm-url` server", f"`GET /health` failing for {grace:g} s"))
    rows = []
    for key, what, dead in watches:
        seconds = [t[key]["detected_s"] for t in payload["trials"] if t[key]["detected_s"] is not None]
        rows.append([what, dead, f"{interval:g}", span(seconds, lambda x: f"{x:.2f}"),
                     f"{statistics.median(seconds):.2f}", f"{max(seconds) / interval:.2f}"])
    missed = sum(t[k]["detected_s"] is None for t in payload["trials"] for k, _, _ in watches)
    text = table(["watched", "dead on", "poll interval, s", "reported after the kill, s",
                  "median, s", "slowest / interval"], rows)
    text += (f"\n\n{payload['kills']} SIGKILLs to vLLM's API server, one per start; "
             f"{missed} not reported.")
    return text + "\n\n" + source(HEALTH)


def parity_table(payload: dict) -> str:
    """upstream_parity: upstream's own test suite run against each side, per dependency set."""
    rows = []
    for dep_set, sides in payload["suite"].items():
        for side, record in sides.items():
            c = record["counts"]
            rows.append([dep_set, side, *(str(c.get(k, 0)) for k in ("passed", "failed", "error", "skipped"))])
    git = (payload.get("meta") or {}).get("git") or {}
    return (table(["set", "side", "passed", "failed", "errors", "skipped"], rows)
            + f"\n\nOurs at `{str(git.get('sha', '?'))[:7]}`. {source(PARITY)}")


def verifiers_table(payload: dict) -> str:
    """compat_verifiers: verifiers' own environments through ``atropos-env verifiers:ID process``."""
    rows = []
    for env in payload["envs"]:
        rescored = env["matched"] + env["mismatched"]
        rows.append([f"`{env['id']}`", env["verdict"], str(env["groups"]), str(env["rollouts"]),
                     f"{env['matched']} of {rescored}" if rescored else "not re-scored",
                     f"{env['rollouts_with_tools_in_prompt']} / {env['tool_calls']}"])
    return (table(["environment", "result", "groups", "rollouts", "scores equal to verifiers' reward",
                   "rollouts with tools in the prompt / tool calls"], rows)
            + f"\n\nverifiers {payload['verifiers_version']} at `{payload['verifiers_commit'][:7]}`, "
            f"groups of {payload['group_size']}. {source(VERIFIERS)}")


COMPAT = "compat_upstream_2026-12-06.json"
VERIFIERS = "compat_verifiers_2026-12-06.json"
PARITY = "upstream_parity_2026-12-06.json"
HEALTH = "bench_vllm_health_2026-12-06.json"

STEP_MEMORY = ("bench_step_memory_quickstart_2026-11-28.json", "bench_step_memory_checkpointing_2026-11-28.json")
RELOAD = ("bench_reload_logprobs_onednn64_2026-11-28.json", "bench_reload_logprobs_onednn1024_2026-11-28.json")
SCREEN = "bench_difficulty_filter_screen_d4_2026-11-29.json"
SCREEN_WEIGHTED = "bench_difficulty_filter_screen_weighted_d4_2026-11-29.json"
SCREEN_COST = "bench_difficulty_filter_screen_cost_d4_2026-11-29.json"
SIGNAL = "bench_difficulty_filter_signal_d4_2026-11-29.json"
