"""What a checkpoint costs: save seconds and bytes against one training step, measured in the same run.

Loads the bundled SmolLM2-135M, then for each training setup (full model, the quickstart's last
10 layers, LoRA r=16) runs two GRPO steps (the second timed) and saves two checkpoints exactly
as ``atropos-grpo`` does (weights or adapter + optimizer state + RNG, written to a hidden
directory and renamed), and prints the median save time as a multiple of a step. This is what
``--checkpoint-interval``'s default is chosen from. Usage::

    python benchmarks/bench_checkpoint.py --batch 16 --seq-len 64
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from example_trainer import checkpoint as ckpt_io
from example_trainer import lora
from example_trainer.config import default_model_dir
from example_trainer.data import TrainSequence, make_micro_batches
from example_trainer.grpo import freeze_all_but_last_layers, load_policy
from example_trainer.loss import grpo_loss
from example_trainer.vllm_sync import save_weights

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
    sys.path.insert(0, str(ROOT))

SETUPS = ("full", "last10", "lora16")


def step_seconds(model, tokenizer, optimizer, batch: int, seq_len: int) -> float:
    """Seconds of one GRPO step (forward, backward, AdamW) on random tokens; the first is a warm-up."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(batch):
        ids = torch.randint(0, len(tokenizer), (seq_len,), generator=g).tolist()
        seqs.append(TrainSequence(ids[:-1], ([-100] * (seq_len // 2) + ids[seq_len // 2:])[1:],
                                  [1.0 - 2 * (i % 2)] * (seq_len - 1), [float("nan")] * (seq_len - 1),
                                  None, 1.0, 0.0))
    times = []
    for _ in range(2):
        begin = time.perf_counter()
        for mb in make_micro_batches(seqs, batch, 0, 16):
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            grpo_loss(logits, mb.labels, mb.advantages, mb.sampler_logprobs, num_sequences=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - begin)
    return times[-1]


def save_seconds(model, tokenizer, optimizer, out: Path) -> tuple[float, int]:
    """Seconds and bytes of one checkpoint written as the trainer writes ``step_<k>``."""
    def write_weights(directory: Path) -> None:
        if lora.is_lora(model):
            lora.save_adapter(model, directory / "adapter", None)
            return
        save_weights(model, tokenizer, directory, True)

    begin = time.perf_counter()
    ckpt_io.save_checkpoint(out, step=1, model=model, optimizer=optimizer, write_weights=write_weights,
                            lora=lora.is_lora(model))
    seconds = time.perf_counter() - begin
    return seconds, sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=default_model_dir())
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS)
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_checkpoint_<date>.json)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    rows = []
    try:
        for setup in args.setups:
            model, tokenizer = load_policy(args.model, torch.device("cpu"), torch.float32, "eager")
            if setup == "last10":
                freeze_all_but_last_layers(model, 10)
            if setup == "lora16":
                model = lora.apply_lora(model, r=16, alpha=32, dropout=0.0, last_layers=None,
                                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                        "gate_proj", "up_proj", "down_proj"])
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7)
            step = step_seconds(model, tokenizer, optimizer, args.batch, args.seq_len)
            saves = [save_seconds(model, tokenizer, optimizer, root / setup / f"step_{i}") for i in range(2)]
            save = statistics.median(s for s, _ in saves)
            rows.append({"setup": setup, "step_seconds": step, "save_seconds": [s for s, _ in saves],
                         "save_bytes": [b for _, b in saves], "median_save_seconds": save,
                         "save_in_steps": save / step, "threads": torch.get_num_threads()})
            print(f"{setup}: step {step:.2f} s ({args.batch}x{args.seq_len} tokens, "
                  f"{torch.get_num_threads()} threads), save {save:.2f} s = {save / step:.2f} steps, "
                  f"{saves[0][1] / 2**20:.0f} MiB per checkpoint", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    from benchmarks.results import default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_checkpoint"), "bench_checkpoint",
                 {"settings": {"model": str(args.model), "batch": args.batch, "seq_len": args.seq_len},
                  "rows": rows}, seeds={"batch": 0})


if __name__ == "__main__":
    main()
