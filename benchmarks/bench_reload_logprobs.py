"""Does vLLM sample from the weights it was last given? Logprobs after successive partial reloads.

The loop's importance ratio assumes that the logprobs vLLM reports for a rollout are the policy's
at the weights the trainer last pushed. This bench starts the bundled SmolLM2-135M-Instruct
with :class:`~atroposlib.inference.vllm_process.VLLMProcess` as the quickstart sizes it (bf16,
its KV cache and ``--max-num-seqs``), then for ``--rounds`` rounds:

1. writes the top 10 layers (the quickstart's trained ones) with fresh Gaussian noise of
   ``--noise`` times each tensor's standard deviation added, in bf16, and hot-reloads only those
   tensors (as the trainer's partial sync does);
2. samples 8 requests of ``n=8`` at once (temperature 1, 24 tokens; decode batches of up to 64
   sequences, the quickstart's load);
3. scores every sampled token with Hugging Face transformers in float32, at the weights just
   pushed and at the previous round's.

It prints, per round, the mean absolute difference between vLLM's logprob of each sampled token
and transformers' at the new weights (the bf16 sampling gap, a few hundredths) and at the
previous weights (what a stale engine would show: far larger). ``--env KEY=VALUE`` sets a variable
in vLLM's environment, e.g. to compare oneDNN's primitive cache capacities::

    python benchmarks/bench_reload_logprobs.py --env ONEDNN_PRIMITIVE_CACHE_CAPACITY=64
    python benchmarks/bench_reload_logprobs.py --env ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TRAINED_LAYERS = range(20, 30)  # the quickstart trains the top 10 of SmolLM2-135M's 30 layers


def arithmetic_prompts(tokenizer: Any, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` chat-formatted addition prompts (token ids), varied in length by filler text."""
    rnd = random.Random(seed)
    prompts = []
    for _ in range(count):
        a, b = rnd.randint(1, 99), rnd.randint(1, 99)
        filler = " Think carefully." * rnd.randint(0, 12)
        messages = [{"role": "user", "content": f"What is {a} + {b}?{filler} Reply with the number only."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def token_logprobs(model: Any, ids: list[int], start: int) -> list[float]:
    """Float32 log-probs of ``ids[start:]`` under ``model``, each given the tokens before it."""
    import torch

    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return [logprobs[i - 1, ids[i]].item() for i in range(start, len(ids))]


def logprob_gaps(model: Any, weights: dict[str, Any], samples: list[tuple[list[int], list[int], list[float]]]
                 ) -> list[float]:
    """Load ``weights`` into ``model``; ``|vLLM logprob - model logprob|`` of every sampled token.

    Args:
        model: a transformers causal LM (float32).
        weights: tensors to load over the model's (``strict=False``).
        samples: ``(prompt ids, sampled token ids, vLLM's logprob of each sampled token)``.
    """
    model.load_state_dict(weights, strict=False)
    return [abs(a - b) for ids, tokens, logprobs in samples
            for a, b in zip(logprobs, token_logprobs(model, ids + tokens, len(ids)), strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="reloads (after a first round at the start weights)")
    parser.add_argument("--noise", type=float, default=0.15,
                        help="noise added to the trained tensors each round, times each tensor's std")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a variable for vLLM's environment (repeatable)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_reload_logprobs_<date>.json)")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)

    import httpx
    import torch
    import yaml
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atroposlib.inference.vllm_process import VLLMProcess
    from example_trainer.config import TrainerConfig, default_model_dir
    from example_trainer.vllm_sync import vllm_sizing

    config = TrainerConfig(**yaml.safe_load((ROOT / "configs/quickstart-cpu.yaml").read_text())["trainer"])
    sizing = vllm_sizing(config)
    model_dir = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    start = {name: t.clone() for name, t in hf.state_dict().items()}
    trained = [name for name in start if any(f"layers.{i}." in name for i in TRAINED_LAYERS)]
    prompts = arithmetic_prompts(tokenizer, 8)
    weights_dir = Path(tempfile.mkdtemp(prefix="bench-reload-logprobs-"))
    shutil.copy(Path(model_dir) / "config.json", weights_dir)
    rows: list[dict[str, Any]] = []
    try:
        with VLLMProcess(model_dir, served_model_name="m", dtype=config.vllm_dtype,
                         max_model_len=config.vllm_max_model_len, max_num_seqs=sizing.max_num_seqs,
                         kv_cache_bytes=sizing.kv_cache_bytes, dev_mode=True, env=env) as vllm:

            def sample(ids: list[int]) -> list[tuple[list[int], list[float]]]:
                response = httpx.post(f"{vllm.base_url}/completions", timeout=300, json={
                    "model": "m", "prompt": ids, "max_tokens": 24, "n": 8, "logprobs": 0,
                    "temperature": 1.0, "return_tokens_as_token_ids": True, "seed": 1})
                response.raise_for_status()
                return [([int(t.removeprefix("token_id:")) for t in c["logprobs"]["tokens"]],
                         [float(x) for x in c["logprobs"]["token_logprobs"]])
                        for c in response.json()["choices"]]

            previous: dict[str, Any] | None = None
            with ThreadPoolExecutor(len(prompts)) as pool:
                for round_ in range(args.rounds + 1):
                    if round_:
                        generator = torch.Generator().manual_seed(round_)
                        new = {name: (start[name] + args.noise * start[name].std()
                                      * torch.randn(start[name].shape, generator=generator)).to(torch.bfloat16)
                               for name in trained}
                        save_file({n: t.contiguous() for n, t in new.items()},
                                  str(weights_dir / "model.safetensors"), metadata={"format": "pt"})
                        vllm.reload_weights(weights_dir)
                        hf.load_state_dict({n: t.float() for n, t in new.items()}, strict=False)
                    sampled = list(pool.map(sample, prompts))
                    now = {name: hf.state_dict()[name].clone() for name in trained}
                    pairs = [(ids, tokens, logprobs) for ids, completions in zip(prompts, sampled, strict=True)
                             for tokens, logprobs in completions]
                    stale = logprob_gaps(hf, previous, pairs) if previous is not None else []
                    gaps = logprob_gaps(hf, now, pairs)
                    row = {"round": round_, "tokens": len(gaps), "mean_abs_gap": sum(gaps) / len(gaps),
                           "max_abs_gap": max(gaps),
                           "mean_abs_gap_previous_weights": sum(stale) / len(stale) if stale else None}
                    rows.append(row)
                    print(f"round {round_}: {row['tokens']} sampled tokens, |vLLM - HF| mean "
                          f"{row['mean_abs_gap']:.4f} (max {row['max_abs_gap']:.3f}); against the "
                          f"previous weights {'-' if not stale else format(row['mean_abs_gap_previous_weights'], '.4f')}",
                          flush=True)
                    previous = now
    finally:
        shutil.rmtree(weights_dir, ignore_errors=True)
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_reload_logprobs"), "bench_reload_logprobs",
                 {"env": env, "noise": args.noise, "rows": rows},
                 seeds={"prompts": 0, "sampling": 1, "noise": "the round's number"}, argv=command_argv(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
