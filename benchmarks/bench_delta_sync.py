"""Delta weight sync against the local reload, on real trainer steps of the bundled model.

Two policies, as the trainer exports them (``reload_tensors``: bf16, only what training changes):

* ``lora``: the quickstart (``configs/quickstart-cpu.yaml``): LoRA r=16 on the top 10 of 30
  layers, lr 3e-4; pushes carry the 10 merged blocks.
* ``full``: a full fine-tune of all layers (every tensor trainable), lr 6e-5.

Each policy takes ``--steps`` AdamW steps (bf16 autocast, a language-model loss on random
tokens, 4 x 64 tokens); after each, the same tensors go to one bf16 vLLM (dev mode, atroposlib's
worker extension) twice: as a delta (``LocalVLLM``, ``weight_sync_encoding: auto``) and as a
full reload (``encoding: full``, today's path), so both land on the same weights. Recorded per
step: bytes and seconds of both, the changed fraction, the step's own seconds, and the sizes
of the three delta formats (index, xor, auto) with their encode seconds.

Ratios printed: delta bytes / full bytes (goal <= 5%), delta seconds / reload seconds (goal <=
1.0x), delta seconds / (step + delta seconds) (goal <= 10%). Usage::

    flock /tmp/atropos-heavy.lock python benchmarks/bench_delta_sync.py --steps 3
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

POLICIES = {"lora": {"lr": 3e-4, "lora_r": 16, "lora_alpha": 32, "last_layers": 10},
            "full": {"lr": 6e-5, "lora_r": None, "lora_alpha": None, "last_layers": None}}


def make_policy(model_dir: str, name: str):
    from transformers import AutoModelForCausalLM

    from example_trainer.config import TrainerConfig
    from example_trainer.lora import apply_lora

    spec = POLICIES[name]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if spec["lora_r"]:
        model = apply_lora(model, r=spec["lora_r"], alpha=spec["lora_alpha"], dropout=0.0,
                           target_modules=TrainerConfig(lora_r=16).lora_target_modules,
                           last_layers=spec["last_layers"])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="trainer steps per policy")
    parser.add_argument("--policies", default="lora,full")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)

    from atroposlib.inference.bundled import prepare_bundled_model
    from atroposlib.inference.vllm_process import VLLMProcess
    from atroposlib.inference.weights.local_vllm import LocalVLLM
    from atroposlib.inference.weights.select import unique_storage

    torch.set_num_threads(1)
    model_dir = str(prepare_bundled_model())
    tmp = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    process = VLLMProcess(model_dir, served_model_name="smollm2", dtype="bfloat16", max_model_len=512,
                          env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=tmp / "vllm.log", dev_mode=True)
    process.start(timeout=900)
    results: dict[str, dict] = {}
    try:
        for name in args.policies.split(","):
            model, opt = make_policy(model_dir, name)
            generator = torch.Generator().manual_seed(0)
            delta_target = LocalVLLM(process, tmp / f"{name}-delta")
            full_target = LocalVLLM(process, tmp / f"{name}-full", encoding="full")
            train_step(model, opt, generator)
            previous = unique_storage(exported(model))
            first = delta_target.push(previous, 1)  # the full sync every run starts with
            rows = []
            for step in range(2, args.steps + 2):
                step_s = train_step(model, opt, generator)
                tensors = unique_storage(exported(model))
                fmt = formats(previous, tensors)
                d = delta_target.push(tensors, step)
                f = full_target.push(tensors, step)
                # the full reload put the same weights back: the delta target's base stays valid
                rows.append({"step": step, "step_seconds": step_s, "delta": d, "full": f,
                             "formats": fmt})
                print(f"[bench] {name} step {step}: {d['sync/path']} {d['sync/bytes'] / 2**20:.2f} MiB "
                      f"in {d['sync/seconds']:.2f} s (changed {d['sync/changed_fraction']:.3f}); full "
                      f"{f['sync/bytes'] / 2**20:.1f} MiB in {f['sync/seconds']:.2f} s; step "
                      f"{step_s:.2f} s", flush=True)
                previous = tensors
            adapter = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
            med = statistics.median
            summary = {
                "bytes_fraction": med(r["delta"]["sync/bytes"] / r["full"]["sync/bytes"] for r in rows),
                "seconds_vs_reload": med(r["delta"]["sync/seconds"] / r["full"]["sync/seconds"] for r in rows),
                "sync_share_of_step": med(r["delta"]["sync/seconds"] / (r["step_seconds"] + r["delta"]["sync/seconds"])
                                          for r in rows),
                "changed_fraction": med(r["delta"]["sync/changed_fraction"] for r in rows),
                "delta_paths": [r["delta"]["sync/path"] for r in rows],
                "trainer_copy_bytes": delta_target._servers.base.nbytes,
                "lora_adapter_fp32_bytes": adapter,
            }
            results[name] = {"first_full_sync": first, "rows": rows, "summary": summary}
            print(f"[bench] {name}: {summary}", flush=True)
            del model, opt
    finally:
        process.stop()
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_delta_sync"), "bench_delta_sync",
                 {"policies": results, "steps": args.steps},
                 seeds={"tokens": 0}, argv=command_argv(__file__, argv),
                 notes=["CPU only: vLLM bf16 on the 2-core box, shared with other sessions (timings "
                        "noisy). NCCL deltas never ran (no GPU).",
                        "Random-token LM loss stands in for the GRPO loss: the optimizer, lr, dtype "
                        "and exported tensors are the trainer's; changed fractions depend on them."])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
