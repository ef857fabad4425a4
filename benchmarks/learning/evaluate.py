"""One evaluator for every kept policy: HF generate, greedy, fp32, on the env's held-out problems."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.learning.ours import POINTS
from benchmarks.learning.trl_side import MAX_TOKENS, eos_token_ids

#: held-out problems scored per policy (all 105 of difficulty 2; 200 of difficulty 4's ~3700)
EVAL_SIZE = 200


def greedy_replies(model: Any, tokenizer: Any, prompts: list[str], eval_batch: int) -> list[tuple[str, str]]:
    """Greedy replies of ``model`` to rendered ``prompts``, at most ``MAX_TOKENS`` tokens each.

    Args:
        model: a HF causal LM.
        tokenizer: its tokenizer, padding on the left.
        prompts: ``[N]`` chat-rendered prompts (generation prompt included).
        eval_batch: prompts per ``generate`` call.

    Returns:
        ``[N]`` ``(text, finish_reason)``: the reply up to its first end-of-turn token,
        ``"stop"``, or the whole reply and ``"length"`` when it has none.
    """
    import torch

    eos_ids = eos_token_ids(model, tokenizer)
    replies: list[tuple[str, str]] = []
    for i in range(0, len(prompts), eval_batch):
        enc = tokenizer(prompts[i:i + eval_batch], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=MAX_TOKENS,
                                 pad_token_id=tokenizer.pad_token_id or 0,
                                 eos_token_id=sorted(eos_ids))
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            cut = next((j for j, t in enumerate(row) if t in eos_ids), None)
            replies.append((tokenizer.decode(row[:cut], skip_special_tokens=True),
                            "length" if cut is None else "stop"))
    return replies


def evaluate_all(runs: list[dict[str, Any]], difficulty: int, eval_batch: int,
                 eval_size: int = EVAL_SIZE) -> int:
    """Score every kept policy of ``runs`` with ONE evaluator; fill each run's ``curve``.

    A policy is the bundled model with a point applied (:func:`load_policy`). Each curve point
    is ``{"minute", "accuracy", "policy"}``, ``policy`` being the kind :func:`load_policy`
    names (``base`` for the bundled model itself).

    Returns:
        The number of held-out problems scored (``eval_size``, or fewer when the split is
        smaller).

    Raises:
        RuntimeError: a point holds a tensor the model lacks.
    """
    from transformers import AutoTokenizer

    from atroposlib.environments.arithmetic_server import (
        ArithmeticEnv,
        ArithmeticEnvConfig,
        heldout_problems,
        score_reply,
    )
    from atroposlib.inference.bundled import bundled_model_dir

    base_dir = str(bundled_model_dir())
    env_cfg = ArithmeticEnvConfig(difficulty=difficulty, eval_size=eval_size)
    problems = heldout_problems(difficulty, env_cfg.heldout_fraction, env_cfg.eval_size,
                                env_cfg.eval_seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir, padding_side="left")
    prompts = [tokenizer.apply_chat_template(ArithmeticEnv.messages(p), tokenize=False,
                                             add_generation_prompt=True) for p in problems]
    cache: dict[str | None, tuple[float, str]] = {}

    def accuracy(path: str | None) -> tuple[float, str]:
        if path not in cache:
            model, kind = load_policy(base_dir, path)
            replies = greedy_replies(model, tokenizer, prompts, eval_batch)
            correct = sum(score_reply(text, prob["answer"], finish)
                          for (text, finish), prob in zip(replies, problems, strict=True))
            cache[path] = correct / len(problems), kind
        return cache[path]

    print(f"[bench] evaluating {len(problems)} held-out problems of difficulty {difficulty} "
          "per policy", flush=True)
    base, _ = accuracy(None)
    print(f"[bench] base model: {base:.3f}", flush=True)
    for run in runs:
        budget_min = run["budget_minutes"]
        curve = []
        for frac in POINTS:
            if frac not in run["points"]:  # not kept (the -node contender keeps 0 and M only)
                continue
            acc, kind = accuracy(run["points"][frac])
            curve.append({"minute": frac * budget_min, "accuracy": acc, "policy": kind})
            print(f"[bench] {run['label']} at {frac * budget_min:.2f} min: {acc:.3f} ({kind})",
                  flush=True)
        run["curve"] = curve
        run["accuracy_base"] = base
    return len(problems)


def load_policy(base_dir: str | Path, path: str | Path | None) -> tuple[Any, str]:
    """The fp32 model ``base_dir`` (eager attention, eval mode) with the point ``path`` applied.

    A point is one of:

    * None: the model itself (kind ``base``).
    * a directory holding ``adapter_config.json`` (ours, a LoRA run that pushes its adapter
      alone: peft's ``save_pretrained`` output): the adapter merged into the model, kind
      ``adapter``. Every adapted linear layer ``W`` (``[out, in]``) becomes
      ``W + scaling * B @ A`` (Hu et al. 2021, arXiv:2106.09685, eq. 3), computed by peft's
      ``merge_and_unload`` in fp32.
    * a trainer checkpoint directory (``checkpoint.json`` in it): its ``adapter/`` merged in as
      above when it has one (a LoRA run; its ``model.safetensors`` holds the same merge at the
      saving dtype), else its weights as below; kind ``checkpoint adapter`` or
      ``checkpoint weights``.
    * a directory holding ``model.safetensors`` (ours: the weights the trainer pushed to vLLM,
      possibly only the trained tensors) or a ``.safetensors`` file (TRL: its trainable
      tensors): the tensors loaded over the model's, kind ``weights``.

    Tensors are loaded in fp32 whatever dtype they were saved in.

    Returns:
        ``(model, kind)``.

    Raises:
        RuntimeError: a weights point holds a tensor the model lacks.
        FileNotFoundError: the point holds neither an adapter nor weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    if path is None:
        return model, "base"
    point = Path(path)
    prefix = "checkpoint " if (point / "checkpoint.json").is_file() else ""
    adapter = next((d for d in (point, point / "adapter") if (d / "adapter_config.json").is_file()), None)
    if adapter is not None:
        from peft import PeftModel

        merged = PeftModel.from_pretrained(model, str(adapter)).float().merge_and_unload()
        return merged.eval(), f"{prefix}adapter"
    file = point / "model.safetensors" if point.is_dir() else point
    if not file.is_file():
        raise FileNotFoundError(f"{point} holds neither an adapter (adapter_config.json) nor "
                                "weights (model.safetensors); it is not a point the bench kept")
    _load_tensors(model, file)
    return model, f"{prefix}weights"


def _load_tensors(model: Any, file: Path) -> None:
    """Load the tensors of ``file`` over ``model``'s, in fp32 (missing ones keep their values).

    Raises:
        RuntimeError: ``file`` holds a tensor the model lacks.
    """
    from safetensors.torch import load_file

    state = {k: v.float() for k, v in load_file(str(file)).items()}
    unexpected = model.load_state_dict(state, strict=False).unexpected_keys
    if unexpected:
        raise RuntimeError(f"{file} holds weights the model lacks: {unexpected[:3]}")
    if model.config.tie_word_embeddings:
        model.tie_weights()
