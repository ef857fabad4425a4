"""Trainer throughput on CPU/CUDA: one GRPO optimizer step on a synthetic batch of the bundled model.

Prints tokens/s and seconds per step for each setting, and ratios against the first setting
(the baseline) measured in the same run. Two kinds of settings::

    # in one process: attention kernels, torch threads, frozen layers, LM head over the
    # completion tail only, bf16 autocast (the quickstart's step: 16x80 tokens, top 10 layers)
    python benchmarks/bench_trainer.py --batch-size 32 --seq-len 64 --micro-batch-size 16 --repeats 2
    python benchmarks/bench_trainer.py --batch-size 16 --seq-len 80 --prompt-len 45 --micro-batch-size 16 \
        --attn eager --last-layers 10 --threads 1,2 --logits-tail 0,1 --mixed-precision no,bf16
    # the group's prompt once (groups of 8 sharing a 46-token prompt) against once per rollout
    python benchmarks/bench_trainer.py --batch-size 16 --seq-len 70 --prompt-len 46 --group-size 8 \
        --micro-batch-size 16 --attn eager --last-layers 10 --threads 1 --logits-tail 1 \
        --mixed-precision bf16 --shared-prefix 0,1 --repeats 3

    # the trainer's blockwise per-token log-probs against one float32 log-softmax over [B*T, V]
    python benchmarks/bench_trainer.py --batch-size 16 --seq-len 80 --prompt-len 45 --attn eager \
        --last-layers 10 --threads 2 --logits-tail 1 --mixed-precision bf16 --logprobs blockwise,full

    # a GPU with a Qwen2.5-0.5B-shaped model (random weights: the speed does not depend on their
    # values, and nothing is downloaded): model FLOPs utilisation against the card's bf16 peak and
    # the trainer's side of a weight sync (bf16 copy + safetensors write)
    python benchmarks/bench_trainer.py --model-shape qwen2.5-0.5b --batch-size 64 --seq-len 512 \
        --prompt-len 128 --group-size 8 --micro-batch-size 16 --attn sdpa --threads 8 \
        --logits-tail 0,1 --shared-prefix 0,1 --peak-tflops 989 --sync-repeats 3

    # across processes (torchrun, FSDP2; gloo on the CPU) and LoRA against full fine-tuning:
    # every setting trains the same batches; adds the peak memory of each process
    python benchmarks/bench_trainer.py --processes 1,2 --lora-r 0,8 --batch-size 8 --seq-len 48 \\
        --micro-batch-size 2 --json-out bench.json

Peak memory is the process's peak resident set (``ru_maxrss``: weights, optimizer state,
activations and the Python runtime) on the CPU, and ``torch.cuda.max_memory_allocated`` on GPUs
(reset for each setting). On a GPU each setting also counts the times one step made the CPU wait
for the GPU (``torch.cuda.set_sync_debug_mode``).
Sharded runs load the whole model on every rank's CPU before ``fully_shard`` splits it, so on the
CPU that peak includes one full copy of the weights per process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from example_trainer.config import default_model_dir
from example_trainer.data import TrainSequence, make_micro_batches
from example_trainer.grpo import freeze_all_but_last_layers, load_policy, policy_logits
from example_trainer.loss import grpo_loss

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
    sys.path.insert(0, str(ROOT))

#: Model shapes ``--model-shape`` builds with random weights, from the models' published configs.
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": {  # Qwen/Qwen2.5-0.5B-Instruct's config.json
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "hidden_act": "silu", "torch_dtype": "bfloat16"},
}


def shaped_model_dir(shape: str, tokenizer_dir: str, out_dir: Path) -> str:
    """Write a randomly initialised model of ``shape`` (a :data:`SHAPES` key) into ``out_dir``.

    The tokenizer files come from ``tokenizer_dir``; the benchmark's synthetic ids stay below
    its vocabulary, so a smaller tokenizer than the shape's vocabulary is fine. Returns the
    directory as a string for :func:`~example_trainer.grpo.load_policy`.
    """
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**SHAPES[shape])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out_dir)
    for f in Path(tokenizer_dir).iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json",
                                                         "vocab.json", "merges.txt"):
            shutil.copy(f, out_dir / f.name)
    return str(out_dir)


def attention_head_dim(config) -> int:
    """Width of one attention head: ``config.head_dim`` when set (Qwen3, Gemma: heads x width
    differs from the hidden size), else hidden size / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_matmul_params(config) -> int:
    """Weights of one decoder layer's matmuls (q, k, v, o and a gated MLP), biases and norms left
    out: the ``N / L`` of :func:`model_flops` for a Llama-shaped layer."""
    d, ff, head_dim = config.hidden_size, config.intermediate_size, attention_head_dim(config)
    q_and_o = 2 * d * config.num_attention_heads * head_dim
    k_and_v = 2 * d * config.num_key_value_heads * head_dim
    return q_and_o + k_and_v + 3 * d * ff


def model_flops(config, micro_batches, tail: bool) -> float:
    """Model FLOPs of one training step (forward + backward) over ``micro_batches``.

    PaLM's count (Chowdhery et al., 2022, "PaLM: Scaling Language Modeling with Pathways",
    Appendix B): ``6 N`` per token for the weight matmuls plus ``12 L H Q T`` for attention
    (``L`` layers, ``H`` heads of width ``Q``, ``T`` the padded sequence length). ``N`` here is the
    decoder's non-embedding parameters; the LM head's ``6 d V`` is counted on the positions it
    runs over (only the completion tail with ``tail``). Every real token counts, so the
    figure is the work of an unshared forward: with ``--shared-prefix`` the step does less
    work for the same tokens, and the utilisation it implies is an effective one.
    """
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, head_dim = config.num_attention_heads, attention_head_dim(config)
    per_layer = layer_matmul_params(config)
    flops = 0.0
    for mb in micro_batches:
        tokens = int(mb.attention_mask.sum())
        seq = mb.input_ids.shape[1]
        head_positions = mb.input_ids.shape[0] * (mb.trained_tail()[0] if tail else seq)
        flops += (6 * layers * per_layer * tokens + 12 * layers * heads * head_dim * seq * tokens
                  + 6 * d * vocab * head_positions)
    return flops


def sync_seconds(model, repeats: int) -> tuple[float, int]:
    """The trainer's side of a hot-reload weight sync: bf16 copy of the weights, safetensors write.

    Runs :func:`~example_trainer.memory.sync_tensors` (the background sync's snapshot, cast to
    vLLM's bf16) and :func:`~atroposlib.inference.weights.select.save_tensors` into a temporary directory,
    as ``weight_sync=reload`` does before vLLM reloads. Returns the median seconds and the
    bytes written; the reload inside vLLM is not part of it.
    """
    import statistics

    from atroposlib.inference.weights.select import save_tensors
    from example_trainer.memory import sync_tensors, trained_names

    times, size = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        for _ in range(repeats):
            if next(model.parameters()).is_cuda:
                torch.cuda.synchronize()
            begin = time.perf_counter()
            weights = sync_tensors(model.state_dict(), trained_names(model), False, "bfloat16", snapshot=True)
            save_tensors(weights, path)
            times.append(time.perf_counter() - begin)
            size = path.stat().st_size
            del weights
    return statistics.median(times), size


def synthetic(batch_size: int, seq_len: int, prompt_len: int, vocab: int,
              group_size: int = 1) -> list[TrainSequence]:
    """Random sequences; each run of ``group_size`` rows shares its prompt, as a GRPO group does."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(batch_size):
        ids = torch.randint(0, vocab, (seq_len,), generator=g).tolist()
        if i % group_size:
            ids[:prompt_len] = out[-1].input_ids[:prompt_len]
        labels = [-100] * prompt_len + ids[prompt_len:]
        out.append(TrainSequence(ids[:-1], labels[1:], [1.0 if i % 2 else -1.0] * (seq_len - 1),
                                 [float("nan")] * (seq_len - 1), None, 1.0, float(i % 2)))
    return out


def full_token_logprobs(logits: torch.Tensor, labels: torch.Tensor,
                        temperature: torch.Tensor | None = None) -> torch.Tensor:
    """The baseline for ``--logprobs full``: one float32 log-softmax over the whole ``[B*T, V]``.

    What :func:`~example_trainer.logprobs.token_logprobs` computed before it went a block of rows
    at a time: same values, but its backward keeps the float32 logits and their log-softmax,
    ``[B, T, V]`` each. Shapes: ``logits [B, T, V]``, ``labels [B, T]`` (``-100`` ignored) ->
    ``[B, T]`` float32.
    """
    from example_trainer.logprobs import scaled_logits

    x = scaled_logits(logits, temperature)
    batch, steps, vocab = x.shape
    index = labels.clamp(min=0).reshape(-1, 1)
    out = torch.log_softmax(x.reshape(batch * steps, vocab), dim=-1).gather(1, index).view(batch, steps)
    return out.masked_fill(labels == -100, 0.0)


def one_step(model, optimizer, micro_batches, n, params=None, scale: float = 1.0,
             mixed_precision: str = "no", tail: bool = False, shared_prefix: bool = False,
             logprobs: str = "blockwise") -> float:
    """One optimizer step over ``micro_batches`` as the trainer takes it; returns the seconds.

    ``micro_batches`` stay where they are (the CPU): as ``atropos-grpo`` does, all are staged
    (:meth:`~example_trainer.data.MicroBatch.staged`) before the first forward, and the loss's
    metrics are read back once, after the optimizer step. ``mixed_precision="bf16"`` runs forward and backward
    under bf16 autocast; ``tail`` runs the LM head only from the first trained position on
    (``logits_to_keep``); ``shared_prefix`` runs a group's shared prompt once (needs ``tail``);
    ``logprobs="full"`` swaps in :func:`full_token_logprobs` (the baseline).
    """
    from unittest import mock

    device = next(model.parameters()).device
    swap = (mock.patch("example_trainer.loss.token_logprobs", full_token_logprobs) if logprobs == "full"
            else contextlib.nullcontext())
    begin = time.perf_counter()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision == "bf16")
    totals = None
    staged = [mb.staged(device, tail) for mb in micro_batches]
    with swap:
        for keep, mb in staged:
            logits = policy_logits(model, mb, keep, autocast, shared_prefix)
            out = grpo_loss(logits, mb.labels, mb.advantages, mb.sampler_logprobs, num_sequences=n,
                            temperature=mb.temperatures)
            (out.loss * scale).backward()
            totals = out.sums if totals is None else totals + out.sums
    torch.nn.utils.clip_grad_norm_(list(model.parameters()) if params is None else params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    totals.tolist()  # the trainer reads its step's metrics here (and so waits for the device)
    return time.perf_counter() - begin


def count_syncs(step) -> int:
    """How many times ``step()`` made the CPU wait for the GPU (``.item()``, ``nonzero``, copies
    back), counted with ``torch.cuda.set_sync_debug_mode("warn")``: each such wait leaves the GPU
    idle until the CPU queues more work."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory in MiB: CUDA allocations on GPUs, else the peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def in_process(args: argparse.Namespace, sync_rows: list[dict]) -> list[dict]:
    """Attention kernel x frozen layers x LM-head tail x mixed precision x threads, in this process.

    With ``--sync-repeats``, each loaded model's weight-sync timing is appended to ``sync_rows``.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    settings = [(a, int(n)) for a in args.attn.split(",") for n in args.last_layers.split(",")]
    for attn, last in settings:
        model, tok = load_policy(args.model, device, dtype, attn)
        if args.sync_repeats:
            seconds, size = sync_seconds(model, args.sync_repeats)
            sync_rows.append({"name": f"sync {attn} layers=all", "seconds": seconds, "bytes": size})
            print(f"weight sync, trainer side (bf16 copy + safetensors write): {seconds:.3f} s, "
                  f"{size / 2**20:.0f} MiB", flush=True)
        if last:
            freeze_all_but_last_layers(model, last)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7)
        seqs = synthetic(args.batch_size, args.seq_len, args.prompt_len, len(tok), args.group_size)
        runs = [(int(t), bool(int(tail)), mp, bool(int(sp)), lp) for tail in args.logits_tail.split(",")
                for mp in args.mixed_precision.split(",") for t in args.threads.split(",")
                for sp in args.shared_prefix.split(",") for lp in args.logprobs.split(",")]
        for threads, tail, mp, shared, lp in runs:
            mbs = make_micro_batches(seqs, args.micro_batch_size, 0, 16, by_prefix=shared)  # on the CPU
            tokens = sum(int(mb.attention_mask.sum()) for mb in mbs)  # the batch's real tokens
            torch.set_num_threads(threads)
            kwargs = {"mixed_precision": mp, "tail": tail or shared, "shared_prefix": shared, "logprobs": lp}
            if device.type == "cuda":  # this setting's own peak, not the run's so far
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            one_step(model, optimizer, mbs, len(seqs), **kwargs)  # warm-up (first call allocates)
            best = min(one_step(model, optimizer, mbs, len(seqs), **kwargs) for _ in range(args.repeats))
            name = (f"{attn} threads={threads} layers={last or 'all'} tail={int(tail or shared)} mp={mp}"
                    f" shared_prefix={int(shared)} logprobs={lp}")
            row = {"name": name, "seconds_per_step": best, "tokens_per_second": tokens / best,
                   "peak_memory_mib": peak_memory_mib(device)}
            if device.type == "cuda":
                row["cuda_syncs_per_step"] = count_syncs(
                    lambda: one_step(model, optimizer, mbs, len(seqs), **kwargs))  # noqa: B023
            mfu = ""
            if args.peak_tflops and not last:  # all layers trained: the count below holds
                row["model_tflops_per_second"] = model_flops(model.config, mbs, tail or shared) / best / 1e12
                row["mfu"] = row["model_tflops_per_second"] / args.peak_tflops
                mfu = f", {row['model_tflops_per_second']:.1f} model TFLOP/s = {row['mfu']:.1%} MFU"
            rows.append(row)
            syncs = f", {row['cuda_syncs_per_step']} waits for the GPU" if "cuda_syncs_per_step" in row else ""
            print(f"{name}: {best:.3f} s/step, {tokens / best:.0f} tokens/s{mfu}, peak "
                  f"{row['peak_memory_mib']:.0f} MiB{syncs} "
                  f"({args.batch_size}x{args.seq_len} tokens, micro {args.micro_batch_size})", flush=True)
    return rows


def worker(args: argparse.Namespace) -> None:
    """One process of a ``--processes`` setting (run by torchrun or alone); rank 0 writes the row."""
    import torch.distributed as tdist

    from example_trainer import distributed, lora
    from example_trainer.config import TrainerConfig

    world = distributed.world_from_env()[0]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dist = distributed.setup(TrainerConfig(fsdp="on" if world > 1 else "off", batch_size=args.batch_size,
                                           micro_batch_size=args.micro_batch_size), device)
    device = dist.device
    torch.set_num_threads(int(args.threads.split(",")[0]))
    torch.manual_seed(0)
    model, tok = load_policy(args.model, torch.device("cpu") if dist.enabled else device, dtype,
                             args.attn.split(",")[0])
    if args.worker_lora_r:
        model = lora.apply_lora(model, r=args.worker_lora_r, alpha=2 * args.worker_lora_r, dropout=0.0,
                                target_modules=list(lora.DEFAULT_TARGET_MODULES))
    model = dist.shard(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-7)
    seqs = synthetic(args.batch_size, args.seq_len, args.prompt_len, len(tok))
    mbs = make_micro_batches(seqs, args.micro_batch_size, 0, 16)
    tokens = sum(int(mb.attention_mask.sum()) for mb in mbs)  # the whole batch, all ranks
    mine = dist.my_share(mbs)  # moved to the device inside each step, as the trainer does
    lp = args.logprobs.split(",")[0]
    one_step(model, optimizer, mine, len(seqs), trainable, dist.grad_scale, logprobs=lp)  # warm-up
    times = [one_step(model, optimizer, mine, len(seqs), trainable, dist.grad_scale, logprobs=lp)
             for _ in range(args.repeats)]
    peaks = [peak_memory_mib(device)]
    if dist.enabled:
        peaks = [None] * world
        tdist.all_gather_object(peaks, peak_memory_mib(device))
        slowest = torch.tensor(times, dtype=torch.float64)
        tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)  # a step ends when its last rank does
        times = slowest.tolist()
    if dist.is_main:
        best = min(times)
        Path(args.worker_out).write_text(json.dumps({
            "processes": world, "lora_r": args.worker_lora_r, "seconds_per_step": best,
            "tokens_per_second": tokens / best, "peak_memory_mib_per_process": peaks,
            "trainable_parameters": sum(p.numel() for p in trainable)}))  # DTensor: global
    dist.close()


def across_processes(args: argparse.Namespace) -> list[dict]:
    """Processes x LoRA rank: each setting a fresh torchrun (or one plain process) on the same batches."""
    rows = []
    for lora_r in [int(r) for r in args.lora_r.split(",")]:
        for n in [int(p) for p in args.processes.split(",")]:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "row.json"
                launcher = [sys.executable]
                if n > 1:
                    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                                "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
                flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                         if v is not None and k not in ("json_out", "processes", "lora_r", "worker_out",
                                                         "worker_lora_r")]
                env = {**os.environ, "OMP_NUM_THREADS": args.threads.split(",")[0],
                       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
                subprocess.run([*launcher, str(Path(__file__).resolve()), *flags, "--worker-out", str(out),
                                "--worker-lora-r", str(lora_r)], check=True, env=env, cwd=ROOT)
                row = json.loads(out.read_text())
            row["name"] = f"{'lora r=' + str(lora_r) if lora_r else 'full'} processes={n}"
            rows.append(row)
            peaks = ", ".join(f"{p:.0f}" for p in row["peak_memory_mib_per_process"])
            print(f"{row['name']}: {row['seconds_per_step']:.2f} s/step, {row['tokens_per_second']:.0f} "
                  f"tokens/s (all processes), peak memory per process {peaks} MiB, "
                  f"{row['trainable_parameters'] / 1e6:.2f}M trainable", flush=True)
    return rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=default_model_dir())
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", default="2,1",
                        help="comma-separated torch thread counts (per process: the first one)")
    parser.add_argument("--attn", default="eager,sdpa", help="with --processes: the first one")
    parser.add_argument("--last-layers", default="0", help="comma-separated; 0 = train all layers")
    parser.add_argument("--logits-tail", default="0", help="comma-separated 0/1: LM head only over "
                        "the positions from the first trained token on (atropos-grpo does this)")
    parser.add_argument("--mixed-precision", default="no", help="comma-separated no/bf16 (bf16 autocast)")
    parser.add_argument("--group-size", type=int, default=1, help="rows per group sharing a prompt "
                        "(the first --prompt-len tokens), as GRPO groups do")
    parser.add_argument("--logprobs", default="blockwise", help="comma-separated blockwise/full: the "
                        "trainer's per-token log-probs a block of rows at a time, or one float32 "
                        "log-softmax over the whole [B*T, V] (the formulation before it)")
    parser.add_argument("--shared-prefix", default="0", help="comma-separated 0/1: run each "
                        "group's shared prompt once (atropos-grpo's default; implies the tail)")
    parser.add_argument("--processes", default=None,
                        help="comma-separated process counts (e.g. 1,2): compare across processes "
                             "with FSDP2 instead of the in-process settings")
    parser.add_argument("--lora-r", default="0", help="with --processes: comma-separated LoRA ranks, 0 = full")
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default=None,
                        help="train a randomly initialised model of this shape instead of --model "
                             "(its tokenizer comes from --model)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOP/s in the training dtype (H100/H200 SXM bf16 "
                             "dense: 989): adds model FLOPs utilisation to settings training all layers")
    parser.add_argument("--sync-repeats", type=int, default=0,
                        help="also time the trainer's side of a weight sync this many times (median)")
    parser.add_argument("--json-out", default=None,
                        help="result file (default: benchmarks/results/bench_trainer_<date>.json)")
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-lora-r", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        return worker(args)
    shape_dir, model_arg = None, args.model  # the JSON names --model, not the temporary shape dir
    if args.model_shape:
        shape_dir = tempfile.TemporaryDirectory()
        args.model = shaped_model_dir(args.model_shape, args.model, Path(shape_dir.name))
    sync_rows: list[dict] = []
    rows = across_processes(args) if args.processes else in_process(args, sync_rows)
    base = rows[0]
    for row in rows:
        row["speed_vs_baseline"] = base["seconds_per_step"] / row["seconds_per_step"]
        print(f"ratio {row['name']} vs {base['name']}: {row['speed_vs_baseline']:.2f}x speed"
              + (f", {max(row['peak_memory_mib_per_process']) / max(base['peak_memory_mib_per_process']):.2f}x "
                 "peak memory per process" if "peak_memory_mib_per_process" in row else ""))
    from benchmarks.results import default_result_path, write_result

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    write_result(args.json_out or default_result_path("bench_trainer"), "bench_trainer", {
        "settings": {**vars(args), "model": model_arg}, "device": device, "torch": torch.__version__,
        "baseline": base["name"], "rows": rows, "weight_sync": sync_rows},
        seeds={"torch.manual_seed": 0, "batch generator": 0})
    if shape_dir is not None:
        shape_dir.cleanup()


if __name__ == "__main__":
    main()
