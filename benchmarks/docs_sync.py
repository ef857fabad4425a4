"""``make bench-docs`` renderer for the weight-sync benchmark: delta, full reload and adapter pushes.

It takes the JSON payload of ``bench_delta_sync``'s result file and returns the markdown of one
block of ``docs/benchmarks.md`` (see :mod:`benchmarks.bench_docs`): each push's bytes and seconds
per step against the three goals of issue 50, whether each goal is met, and the sampling load's
tokens/s through the adapter against the merged weights.
"""

from __future__ import annotations

import statistics

from benchmarks.docs_tables import source, table

#: ``flock /tmp/atropos-heavy.lock python benchmarks/bench_delta_sync.py --steps 3
#: --json-out benchmarks/results/bench_delta_sync_2026-12-07b.json``
DELTA_SYNC = "bench_delta_sync_2026-12-07b.json"

#: issue 50's goals: pushed bytes / full bytes, push seconds / reload seconds, push share of the step
BYTES_GOAL, SECONDS_GOAL, SHARE_GOAL = 0.05, 1.0, 0.10

_POLICY = {"lora": "quickstart LoRA", "full": "full fine-tune", "full-rl": "full fine-tune"}
_ARM = {"delta": "delta", "adapter": "adapter (auto on a GPU)", "full": "full reload"}
_SERVER = {"plain_merged": ("plain vLLM, merged weights", "smollm2"),
           "adapter": ("`--enable-lora` vLLM, the adapter", "smollm2"),
           "lora_server_base": ("`--enable-lora` vLLM, the base (no adapter)", "smollm2-base")}


def _arms(rows: list[dict]) -> list[str]:
    arms = ["delta", "adapter"] if rows and "adapter" in rows[0] else ["delta"]
    return [*arms, "full"]


def push_ratios(rows: list[dict], arm: str) -> dict[str, float]:
    """Medians over steps of ``arm``'s bytes / full bytes, seconds / reload seconds, share of the step.

    Args:
        rows: bench_delta_sync's per-step rows, each with a ``full`` push, ``arm``'s push and
            ``step_seconds``.
        arm: ``delta``, ``adapter`` or ``full``.

    Returns:
        ``bytes_fraction``, ``seconds_vs_reload`` and ``sync_share_of_step`` (seconds / (step +
        seconds)).
    """
    med = statistics.median
    return {
        "bytes_fraction": med(r[arm]["sync/bytes"] / r["full"]["sync/bytes"] for r in rows),
        "seconds_vs_reload": med(r[arm]["sync/seconds"] / r["full"]["sync/seconds"] for r in rows),
        "sync_share_of_step": med(r[arm]["sync/seconds"] / (r["step_seconds"] + r[arm]["sync/seconds"])
                                  for r in rows),
    }


def _goal_sentence(what: str, goal: str, results: list[tuple[str, float, bool]], fmt: str) -> str:
    met = [f"{label} ({fmt.format(value)})" for label, value, ok in results if ok]
    missed = [f"{label} ({fmt.format(value)})" for label, value, ok in results if not ok]
    parts = []
    if met:
        parts.append("met by " + ", ".join(met))
    if missed:
        parts.append("not met by " + ", ".join(missed))
    return f"- {what} (goal {goal}): " + "; ".join(parts) + "."


def delta_sync_table(payload: dict) -> str:
    """bench_delta_sync: bytes, seconds and goals of each push per policy, and the sampling load."""
    med = statistics.median
    rows, goals, changed = [], [], []
    for policy, result in payload["policies"].items():
        steps = result["rows"]
        label = _POLICY.get(policy, policy) + (f", lr {result['spec']['lr']:g}" if "spec" in result else "")
        changed.append(f"{label} {med(r['delta']['sync/changed_fraction'] for r in steps):.1%}")
        for arm in _arms(steps):
            nbytes = med(r[arm]["sync/bytes"] for r in steps)
            seconds = med(r[arm]["sync/seconds"] for r in steps)
            frac, vs_reload, share = push_ratios(steps, arm).values()
            rows.append([label, _ARM[arm], f"{nbytes / 2**20:.2f}", f"{frac:.1%}",
                         f"{seconds:.2f}", f"{vs_reload:.2f}x", f"{share:.1%}",
                         f"{med(r['step_seconds'] for r in steps):.2f}"])
            if arm != "full":
                goals.append((f"{label} {arm}", frac, vs_reload, share))
    text = table(["policy", "push", "MiB per step", "of a full sync", "seconds", "vs the reload",
                  "share of the step", "step seconds"], rows)
    text += ("\n\nMedians over " + str(payload["steps"]) + " steps per policy; the first sync of each "
             "run (always full) is left out. Goals:\n\n")
    text += "\n".join([
        _goal_sentence("bytes per step as a share of a full sync", f"<= {BYTES_GOAL:.0%}",
                       [(label, b, b <= BYTES_GOAL) for label, b, _, _ in goals], "{:.1%}"),
        _goal_sentence("seconds per step against the full reload", f"<= {SECONDS_GOAL:.1f}x",
                       [(label, s, s <= SECONDS_GOAL) for label, _, s, _ in goals], "{:.2f}x"),
        _goal_sentence("sync seconds as a share of the step", f"<= {SHARE_GOAL:.0%}",
                       [(label, h, h <= SHARE_GOAL) for label, _, _, h in goals], "{:.1%}"),
    ])
    text += ("\n\nbf16 elements that changed per step (median), which a delta's size follows: "
             + ", ".join(changed) + ".")
    lora = payload["policies"].get("lora", {})
    if choice := (lora.get("adapter") or {}).get("choice"):
        text += (f"\n\nBy bytes `weight_sync: auto` picks the adapter push on a GPU build of vLLM: "
                 f"adapter {choice['adapter_bytes'] / 2**20:.2f} MiB (fp32, as peft saves it) against "
                 f"{choice['merged_bytes'] / 2**20:.2f} MiB of merged modules at bf16. On a CPU build "
                 "it keeps the merged reload, whatever the bytes: sampling through the adapter is "
                 "slower there (below).")
    if sampling := lora.get("sampling"):
        plain = sampling["plain_merged"]["tokens_per_second"]
        srows = []
        for key, (server, name) in _SERVER.items():
            if key in sampling:
                tps = sampling[key]["tokens_per_second"]
                srows.append([server, f"`{name}`", f"{tps:.1f}", f"{tps / plain:.2f}x"])
        load = sampling["plain_merged"]
        text += (f"\n\nSampling after the last step, {load['requests']} requests x {load['max_tokens']} "
                 f"tokens at temperature 1, the same prompts; median of {len(load['runs'])} runs "
                 "of the load, one server at a time:\n\n"
                 + table(["vLLM", "model name", "tokens/s", "vs the merged weights"], srows))
    return text + "\n\n" + source(DELTA_SYNC)


__all__ = ["BYTES_GOAL", "DELTA_SYNC", "SECONDS_GOAL", "SHARE_GOAL", "delta_sync_table", "push_ratios"]
