"""Share of sampled groups dropped as all-same scores, with and without the item filter.

Counted in groups, not minutes, so a busy machine does not change it: the arithmetic env samples
``--groups`` groups (of 8 unless ``group_size`` is overridden) from a real vLLM serving a FIXED
policy (the bundled model, or a checkpoint such as a run's ``checkpoints/final``),
``--concurrency`` groups at a time, through the same steps the serve loop takes (``run_item``,
and :class:`~atroposlib.env_runtime.filtering.ItemFilter` when on). Both arms use the same seed, so they draw the same
stream of problems; the filter only skips some.
For each arm: groups sampled, dropped as same scores (all solved / all failed), the share
dropped overall and per window of ``--window`` groups, items skipped by the filter, candidates
scored by its screen (``--env-arg item_filter.screen=8``), the arm's wall seconds and
its group size; with the screen on, also the items handed out unscreened while its feature
model learned (``--env-arg item_filter.screen_signal=features``) and the solve-rate model's
calibration on the last groups (mean predicted and observed solve rate, log-loss per rollout). ``--env-arg`` overrides the env config of the 'on' arm only; ``--all-arms-arg``
overrides it in every arm (``--all-arms-arg group_size=4`` compares both arms with groups of 4)::

    python benchmarks/bench_difficulty_filter.py --groups 900 --difficulty 2
    python benchmarks/bench_difficulty_filter.py --groups 900 --model runs/x/checkpoints/final
    python benchmarks/bench_difficulty_filter.py --groups 300 --difficulty 4 --model runs/x/checkpoints/final \
        --arms off,on,signal --env-arg item_filter.screen=8
    python benchmarks/bench_difficulty_filter.py --groups 300 --difficulty 4 --model runs/x/checkpoints/final \
        --arms off,on --env-arg item_filter.screen=8 --env-arg item_filter.screen_signal=features

A fixed policy is the filter's hard case for all-failed items (they never become learnable)
and its easy case for all-solved ones (they never stop being solved); a training run moves
items between the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def signal_fifths(pairs: list[tuple[float, int, int]]) -> list[dict[str, Any]]:
    """The screen's signal against what groups did, by fifths of the signal.

    Args:
        pairs: ``(answer log-prob in nats, replies solved, replies)`` per group.

    Returns:
        Per fifth, lowest signal first: the range of ``exp(signal)``, the share of replies
        solved and the share of groups that came back all-same.
    """
    import math

    ranked = sorted(pairs)
    size = len(ranked) // 5
    fifths = []
    for index in range(5):
        part = ranked[index * size:(index + 1) * size]
        if not part:
            continue
        fifths.append({
            "answer_probability": [float(f"{math.exp(part[0][0]):.2g}"), float(f"{math.exp(part[-1][0]):.2g}")],
            "solved_share": round(sum(p[1] for p in part) / sum(p[2] for p in part), 3),
            "all_same_share": round(sum(p[1] in (0, p[2]) for p in part) / len(part), 3)})
    return fifths


async def sample(base_url: str, model_dir: str, difficulty: int, groups: int, concurrency: int,
                 window: int, filtered: bool, overrides: dict[str, Any],
                 signal: bool = False) -> dict[str, Any]:
    """Sample ``groups`` groups through ``run_item``; return the counts (see module docstring).

    With ``signal``, also the screen's signal of every (unscreened) item against its group
    (:func:`signal_fifths`).
    """
    from atroposlib.env_runtime.filtering import ItemFilter, next_item
    from atroposlib.env_runtime.step import run_item
    from atroposlib.environments.arithmetic_server import ArithmeticEnv
    from atroposlib.envs.helpers import default_server
    from atroposlib.utils.flags import merge_sections

    config, _ = ArithmeticEnv.config_init()
    values = merge_sections(config.model_dump(), {
        "difficulty": difficulty, "group_size": 8, "use_wandb": False, "tokenizer_name": model_dir,
        "item_filter": {"enabled": filtered}}, type(config))
    config = type(config)(**merge_sections(values, overrides, type(config)))
    env = ArithmeticEnv(config, [default_server(base_url=base_url, model_name="smollm2")])
    await env.setup()
    chooser = ItemFilter.for_env(env)
    kinds: list[str] = []  # per group in finishing order: solved / failed / mixed
    lock = asyncio.Lock()

    async def worker() -> None:
        while True:
            async with lock:
                if started[0] >= groups:
                    return
                started[0] += 1
                item = await next_item(env, chooser)
            answer_logprob = await env.answer_logprob(item) if signal else None
            outcome = await run_item(env, item, check_length=False)
            if answer_logprob is not None and outcome.scores:
                scores = outcome.scores[0]
                pairs.append((answer_logprob, sum(x >= 1.0 for x in scores), len(scores)))
            if chooser:
                chooser.note(item, outcome.scores)
            for scores in outcome.scores:
                same = len(set(scores)) == 1
                kinds.append(("solved" if scores[0] >= 1.0 else "failed") if same else "mixed")

    started = [0]
    pairs: list[tuple[float, int, int]] = []
    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.monotonic() - began
    await env.server.aclose()
    dropped = [k != "mixed" for k in kinds]
    windows = [round(sum(dropped[i:i + window]) / len(dropped[i:i + window]), 3)
               for i in range(0, len(dropped), window)]
    return {"filter": filtered, "groups": len(kinds), "solved": kinds.count("solved"),
            "failed": kinds.count("failed"), "mixed": kinds.count("mixed"),
            "dropped_share": round(sum(dropped) / max(1, len(dropped)), 3),
            "dropped_share_by_window": windows, "window": window,
            "skipped_items": int(env.stats.get("difficulty_skipped", 0)),
            "screened_items": int(env.stats.get("difficulty_screened", 0)),
            "screen_warmup_items": int(env.stats.get("difficulty_screen_warmup", 0)),
            "screen_calibration": {key: env.stats[f"difficulty_screen_{key}"]
                                   for key in ("predicted", "observed", "logloss")
                                   if f"difficulty_screen_{key}" in env.stats},
            "seconds": round(seconds, 1), "group_size": int(config.group_size),
            **({"signal_by_fifth": signal_fifths(pairs)} if signal else {}),
            "settings": {"item_filter": config.item_filter.model_dump()}}


def arm_overrides(arm: str, env_args: list[str], all_arms_args: list[str]) -> dict[str, Any]:
    """The env config overrides of one arm: ``all_arms_args``, then (the 'on' arm only) ``env_args``.

    Args:
        arm: ``off``, ``on`` or ``signal``.
        env_args, all_arms_args: ``KEY=VALUE`` strings; each value is read as YAML (``4`` an
            int, ``true`` a bool, ``best`` a string).

    Returns:
        ``{key: value}``; an ``env_args`` key wins over the same key in ``all_arms_args``. A
        dotted key sets a field of a nested section: ``item_filter.screen=8`` gives
        ``{"item_filter": {"screen": 8}}``.

    Raises:
        ValueError: an argument has no ``=``.
    """
    import yaml

    def parse(items: list[str]) -> dict[str, Any]:
        bad = [a for a in items if "=" not in a]
        if bad:
            raise ValueError(f"expected KEY=VALUE, got {bad[0]!r} (e.g. group_size=4)")
        out: dict[str, Any] = {}
        for key, value in (a.split("=", 1) for a in items):
            *sections, name = key.split(".")
            target = out
            for section in sections:
                target = target.setdefault(section, {})
            target[name] = yaml.safe_load(value)
        return out

    common, own = parse(all_arms_args), parse(env_args) if arm == "on" else {}
    return {**common, **own, **{k: {**common[k], **v} for k, v in own.items()
                                if isinstance(v, dict) and isinstance(common.get(k), dict)}}


def _env_seed(overrides: dict[str, dict[str, Any]]) -> int:
    """The arithmetic env's seed in the arms (an ``--all-arms-arg seed=N`` overrides the default)."""
    from atroposlib.environments.arithmetic_server import ArithmeticEnvConfig

    return int(overrides["off"].get("seed", ArithmeticEnvConfig().seed))


def main(argv: list[str] | None = None) -> int:
    """Start vLLM on the policy, run both arms, print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=900, help="groups sampled per arm")
    parser.add_argument("--difficulty", type=int, default=2, help="arithmetic difficulty")
    parser.add_argument("--model", default=None, help="policy directory (default: the bundled model)")
    parser.add_argument("--concurrency", type=int, default=8, help="groups in flight")
    parser.add_argument("--window", type=int, default=100, help="groups per reported window")
    parser.add_argument("--arms", default="off,on", help="comma-separated: off, on, signal (off, "
                        "plus the screen's signal of each item against its group, by fifths)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an env config override for the 'on' arm, e.g. item_filter.floor=0.1")
    parser.add_argument("--all-arms-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an env config override for every arm, e.g. group_size=4")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_difficulty_filter_<date>.json)")
    args = parser.parse_args(argv)
    from benchmarks.results import command_argv, default_result_path, write_result

    args.json_out = args.json_out or default_result_path("bench_difficulty_filter")
    from atroposlib.inference.bundled import prepare_bundled_model
    from atroposlib.inference.sizing import size_for_training
    from atroposlib.inference.vllm_process import DEFAULT_CPU_BLOCK_SIZE, VLLMProcess

    try:
        overrides = {arm: arm_overrides(arm, args.env_arg, args.all_arms_arg)
                     for arm in ("off", "on", "signal")}
    except ValueError as exc:
        parser.error(str(exc))
    model = str(args.model or prepare_bundled_model())
    sizing = size_for_training(model, "bfloat16", 16, 256, 512, DEFAULT_CPU_BLOCK_SIZE)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    vllm = VLLMProcess(model, dtype="bfloat16", max_model_len=512, kv_cache_bytes=sizing.kv_cache_bytes,
                       max_num_seqs=sizing.max_num_seqs, log_path=args.json_out.with_suffix(".vllm.log"))
    results = []
    with vllm:
        for arm in [a.strip() for a in args.arms.split(",") if a.strip()]:
            result = asyncio.run(sample(vllm.base_url, model, args.difficulty, args.groups,
                                        args.concurrency, args.window, arm == "on",
                                        overrides.get(arm, {}), signal=arm == "signal"))
            result.update(model=model, difficulty=args.difficulty)
            print(json.dumps(result), flush=True)
            results.append(result)
    write_result(args.json_out, "bench_difficulty_filter", {"arms": results},
                 seeds={"env.seed": _env_seed(overrides), "vLLM sampling": "unseeded"}, argv=command_argv(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
