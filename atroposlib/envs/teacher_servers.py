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
from atroposlib.inference.clients.manager import ServerManager, server_class_for
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


def teacher_manager(
    teacher_server_configs: Any, tokenizer_factory: Any, testing: bool = False
) -> tuple[ServerManager, str | None]:
    """Build the teacher's load-balanced ``ServerManager`` from its servers.

    Args:
        teacher_server_configs: one ``APIServerConfig`` or ``APIServer``, a list of them (one
            becomes a list of one, as Atropos 0.4 passes it on), or a bare ``ServerBaseline``
            (passed as is: the manager derives the servers' addresses). Empty or None only with
            ``testing``.
        tokenizer_factory: ``() -> tokenizer``: the student's tokenizer, handed to ready servers
            and fake teachers (they tokenize like the student).
        testing: without configs, in-process ``FakeServer`` teachers.

    Returns:
        ``(manager, tokenizer_name)``: the name of the first teacher's tokenizer when that
        teacher is given as settings (its ``tokenizer_name``, else its ``model_name``), for the
        caller to compare with the student's; None otherwise.

    Raises:
        ConfigError: no configs outside ``testing``, or a teacher backend cannot return prompt
            log-probs.
    """
    if not teacher_server_configs and not testing:
        raise ConfigError(
            "teacher_enabled is true but no teacher server configuration was provided: pass "
            "--teacher.base_url URL --teacher.model_name NAME --teacher.server_type vllm "
            "(or teacher_server_configs=[APIServerConfig(...)]), or set "
            "--env.teacher_enabled false"
        )
    if not teacher_server_configs:  # testing: in-process fake teachers
        manager = ServerManager(ServerBaseline(), slurm=False, testing=True)
        for server in manager.servers:
            server.set_tokenizer_factory(tokenizer_factory)
        return manager, None
    bare_baseline = type(teacher_server_configs) is ServerBaseline
    sources = (
        list(teacher_server_configs)
        if isinstance(teacher_server_configs, list | tuple)
        else [teacher_server_configs]
    )
    for source in sources:
        _check_can_score_prompts(source)
        if hasattr(source, "set_tokenizer_factory"):
            source.set_tokenizer_factory(tokenizer_factory)
    manager = ServerManager(
        teacher_server_configs if bare_baseline else sources, slurm=False, testing=False
    )
    first = sources[0]
    if not isinstance(first, APIServerConfig):
        return manager, None
    name = first.tokenizer_name
    return manager, first.model_name if name in ("", "none") else name


def check_server_tokenizers(student: Any, student_name: str, servers: list[APIServer]) -> None:
    """Make sure every teacher server tokenizes exactly like the student.

    Args:
        student: the env's tokenizer.
        student_name: its ``--env.tokenizer_name`` (for the message).
        servers: the teacher ``ServerManager``'s servers (their ``tokenizer`` is loaded here).

    Raises:
        ConfigError: a teacher tokenizer differs from the student's, is missing or cannot be
            loaded; the message says how to fix it.
    """
    for server in servers:
        name = server.config.tokenizer_name
        if name == "none":
            name = server.config.model_name
        try:
            teacher_tok = server.tokenizer
        except OSError as exc:
            raise ConfigError(
                f"cannot load the teacher tokenizer {name!r} ({exc}); pass "
                "--teacher.tokenizer_name DIR (a local tokenizer directory identical to "
                "--env.tokenizer_name)"
            ) from exc
        if teacher_tok is None:
            raise ConfigError(
                f"teacher server {name!r} has no tokenizer; pass --teacher.tokenizer_name DIR"
            )
        difference = tokenizer_difference(student, teacher_tok)
        if difference is not None:
            raise ConfigError(
                f"the teacher tokenizer ({name!r}) differs from the student tokenizer "
                f"({student_name!r}): {difference}. Distillation compares "
                "token ids position by position, so both must use the same tokenizer: pick a "
                "teacher from the student's model family, or point --teacher.tokenizer_name "
                "/ --env.tokenizer_name at the same tokenizer"
            )


__all__ = ["check_server_tokenizers", "resolve_teacher_server_configs", "teacher_manager", "tokenizer_difference"]
