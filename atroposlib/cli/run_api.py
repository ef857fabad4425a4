"""``run-api``: start the trajectory API server in the foreground (uvicorn).

Examples::

    run-api                                   # 127.0.0.1:8000, in memory
    ATROPOS_API_KEY=s3cret run-api --host 0.0.0.0 --db runs/queue.db
    run-api --api-key-file ~/.atropos-key --allowed-hosts trainer-node
    python -m atroposlib.cli.run_api --port 8001 --max-queued-groups 2000

Every flag is a field of :class:`atroposlib.api.settings.ApiSettings` (the help text comes from
its descriptions). SIGTERM and SIGINT stop it cleanly (exit code 0). Pass the API key through
``$ATROPOS_API_KEY`` or ``--api-key-file``: a ``--api-key`` value is visible to every local user
in the process list.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from atroposlib.api.settings import SETTINGS_ENV, ApiSettings
from atroposlib.utils import flags
from atroposlib.utils.flags import settings_parser


def build_parser() -> argparse.ArgumentParser:
    """Return the ``run-api`` argument parser (one flag per ApiSettings field)."""
    return settings_parser(
        ApiSettings,
        prog="run-api",
        description="Run the atroposlib trajectory API (Atropos 0.4 compatible) in the foreground. "
        "Every flag also takes underscores (--max_queued_groups).",
        docs="docs/guides/trajectory-api.md",
    )


def parse_settings(argv: Sequence[str] | None = None) -> ApiSettings:
    """Parse CLI flags into validated settings; exits with a clear message on bad values.

    ``--env-heartbeat-timeout-s 0`` turns the heartbeat timeout off (as null does).
    """
    settings = flags.parse_settings(build_parser(), None if argv is None else list(argv))
    if settings.env_heartbeat_timeout_s == 0:
        settings = settings.model_copy(update={"env_heartbeat_timeout_s": None})
    return settings


def _exit_cleanly(signum: int, frame: object) -> None:
    """Uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown; turn that into exit code 0."""
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``run-api`` / ``python -m atroposlib.cli.run_api``; returns the exit code."""
    settings = parse_settings(argv)
    try:
        api_key = settings.api_key_value()
    except ValueError as exc:
        print(f"run-api: {exc}", file=sys.stderr)
        return 2
    from atroposlib.utils.preflight import check_port_free

    busy = check_port_free(settings.host, settings.port,
                           f"another run-api? stop it or pass --port {settings.port + 1}")
    if busy:  # before any banner: uvicorn would only say "address already in use" after start-up
        print(f"run-api: {busy}", file=sys.stderr)
        return 2
    import uvicorn

    level = settings.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("atroposlib").setLevel(level)
    common = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": settings.access_log,
        "timeout_graceful_shutdown": 5,
        "server_header": False,
        "http": "atroposlib.api.http_protocol:HeaderTimeoutH11Protocol",
        "timeout_keep_alive": settings.timeout_keep_alive_s,
        "limit_concurrency": settings.limit_concurrency,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "backlog": settings.backlog,
    }
    where = f"db={settings.db}" if settings.db else "in memory (use --db PATH to persist)"
    logging.getLogger("atroposlib.api").info(
        "run-api on http://%s:%d, queue %s, auth %s", settings.host, settings.port, where,
        "on" if api_key else "off",
    )
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        logging.getLogger("atroposlib.api").warning(
            "listening on %s without --api-key: anyone who can reach this port can read and wipe "
            "the queue", settings.host)
    if settings.reload:
        os.environ[SETTINGS_ENV] = settings.to_env_json()
        package_dir = str(Path(__file__).resolve().parents[1])  # watch atroposlib/, not the cwd
        uvicorn.run("atroposlib.api.server:app", reload=True, reload_dirs=[package_dir], **common)
        return 0
    from atroposlib.api.factory import build_app
    from atroposlib.api.http_protocol import set_header_timeout

    set_header_timeout(settings.header_timeout_s)
    try:
        app = build_app(settings)
    except ValueError as exc:
        print(f"run-api: {exc}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    uvicorn.run(app, **common)
    logging.getLogger("atroposlib.api").info("run-api stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
