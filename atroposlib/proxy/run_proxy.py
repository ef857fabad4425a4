"""Command line of the proxy: ``python -m atroposlib.proxy``.

Also reachable as ``python -m atroposlib.compat.managed_server_proxy``. Importing
this module loads neither FastAPI nor uvicorn; :func:`main` does.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pydantic import ValidationError

from atroposlib.proxy.errors import validation_message
from atroposlib.proxy.models import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TTL_S,
    ProxyConfig,
    ProxySettings,
)
from atroposlib.utils.flags import ArgumentParser


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``python -m ...managed_server_proxy``."""
    parser = ArgumentParser(
        prog="python -m atroposlib.compat.managed_server_proxy",
        description="OpenAI-compatible proxy whose sessions track exact token ids and "
        "log-probs (ManagedServer) for agent frameworks.",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help="servers.json: {model_name, servers: [{base_url, server_type, "
                        "api_key?}], tokenizer_name?}; omit to configure later via POST /setup")
    parser.add_argument("--host", default="127.0.0.1",
                        help="bind address (default 127.0.0.1; use 0.0.0.0 only on a trusted "
                        "network: there is no authentication)")
    parser.add_argument("--port", type=int, default=9100, help="TCP port (default 9100)")
    parser.add_argument("--session-ttl", type=float, default=DEFAULT_SESSION_TTL_S,
                        help="seconds a session may stay idle before it is deleted "
                        f"(default {DEFAULT_SESSION_TTL_S:g})")
    parser.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS,
                        help=f"most open sessions; more answer 429 (default {DEFAULT_MAX_SESSIONS})")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level (default info)")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the proxy with uvicorn (blocks until interrupted).

    Raises:
        SystemExit: bad flags or an invalid config file (exit code 2, with the reason).
    """
    from atroposlib.errors import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = ProxyConfig.from_file(args.config) if args.config else None
        settings = ProxySettings(session_ttl_s=args.session_ttl, max_sessions=args.max_sessions)
    except ConfigError as exc:
        parser.error(str(exc))
    except ValidationError as exc:
        parser.error(validation_message(exc))
    import uvicorn

    from atroposlib.proxy.app import create_app

    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(create_app(config, settings), host=args.host, port=args.port,
                log_level=args.log_level)

