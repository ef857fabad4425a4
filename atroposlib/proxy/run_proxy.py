"""Command line of the proxy: ``python -m atroposlib.proxy``.

Also reachable as ``python -m atroposlib.compat.managed_server_proxy``. Importing
this module loads neither FastAPI nor uvicorn; :func:`main` does.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atroposlib.proxy.errors import validation_message
from atroposlib.proxy.models import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TTL_S,
    ProxyConfig,
    ProxySettings,
)
from atroposlib.utils.flags import parse_settings, settings_parser

PROG = "python -m atroposlib.compat.managed_server_proxy"


class ProxyFlags(BaseModel):
    """The proxy's command line: where it listens, its servers file and its session limits."""

    model_config = ConfigDict(extra="forbid")

    config: Path | None = Field(default=None, description="servers.json: {model_name, servers: "
                                "[{base_url, server_type, api_key?}], tokenizer_name?}; leave it "
                                "out to configure the proxy later through POST /setup.")
    host: str = Field(default="127.0.0.1", description="Bind address (0.0.0.0 only on a "
                      "trusted network: there is no authentication).")
    port: int = Field(default=9100, ge=0, le=65535, description="TCP port.")
    session_ttl: float = Field(default=DEFAULT_SESSION_TTL_S, description="Seconds a session "
                               "may stay idle before it is deleted.")
    max_sessions: int = Field(default=DEFAULT_MAX_SESSIONS, description="Most open sessions; "
                              "more answer 429.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info", description="uvicorn log level.")


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``python -m ...managed_server_proxy`` (one flag per field)."""
    return settings_parser(
        ProxyFlags, prog=PROG,
        description="OpenAI-compatible proxy whose sessions track exact token ids and "
        "log-probs (ManagedServer) for agent frameworks. Every flag also takes underscores "
        "(--max_sessions).", docs="docs/guides/proxy.md")


def main(argv: list[str] | None = None) -> None:
    """Run the proxy with uvicorn (blocks until interrupted).

    Raises:
        SystemExit: bad flags or an invalid config file (exit code 2, with the reason).
    """
    from atroposlib.errors import ConfigError

    parser = build_parser()
    args = parse_settings(parser, argv)
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
