"""Weight sync cost: hot reload vs restart of a real vLLM, measured in the same run, plus trainer tokens/s.

Starts one vLLM (bundled SmolLM2-135M, dev mode) through ``VLLMProcess``, then times
``--repeats`` syncs in each mode exactly as the trainer does them (``VLLMSync.sync``: save
safetensors, then ``reload_weights`` or ``restart``), checks the server answers after each, and
prints the restart/reload ratio. Finally times one fp32 GRPO step on CPU (tokens/s). Usage::

    python benchmarks/bench_weight_sync.py --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from example_trainer.config import TrainerConfig, default_model_dir
from example_trainer.data import TrainSequence, make_micro_batches
from example_trainer.grpo import load_policy
from example_trainer.loss import grpo_loss
from example_trainer.vllm_sync import VLLMSync


def generate_ok(base_url: str) -> None:
    response = httpx.post(f"{base_url}/completions", timeout=120, json={
        "model": "smollm2", "prompt": "1 + 1 =", "max_tokens": 2, "temperature": 0})
    response.raise_for_status()


def trainer_tokens_per_second(model, tokenizer, batch: int, seq_len: int) -> float:
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(batch):
        ids = torch.randint(0, len(tokenizer), (seq_len,), generator=g).tolist()
        seqs.append(TrainSequence(ids[:-1], ([-100] * 40 + ids[40:])[1:], [1.0 - 2 * (i % 2)] * (seq_len - 1),
                                  [float("nan")] * (seq_len - 1), None, 1.0, 0.0))
    mbs = make_micro_batches(seqs, 16, 0, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    times = []
    for _ in range(2):  # first = warm-up
        begin = time.perf_counter()
        for mb in mbs:
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            grpo_loss(logits, mb.labels, mb.advantages, mb.sampler_logprobs, num_sequences=batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - begin)
    return batch * seq_len / times[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=default_model_dir())
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vllm-dtype", default="float32")
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    model, tokenizer = load_policy(args.model, torch.device("cpu"), torch.float32, "eager")
    config = TrainerConfig(model=args.model, vllm_dtype=args.vllm_dtype, weight_sync="reload")
    sync = VLLMSync(config, run_dir)
    print(f"starting vLLM ({args.vllm_dtype}) ...", flush=True)
    print(f"vLLM start: {sync.start():.1f} s", flush=True)
    results: dict[str, list[tuple[float, float]]] = {"reload": [], "restart": []}
    try:
        for mode in ("reload", "restart"):
            config.weight_sync = mode
            for _ in range(args.repeats):
                metrics = sync.sync(model, tokenizer)
                generate_ok(sync.base_url)
                results[mode].append((metrics["sync/save_seconds"], metrics["sync/update_seconds"]))
                print(f"{mode}: save {metrics['sync/save_seconds']:.2f} s + update "
                      f"{metrics['sync/update_seconds']:.2f} s", flush=True)
    finally:
        sync.stop()
        sync.cleanup()
    total = {m: statistics.median(s + u for s, u in rows) for m, rows in results.items()}
    print(f"median sync: reload {total['reload']:.2f} s, restart {total['restart']:.2f} s "
          f"-> reload is {total['restart'] / total['reload']:.1f}x faster")
    tps = trainer_tokens_per_second(model, tokenizer, 16, 64)
    print(f"trainer fp32 CPU: {tps:.0f} tokens/s (16x64 tokens, full model, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
