"""Realistic rollout groups (chat-templated tokens, -100 prompt masks, messages) for the tools tests."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=2)
def load_tokenizer(model_dir: Path) -> Any:
    """The bundled model's tokenizer (loaded once per process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def make_group(
    tokenizer: Any,
    question: str,
    answers: list[str],
    scores: list[float],
    *,
    with_messages: bool = True,
    system: str | None = None,
) -> dict[str, Any]:
    """A ScoredDataGroup as an env sends it: chat-templated tokens, -100 prompt masks, messages."""
    prompt_msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}
    ]
    prompt_ids = tokenizer.apply_chat_template(prompt_msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    tokens, masks, messages = [], [], []
    for answer in answers:
        completion = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        tokens.append(list(prompt_ids) + completion)
        masks.append([-100] * len(prompt_ids) + completion)
        messages.append(prompt_msgs + [{"role": "assistant", "content": answer}])
    group: dict[str, Any] = {"tokens": tokens, "masks": masks, "scores": list(scores)}
    if with_messages:
        group["messages"] = messages
    return group


def register_trainer_and_envs(url: str, n_envs: int, batch_size: int = 4, group_size: int = 2) -> list[int]:
    """Register a trainer (and take its first, empty batch) so envs can register; return env ids."""
    import httpx

    reg = {"wandb_group": "g", "wandb_project": "p", "batch_size": batch_size,
           "max_token_len": 2048, "checkpoint_dir": "ckpt", "save_checkpoint_interval": 10,
           "starting_step": 0, "num_steps": 100}
    httpx.post(url + "/register", json=reg, timeout=10).raise_for_status()
    httpx.get(url + "/batch", timeout=10).raise_for_status()
    ids = []
    for i in range(n_envs):
        r = httpx.post(url + "/register-env", json={"max_token_length": 2048, "desired_name": f"env{i}",
                                                    "weight": 1.0, "group_size": group_size}, timeout=10)
        r.raise_for_status()
        ids.append(r.json()["env_id"])
    return ids
