"""Weight sync cost, measured in one run: local reload, restart, and pushing to an inference node over HTTP.

Parts (``--parts``, all by default):

* ``local``: today's same-host path. One trainer-owned vLLM (bundled SmolLM2-135M, dev mode);
  each sync saves safetensors into the run directory and hot-reloads them (``VLLMSync.sync``).
* ``restart``: the same, restarting vLLM on the saved checkpoint instead (the upstream way).
* ``node``: ``atropos-inference-node`` on this host. The trainer sends the weights over HTTP
  (``--weight-transport http``: safetensors body + sha-256, applied by the node) and, for
  comparison, as a local file the node reads (``auto``, the same-host fast path).
* ``trainer``: one fp32 GRPO step on CPU (tokens/s).

Each sync path runs with all weights trainable and with only the top 10 decoder layers trainable
(``--train-last-layers 10``: a push then carries 10 of 30 blocks and the final norm; the local
reload writes the whole model either way). Printed: median seconds a sync (trainer-side wall
time: serialise/save + transfer + load) and bytes sent or written, and the ratios to the local
reload of all weights. Usage::

    flock /tmp/atropos-heavy.lock python benchmarks/bench_weight_sync.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from atroposlib.inference.vllm_process import find_free_port
from example_trainer.config import TrainerConfig, default_model_dir
from example_trainer.data import TrainSequence, make_micro_batches
from example_trainer.grpo import freeze_all_but_last_layers, load_policy
from example_trainer.loss import grpo_loss
from example_trainer.vllm_sync import VLLMSync

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
    sys.path.insert(0, str(ROOT))

#: Trainable top layers of the "subset" runs.
TOP_LAYERS = 10


def generate_ok(base_url: str, headers: dict[str, str] | None = None) -> None:
    response = httpx.post(f"{base_url}/completions", timeout=120, headers=headers, json={
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


def set_trainable(model, top_layers: int | None) -> None:
    model.requires_grad_(True)
    if top_layers:
        freeze_all_but_last_layers(model, top_layers)


def local_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in (run_dir / "vllm_weights").glob("*.safetensors"))


def bench_local(args, model, tokenizer, results: dict) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    config = TrainerConfig(model=args.model, vllm_dtype=args.vllm_dtype, weight_sync="reload")
    sync = VLLMSync(config, run_dir)
    print(f"starting vLLM ({args.vllm_dtype}) ...", flush=True)
    print(f"vLLM start: {sync.start():.1f} s", flush=True)
    try:
        modes = ["reload"] + (["restart"] if "restart" in args.parts else [])
        for mode in modes:
            config.weight_sync = mode
            for top in (None, TOP_LAYERS) if mode == "reload" else (None,):
                set_trainable(model, top)
                name = f"local {mode}, {'top-10' if top else 'all'}"
                for _ in range(args.repeats):
                    metrics = sync.sync(model, tokenizer)
                    generate_ok(sync.base_url)
                    seconds = metrics["sync/save_seconds"] + metrics["sync/update_seconds"]
                    results.setdefault(name, []).append((seconds, local_bytes(run_dir)))
                    print(f"{name}: {seconds:.2f} s ({local_bytes(run_dir) / 1e6:.0f} MB written)", flush=True)
    finally:
        sync.stop()
        sync.cleanup()


def start_node(args, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "atroposlib.cli.inference_node", "--model", args.model,
                             "--port", str(port), "--dtype", args.vllm_dtype, "--log", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "ATROPOS_API_KEY": "bench"})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the node exited; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("the node did not start in 600 s")


def bench_node(args, model, tokenizer, results: dict) -> None:
    port = find_free_port()
    work = Path(tempfile.mkdtemp(prefix="bench-node-"))
    print("starting atropos-inference-node ...", flush=True)
    begin = time.perf_counter()
    proc = start_node(args, port, work / "node.log")
    print(f"node start: {time.perf_counter() - begin:.1f} s", flush=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for transport in ("http", "auto"):
            for top in (None, TOP_LAYERS):
                set_trainable(model, top)
                config = TrainerConfig(model=args.model, vllm_url=url, vllm_api_key="bench",
                                       weight_transport=transport, weight_sync="reload")
                sync = VLLMSync(config, work / f"run-{transport}-{top}")
                sync.start()
                path = "push over HTTP" if transport == "http" else "node reads file"
                name = f"node, {path}, {'top-10' if top else 'all'}"
                for version in range(1, args.repeats + 1):
                    begin = time.perf_counter()
                    metrics = sync.sync(model, tokenizer, version=version)
                    seconds = time.perf_counter() - begin
                    generate_ok(url, {"Authorization": "Bearer bench"})
                    assert metrics["sync/nodes_failed"] == 0, metrics
                    sent = metrics["sync/bytes_sent"] if transport == "http" else local_bytes(sync.weights_dir.parent)
                    results.setdefault(name, []).append((seconds, sent))
                    last = httpx.get(f"{url.removesuffix('/v1')}/atropos/status", timeout=10,
                                     headers={"Authorization": "Bearer bench"}).json()["last_update"]
                    print(f"{name}: {seconds:.2f} s ({sent / 1e6:.0f} MB; node: receive "
                          f"{last['receive_seconds']:.2f} s, drain {last['drain_seconds']:.2f} s, "
                          f"load {last['apply_seconds']:.2f} s)", flush=True)
                sync.stop()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=default_model_dir())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-dtype", default="float32")
    parser.add_argument("--parts", default="local,restart,node,trainer",
                        help="comma-separated: local, restart, node, trainer")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_weight_sync_<date>.json)")
    args = parser.parse_args()
    args.parts = set(args.parts.split(","))
    model, tokenizer = load_policy(args.model, torch.device("cpu"), torch.float32, "eager")
    results: dict[str, list[tuple[float, float]]] = {}
    if args.parts & {"local", "restart"}:
        bench_local(args, model, tokenizer, results)
    if "node" in args.parts:
        bench_node(args, model, tokenizer, results)
    print(f"\nmedian of {args.repeats} syncs ({args.vllm_dtype} vLLM, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}):")
    baseline = statistics.median(s for s, _ in results.get("local reload, all", [(float("nan"), 0)]))
    paths = {}
    for name, rows in results.items():
        seconds = statistics.median(s for s, _ in rows)
        sent = statistics.median(b for _, b in rows)
        paths[name] = {"seconds": [s for s, _ in rows], "bytes": [b for _, b in rows],
                       "median_seconds": seconds, "median_bytes": sent,
                       "ratio_to_local_reload_all": seconds / baseline}
        print(f"  {name:<34} {seconds:6.2f} s/sync  {sent / 1e6:6.0f} MB  "
              f"{seconds / baseline:5.2f}x the local reload of all weights")
    payload = {"settings": {**vars(args), "parts": sorted(args.parts), "json_out": str(args.json_out)},
               "threads": torch.get_num_threads(), "load_average": os.getloadavg()[0],
               "baseline": "local reload, all", "paths": paths}
    if "trainer" in args.parts:
        set_trainable(model, None)
        tps = trainer_tokens_per_second(model, tokenizer, 16, 64)
        payload["trainer_tokens_per_second"] = tps
        print(f"trainer fp32 CPU: {tps:.0f} tokens/s (16x64 tokens, full model, "
              f"{torch.get_num_threads()} threads)")
    from benchmarks.results import default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_weight_sync"), "bench_weight_sync", payload,
                 seeds={"trainer batch": 0})


if __name__ == "__main__":
    main()
