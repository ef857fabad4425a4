"""The teacher's servers for distillation: resolved from flags and YAML, checked before any rollout.

A teacher must return prompt log-probs (vLLM's ``prompt_logprobs``) and tokenize exactly like
the student; :class:`~atroposlib.envs.teacher_distillation_env.TeacherDistillationEnv` uses
these checks when it builds its teacher ``ServerManager``.
"""

from __future__ import annotations

import logging
from typing import Any

from atroposlib.errors import ConfigError
from atroposlib.inference.clients.base import APIServer
from atroposlib.inference.clients.config import APIServerConfig, ServerBaseline
from atroposlib.inference.clients.manager import server_class_for
from atroposlib.inference.clients.openai_client import resolve_openai_configs

logger = logging.getLogger(__name__)


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """Describe how two HF tokenizers differ, or None when they map text to ids identically.

    Compares the vocabulary (token -> id, added tokens included) and the bos/eos/pad/unk ids.

    Args:
        student: the env's tokenizer.
        teacher: the teacher server's tokenizer.

    Returns:
        None when identical, else a short human-readable difference.
    """
    if student is teacher:
        return None
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(student, attr, None), getattr(teacher, attr, None)
        if a != b:
            return f"{attr} differs (student {a}, teacher {b})"
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if len(sv) != len(tv):
        return f"vocabulary size differs (student {len(sv)}, teacher {len(tv)})"
    if sv != tv:
        token = next(t for t in sv if tv.get(t) != sv[t])
        return f"token {token!r} has id {sv[token]} for the student, {tv.get(token)} for the teacher"
    return None


def resolve_teacher_server_configs(
    default_teacher_server_configs: Any,
    yaml_config: dict[str, Any] | None,
    cli_passed_flags: dict[str, Any] | None,
) -> Any:
    """Resolve the ``teacher`` namespace like ``openai`` (Atropos 0.4's helper).

    Defaults < YAML ``teacher:`` < ``--teacher.*`` flags; the env command line does this itself.

    Returns:
        None when no default, YAML key or flag names a teacher; else the resolved configs.
    """
    yaml_teacher = (yaml_config or {}).get("teacher")
    flags = {
        key.split(".", 1)[1]: value
        for key, value in (cli_passed_flags or {}).items()
        if key.startswith("teacher.")
    }
    if default_teacher_server_configs is None and not yaml_teacher and not flags:
        return None
    merged: dict[str, Any] = {}
    if isinstance(default_teacher_server_configs, ServerBaseline):
        merged.update(default_teacher_server_configs.model_dump())
    if isinstance(yaml_teacher, dict):
        merged.update(yaml_teacher)
    merged.update(flags)
    return resolve_openai_configs(
        default_server_configs=(
            default_teacher_server_configs
            if default_teacher_server_configs is not None
            else ServerBaseline()
        ),
        openai_config_dict=merged,
        yaml_config={"openai": yaml_teacher} if yaml_teacher is not None else {},
        cli_passed_flags={f"openai.{key}": value for key, value in flags.items()},
        logger=logger,
    )


def _check_can_score_prompts(source: APIServerConfig | APIServer) -> None:
    """Raise ``ConfigError`` when the teacher backend ``source`` cannot return prompt log-probs.

    ``source`` is a teacher's settings (its ``server_type`` names the backend) or a ready server.
    """
    config = source.config if isinstance(source, APIServer) else source
    server_class = type(source) if isinstance(source, APIServer) else server_class_for(config.server_type)
    if server_class._get_logprobs_wrapper is APIServer._get_logprobs_wrapper:
        raise ConfigError(
            f"teacher server {getattr(config, 'base_url', None) or config.model_name!r} (server_type "
            f"{config.server_type!r}) cannot return prompt log-probs; serve the teacher with "
            "vLLM and pass --teacher.server_type vllm"
        )


__all__ = ["resolve_teacher_server_configs", "tokenizer_difference"]
