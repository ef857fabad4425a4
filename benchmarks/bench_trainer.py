"""Trainer throughput on CPU/CUDA: one GRPO optimizer step on a synthetic batch of the bundled model.

Prints tokens/s and seconds per step for each setting, and ratios against the first setting
(the baseline) measured in the same run. Usage::

    python benchmarks/bench_trainer.py --batch-size 32 --seq-len 64 --micro-batch-size 16 --repeats 2
"""

from __future__ import annotations

import argparse
import time

import torch

from example_trainer.config import default_model_dir
from example_trainer.data import TrainSequence, make_micro_batches
from example_trainer.grpo import freeze_all_but_last_layers, load_policy
from example_trainer.loss import grpo_loss


def synthetic(batch_size: int, seq_len: int, prompt_len: int, vocab: int) -> list[TrainSequence]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(batch_size):
        ids = torch.randint(0, vocab, (seq_len,), generator=g).tolist()
        labels = [-100] * prompt_len + ids[prompt_len:]
        out.append(TrainSequence(ids[:-1], labels[1:], [1.0 if i % 2 else -1.0] * (seq_len - 1),
                                 [float("nan")] * (seq_len - 1), None, 1.0, float(i % 2)))
    return out


def one_step(model, optimizer, micro_batches, n) -> float:
    begin = time.perf_counter()
    for mb in micro_batches:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        grpo_loss(logits, mb.labels, mb.advantages, mb.old_logprobs, num_sequences=n).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=default_model_dir())
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", default="2,1", help="comma-separated torch thread counts")
    parser.add_argument("--attn", default="eager,sdpa")
    parser.add_argument("--last-layers", default="0", help="comma-separated; 0 = train all layers")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    settings = [(a, int(n)) for a in args.attn.split(",") for n in args.last_layers.split(",")]
    for attn, last in settings:
        model, tok = load_policy(args.model, device, dtype, attn)
        if last:
            freeze_all_but_last_layers(model, last)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7)
        seqs = synthetic(args.batch_size, args.seq_len, args.prompt_len, len(tok))
        mbs = [mb.to(device) for mb in make_micro_batches(seqs, args.micro_batch_size, 0, 16)]
        tokens = sum(int(mb.attention_mask.sum()) for mb in mbs)
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            one_step(model, optimizer, mbs, len(seqs))  # warm-up (first call allocates)
            times = [one_step(model, optimizer, mbs, len(seqs)) for _ in range(args.repeats)]
            best = min(times)
            name = f"{attn} threads={threads} layers={last or 'all'}"
            rows.append((name, best, tokens / best))
            print(f"{name}: {best:.2f} s/step, {tokens / best:.0f} tokens/s "
                  f"({args.batch_size}x{args.seq_len} tokens, micro {args.micro_batch_size})", flush=True)
    base = rows[0][1]
    for name, secs, _ in rows:
        print(f"ratio {name} vs {rows[0][0]}: {base / secs:.2f}x speed")


if __name__ == "__main__":
    main()
