"""What an env's ``config`` subcommand prints: the settings a parsed command line resolved to.

``python my_env.py config [--mode serve|process|evaluate] [--json] [flags]`` layers
``config_init`` < ``--config`` YAML < flags exactly as that mode would, then prints the result
instead of running: YAML by default, one JSON object with ``--json`` (what ``atropos-launch``
reads to learn each env's ``group_size``). Bearer tokens print as ``***``.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.constants import ENV_NAMESPACE, OPENAI_NAMESPACE
from atroposlib.utils.flags import settings_text


def _dump(value: Any) -> Any:
    """A config model (or a server client holding one) as plain data."""
    value = getattr(value, "config", value) if not hasattr(value, "model_dump") else value
    if hasattr(value, "model_dump"):
        try:
            return value.model_dump(mode="json")
        except Exception:  # noqa: BLE001 - a value JSON cannot hold: settings_text prints str()
            return value.model_dump()
    return str(value)


def settings_document(command: Any) -> dict[str, Any]:
    """The resolved settings of ``command`` (an ``EnvCommand``) as one mapping.

    Keys: ``mode``; ``env`` (every env config field); ``openai`` (a list with one mapping per
    inference server, or one mapping for a ``ServerBaseline``); each extra server namespace by
    its constructor keyword (``teacher_server_configs``); ``slurm``, ``testing``,
    ``max_n_completions``, ``proxy_url``; ``wait_for_services``.
    """
    servers = command.servers
    openai = [_dump(s) for s in servers] if isinstance(servers, list | tuple) else _dump(servers)
    return {
        "mode": command.mode,
        ENV_NAMESPACE: _dump(command.env_config),
        OPENAI_NAMESPACE: openai,
        **{keyword: [_dump(s) for s in configs] for keyword, configs in command.extra_servers.items()},
        **_dump(command.manager),
        "wait_for_services": command.wait_for_services,
    }


def print_settings(command: Any) -> None:
    """Print :func:`settings_document` as YAML, or as JSON when ``command.show == "json"``."""
    print(settings_text(settings_document(command), command.show == "json"))


__all__ = ["print_settings", "settings_document"]
