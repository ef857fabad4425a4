"""Delta weight sync against the local reload, on real trainer steps of the bundled model.

Three policies, as the trainer exports them (``reload_tensors``: bf16, only what training changes):

* ``lora``: the quickstart (``configs/quickstart-cpu.yaml``): LoRA r=16 on the top 10 of 30
  layers, lr 3e-4; pushes carry the 10 merged blocks.
* ``full``: a full fine-tune of all layers (every tensor trainable), lr 6e-5 (the quickstart's
  full fine-tune rate).
* ``full-rl``: the same at lr 1e-6, the rate RL runs on 1B+ models commonly use (and the
  regime of PULSE, arXiv 2602.03839, where about 1% of bf16 weights change per step): how
  many bytes a delta takes where few elements change.

Each policy takes ``--steps`` AdamW steps (bf16 autocast, a language-model loss on random
tokens, 4 x 64 tokens); after each, the same tensors go to one bf16 vLLM (dev mode, atroposlib's
worker extension, launched as the trainer launches it for ``weight_sync: reload``) twice: as a
delta (``LocalVLLM``, ``weight_sync_encoding: auto``) and as a full reload (``encoding: full``,
today's path), so both land on the same weights. Recorded per step: bytes and seconds of both,
the changed fraction, the step's own seconds, and the sizes of the three delta formats (index,
xor, auto) with their encode seconds.

The ``lora`` policy has a third arm: the adapter push (``weight_sync: lora``, what ``auto``
picks for this run on a GPU build of vLLM): :class:`~example_trainer.vllm_sync.VLLMSync`
launches a second, LoRA-enabled vLLM serving the base as ``smollm2-base`` and the adapter as
``smollm2`` and hot-loads each step's adapter from a new folder (``AdapterPush``). After the last
step a fixed sampling load (:mod:`benchmarks.sampling_load`: 32 requests x 48 tokens,
temperature 1) runs through the plain vLLM (the merged weights of that step), the adapter
name, and the LoRA server's base name, one at a time.

Ratios printed, per arm: pushed bytes / full bytes (goal <= 5%), push seconds / reload seconds
(goal <= 1.0x), push seconds / (step + push seconds) (goal <= 10%). Usage::

    flock /tmp/atropos-heavy.lock python benchmarks/bench_delta_sync.py --steps 3 \\
        --json-out benchmarks/results/bench_delta_sync_2026-12-07b.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
    sys.path.insert(0, str(ROOT))

#: lr and LoRA rank per policy (None: full fine-tune); a LoRA policy's adapters are placed as the
#: quickstart's (:func:`~benchmarks.learning.ours.lora_placement`)
POLICIES = {"lora": {"lr": 3e-4, "lora_r": 16},
            "full": {"lr": 6e-5, "lora_r": None},
            "full-rl": {"lr": 1e-6, "lora_r": None}}


def make_policy(model_dir: str, name: str):
    from transformers import AutoModelForCausalLM

    from benchmarks.learning.ours import lora_placement
    from example_trainer.lora import apply_lora

    spec = POLICIES[name]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if spec["lora_r"]:
        model = apply_lora(model, **lora_placement(spec["lora_r"]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec["lr"])
    return model, opt


def train_step(model, opt, generator) -> float:
    ids = torch.randint(0, 49152, (4, 64), generator=generator)
    begin = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - begin


def exported(model) -> dict[str, torch.Tensor]:
    from example_trainer.weight_export import reload_tensors

    _, tensors = reload_tensors(model, None, only_trained=True, dtype_name="bfloat16", snapshot=True)
    return tensors


def formats(old, new) -> dict[str, dict[str, float]]:
    from atroposlib.inference.weights import delta

    out = {}
    for enc in delta.ENCODINGS:
        payload, stats = delta.encode(old, new, base_version=0, version=1, encoding=enc)
        out[enc] = {"bytes": stats.nbytes, "encode_seconds": stats.seconds}
    return out


def bench_config(model_dir: str, policy: str, **overrides):
    """The quickstart's trainer settings for ``policy`` that size and name the vLLM it launches.

    bf16 vLLM, 512-token context, batches of 16 x 96 tokens (so ``--max-num-seqs`` 64) and a
    1 GiB KV cache, served as ``smollm2``; ``weight_sync: auto``.
    """
    from benchmarks.learning.ours import lora_placement
    from example_trainer.config import TrainerConfig

    spec = POLICIES[policy]
    placement = lora_placement(spec["lora_r"]) if spec["lora_r"] else None
    lora = {"lora_r": placement["r"], "lora_alpha": placement["alpha"],
            "train_last_layers": placement["last_layers"]} if placement else {}
    return TrainerConfig(model=model_dir, batch_size=16, max_token_len=96, vllm_dtype="bfloat16",
                         vllm_max_model_len=512, vllm_kv_cache_gib=1.0, served_model_name="smollm2",
                         lr=spec["lr"], **lora, **overrides)


def start_adapter_server(model_dir: str, model, run_dir: Path):
    """The adapter arm: the trainer's :class:`VLLMSync` on a ``weight_sync: lora`` run, started.

    Returns:
        ``(sync, choice)``: the started sync (its vLLM serves the adapter as ``smollm2``) and
        the :class:`~example_trainer.sync_choice.SyncChoice` as a dict (mode, both byte counts).

    Raises:
        RuntimeError: ``auto`` on a GPU build would not pick ``lora`` for this run (the reason is
            in the message).
    """
    from example_trainer.sync_choice import choose_weight_sync
    from example_trainer.vllm_sync import VLLMSync

    # what auto picks by bytes on a GPU build (a CPU build keeps the reload, whatever the bytes)
    choice = choose_weight_sync(bench_config(model_dir, "lora"), model, managed=True, cpu_build=False)
    if choice.mode != "lora":
        raise RuntimeError(f"weight_sync auto chose {choice.why!r}, not the adapter push")
    sync = VLLMSync(bench_config(model_dir, "lora", vllm_start_timeout=900.0, weight_sync="lora"), run_dir)
    sync.start(model)
    return sync, {"mode": choice.mode, "adapter_bytes": choice.adapter_bytes,
                  "merged_bytes": choice.merged_bytes, "why": choice.why}


def run_policy(name: str, model_dir: str, process, tmp: Path, steps: int) -> dict:
    """``steps`` trainer steps of ``name``, each pushed as a delta, a full reload and (lora) the adapter."""
    from atroposlib.inference.weights.local_vllm import LocalVLLM
    from atroposlib.inference.weights.select import unique_storage
    from benchmarks.docs_sync import push_ratios
    from benchmarks.sampling_load import sampling_load

    model, opt = make_policy(model_dir, name)
    generator = torch.Generator().manual_seed(0)
    delta_target = LocalVLLM(process, tmp / f"{name}-delta")
    full_target = LocalVLLM(process, tmp / f"{name}-full", encoding="full")
    adapters, choice, out = None, None, {}
    try:
        if POLICIES[name]["lora_r"]:
            adapters, choice = start_adapter_server(model_dir, model, tmp / "adapter-run")
            print(f"[bench] {name}: adapter arm: {choice['why']}", flush=True)
        train_step(model, opt, generator)
        previous = unique_storage(exported(model))
        first = delta_target.push(previous, 1)  # the full sync every run starts with
        if adapters is not None:
            out["first_adapter_push"] = adapters.sync(model, None, version=1)
        rows = []
        for step in range(2, steps + 2):
            step_s = train_step(model, opt, generator)
            tensors = unique_storage(exported(model))
            fmt = formats(previous, tensors)
            d = delta_target.push(tensors, step)
            f = full_target.push(tensors, step)
            # the full reload put the same weights back: the delta target's base stays valid
            row = {"step": step, "step_seconds": step_s, "delta": d, "full": f, "formats": fmt}
            line = (f"[bench] {name} step {step}: {d['sync/path']} {d['sync/bytes'] / 2**20:.2f} MiB "
                    f"in {d['sync/seconds']:.2f} s (changed {d['sync/changed_fraction']:.3f}); full "
                    f"{f['sync/bytes'] / 2**20:.1f} MiB in {f['sync/seconds']:.2f} s")
            if adapters is not None:
                row["adapter"] = a = adapters.sync(model, None, version=step)
                line += f"; adapter {a['sync/bytes'] / 2**20:.2f} MiB in {a['sync/seconds']:.2f} s"
            rows.append(row)
            print(f"{line}; step {step_s:.2f} s", flush=True)
            previous = tensors
        adapter = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
        summary = {
            **push_ratios(rows, "delta"),
            "changed_fraction": statistics.median(r["delta"]["sync/changed_fraction"] for r in rows),
            "delta_paths": [r["delta"]["sync/path"] for r in rows],
            "trainer_copy_bytes": delta_target._servers.base.nbytes,
            "lora_adapter_fp32_bytes": adapter,
        }
        out.update({"spec": POLICIES[name], "first_full_sync": first, "rows": rows, "summary": summary})
        if adapters is not None:
            out["adapter"] = {**push_ratios(rows, "adapter"), "choice": choice,
                              "paths": [r["adapter"]["sync/path"] for r in rows]}
            print(f"[bench] {name} adapter: {out['adapter']}", flush=True)
            # the plain vLLM holds this step's merged weights; the adapter server this step's adapter
            out["sampling"] = {
                "plain_merged": sampling_load(process.base_url, "smollm2"),
                "adapter": sampling_load(adapters.base_url, "smollm2"),
                "lora_server_base": sampling_load(adapters.base_url, "smollm2-base"),
            }
            print(f"[bench] {name} sampling tokens/s: "
                  + ", ".join(f"{k} {v['tokens_per_second']:.1f}" for k, v in out["sampling"].items()),
                  flush=True)
        print(f"[bench] {name}: {summary}", flush=True)
    finally:
        if adapters is not None:
            adapters.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="trainer steps per policy")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"from {', '.join(POLICIES)}")
    parser.add_argument("--json-out", default=None, help="result file (default: dated, in benchmarks/results)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.policies.split(",")) - set(POLICIES))
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)}")

    from atroposlib.inference.bundled import prepare_bundled_model
    from example_trainer.vllm_sync import vllm_process

    torch.set_num_threads(1)
    model_dir = str(prepare_bundled_model())
    tmp = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    process = vllm_process(bench_config(model_dir, "full"), tmp / "vllm.log", "reload")
    process.start(timeout=900)
    results: dict[str, dict] = {}
    try:
        for name in args.policies.split(","):
            results[name] = run_policy(name, model_dir, process, tmp, args.steps)
    finally:
        process.stop()
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_delta_sync"), "bench_delta_sync",
                 {"policies": results, "steps": args.steps},
                 seeds={"tokens": 0}, argv=command_argv(__file__, argv),
                 notes=["CPU only: vLLM bf16 on the 2-core box, shared with other sessions (timings "
                        "noisy). NCCL deltas never ran (no GPU).",
                        "Random-token LM loss stands in for the GRPO loss: the optimizer, lr, dtype "
                        "and exported tensors are the trainer's; changed fractions depend on them.",
                        "Adapter arm: a second vLLM (--enable-lora, as the trainer launches it for "
                        "weight_sync lora) runs beside the plain one; sampling loads run one at a time.",
                        "Adapter bytes are the adapter's safetensors files (fp32, as peft saves them); "
                        "full bytes are the merged blocks at bf16."])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
