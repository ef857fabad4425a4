"""Merge inference-server configs: ``config_init`` < YAML ``openai:`` < ``--openai.*`` flags.

Shared by the env CLI and by :func:`atroposlib.inference.clients.openai_client.resolve_openai_configs`
(the Atropos 0.4 helper), so the server layer never imports the CLI.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from atroposlib.errors import ConfigError
from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import APIServerConfig, ServerBaseline
from atroposlib.utils.flags import validation_error_message

__all__ = ["resolve_server_configs", "validated"]


def validated(cls: type, values: dict[str, Any], prefix: str | None, source: str) -> Any:
    """Build ``cls(**values)``; a pydantic ``ValidationError`` becomes a one-line ``ConfigError``.

    The message names the flag or YAML key (``prefix``) and where the values came from
    (``source``).
    """
    try:
        return cls(**values)
    except ValidationError as exc:
        raise ConfigError(validation_error_message(exc, prefix, source)) from exc


def resolve_server_configs(
    init_servers: Any, yaml_openai: Any, cli_openai: dict[str, Any], prefix: str = "openai"
) -> list[APIServerConfig | InferenceClient] | ServerBaseline:
    """Merge server configs: ``config_init`` < YAML ``openai:`` < ``--openai.*`` flags.

    Args:
        init_servers: what ``config_init`` returned for the servers.
        yaml_openai: the YAML ``<prefix>:`` value (mapping, list or None).
        cli_openai: the ``--<prefix>.*`` flags given.
        prefix: the namespace (``openai``, or an extra one such as ``teacher``), for messages.

    Returns:
        A list of configs (a single server is a list of one, its URL honoured), or a bare
        ``ServerBaseline`` when nothing gives a URL.

    Raises:
        ConfigError: ``--openai.*`` flags combined with several servers, or invalid values.
    """
    init_list = list(init_servers) if isinstance(init_servers, (list, tuple)) else None
    yaml_list = yaml_openai if isinstance(yaml_openai, list) else None
    if (yaml_list is not None and len(yaml_list) >= 2) or (init_list is not None and len(init_list) >= 2):
        if cli_openai:
            flags = ", ".join(f"--{prefix}.{k}" for k in cli_openai)
            raise ConfigError(
                f"{flags} cannot be combined with several inference servers; edit the "
                f"`{prefix}:` list in the YAML config instead"
            )
        if yaml_list is not None and len(yaml_list) >= 2:
            return [
                validated(APIServerConfig, dict(d), prefix, f"--config {prefix}[{i}]")
                for i, d in enumerate(yaml_list)
            ]
        return list(init_list or [])
    if init_list is not None:
        if not init_list:
            raise ConfigError("config_init returned an empty server list; return at least one")
        base = init_list[0]
    else:
        base = init_servers
    if isinstance(base, InferenceClient):
        if yaml_openai or cli_openai:
            raise ConfigError(
                f"config_init returned a server instance; --{prefix}.* cannot change it"
            )
        return [base]
    if yaml_list is not None:
        yaml_dict = dict(yaml_list[0]) if yaml_list else {}
    else:
        yaml_dict = dict(yaml_openai or {})
    if isinstance(base, APIServerConfig) or yaml_dict or cli_openai:
        merged = {**base.model_dump(), **yaml_dict, **cli_openai}
        return [validated(APIServerConfig, merged, prefix, f"{prefix} server configuration")]
    return base
