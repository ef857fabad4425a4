"""What each part of an ``atropos-launch`` run is told about the others: servers, keys and flags.

Pure functions of the :class:`~atroposlib.launch.config.LaunchConfig` and the addresses the
launcher learnt while starting the parts (run-api's URL, the inference nodes' URLs, the
trainer's node). They return flags and file contents; :class:`~atroposlib.launch.orchestration.Launcher`
starts the parts with them.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from atroposlib.api.settings import API_KEY_ENV
from atroposlib.defaults import DEFAULT_INFERENCE_MODEL
from atroposlib.launch.commands import flags
from atroposlib.launch.config import EnvSection, LaunchConfig

#: Env flags the launcher sets itself: an ``eval_args`` or env ``args`` value for them is dropped
#: from the evaluation's command line.
_EVAL_OWN_FLAGS = ("env.rollout_server_url", "env.data_dir_to_save_evals")


def served_model_name(config: LaunchConfig) -> str:
    """The name the policy is served under (``trainer.served_model_name``, else the default)."""
    return config.trainer.get("served_model_name", DEFAULT_INFERENCE_MODEL)


def env_servers(config: LaunchConfig, node_urls: list[str]) -> list[str]:
    """The servers the envs get in a ``--config`` file ([]: one ``--openai.base_url``).

    Every inference node started by the launcher (``node_urls``), else every server of a
    ``trainer.vllm_url`` that lists several (comma-separated): the trainer updates all of
    them, so the envs sample from all of them.
    """
    given = [u.strip() for u in str(config.trainer.get("vllm_url") or "").split(",") if u.strip()]
    return node_urls or (given if len(given) > 1 else [])


def servers_yaml(config: LaunchConfig, urls: list[str], server_type: str) -> str:
    """An env ``--config`` listing the inference servers, with their key if there is one.

    Args:
        config: the run's config (``trainer.served_model_name``, ``trainer.vllm_api_key``).
        urls: the servers' OpenAI base URLs (``http://HOST:PORT/v1``).
        server_type: the env's ``--openai.server_type`` (``vllm``, ``openai``, ...).

    Returns:
        YAML text ``{"openai": [{base_url, model_name, server_type[, api_key]}, ...]}``. The key is
        ``trainer.vllm_api_key`` if set (the trainer reaches them with it), else
        ``$ATROPOS_API_KEY``; the launcher writes the file readable by its owner only.
    """
    import yaml

    key = config.trainer.get("vllm_api_key") or os.environ.get(API_KEY_ENV)
    return yaml.safe_dump({"openai": [
        {"base_url": url, "model_name": served_model_name(config), "server_type": server_type,
         **({"api_key": key} if key else {})} for url in urls]})


def eval_command(config: LaunchConfig, eval_env: EnvSection, trainer_values: dict[str, Any],
                 python: str, run_dir: str, node_urls: list[str]) -> tuple[str, dict[str, str]]:
    """The trainer's ``--eval-command``: ``eval_env``'s ``evaluate`` against the served policy.

    Args:
        config: the run's config (``eval_args`` override the env's ``args``).
        eval_env: the env section named by ``eval_env``.
        trainer_values: the trainer's settings (``model`` names the tokenizer when the env's
            args do not).
        python: the interpreter on the trainer's node.
        run_dir: the run directory on the trainer's node.
        node_urls: the inference nodes' OpenAI base URLs ([] when the trainer serves the policy).

    Returns:
        ``(command, files)``: the shell command, with the ``{base_url}``, ``{model_name}`` and
        ``{out_dir}`` placeholders the trainer fills in, and the files to write into ``run_dir``
        first (the nodes' list, with their key, as ``eval-servers.yaml``).
    """
    eval_args = {k: v for k, v in {**eval_env.args, **config.eval_args}.items() if k not in _EVAL_OWN_FLAGS}
    if trainer_values.get("model") and "env.tokenizer_name" not in eval_args:
        eval_args["env.tokenizer_name"] = trainer_values["model"]
    files: dict[str, str] = {}
    if node_urls:  # through the nodes' list (it holds their key), not {base_url}
        files["eval-servers.yaml"] = servers_yaml(config, node_urls, eval_env.server_type)
        servers = ["--config", shlex.quote(f"{run_dir}/eval-servers.yaml")]
    else:
        servers = ["--openai.server_type", shlex.quote(eval_env.server_type),
                   "--openai.base_url", "{base_url}", "--openai.model_name", "{model_name}"]
    command = " ".join([shlex.quote(python), shlex.quote(eval_env.script), "evaluate",
                        *map(shlex.quote, flags(eval_args)), *servers,
                        "--env.data_dir_to_save_evals", "{out_dir}"])
    return command, files


def env_serve_flags(config: LaunchConfig, env: EnvSection, api_url: str, base_url: str,
                    servers: list[str], run_dir: str) -> tuple[list[str], dict[str, str] | None]:
    """The flags of ``env``'s ``serve`` command and the files to write on its node first.

    Args:
        config: the run's config.
        env: the env's section (its ``args`` win over nothing here but the tokenizer default).
        api_url: run-api's URL (``--env.rollout_server_url``).
        base_url: the policy's OpenAI base URL, when the env reaches one server.
        servers: :func:`env_servers` ([]: the env gets ``base_url`` as flags).
        run_dir: the run directory on the env's node (where its server list goes).

    Returns:
        ``(flags, files)``: the ``--key value`` flags, and ``{"<env>-servers.yaml": text}``
        (with the servers' key) or None.
    """
    extra: dict[str, Any] = {"env.rollout_server_url": api_url}
    files = None
    if servers:  # every server, with their key, in a file on the env's node
        files = {f"{env.name}-servers.yaml": servers_yaml(config, servers, env.server_type)}
        extra["config"] = f"{run_dir}/{env.name}-servers.yaml"
    else:
        extra.update({"openai.base_url": base_url, "openai.model_name": served_model_name(config),
                      "openai.server_type": env.server_type})
    model_dir = config.trainer.get("model")
    if model_dir and "env.tokenizer_name" not in env.args:
        extra["env.tokenizer_name"] = model_dir
    return flags({**env.args, **extra}), files


__all__ = ["env_serve_flags", "env_servers", "eval_command", "served_model_name", "servers_yaml"]
