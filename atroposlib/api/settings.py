"""ApiSettings: every knob of the trajectory API server, documented once (CLI help comes from here)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from atroposlib.defaults import DEFAULT_API_HOST, DEFAULT_API_PORT
from atroposlib.utils.api_key import API_KEY_ENV, resolve_api_key

#: Most batches kept for replay when ``--replay-batches`` is derived from the trainer's
#: checkpoint interval (an explicit ``--replay-batches`` may exceed it).
REPLAY_BATCHES_CAP = 64
#: Environment variable used to hand settings to a ``--reload`` worker process (JSON).
SETTINGS_ENV = "ATROPOS_API_SETTINGS"


class ApiSettings(BaseModel):
    """Configuration of ``run-api``; each field is also a ``--flag`` of the CLI."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(
        default=DEFAULT_API_HOST,
        description="Interface to bind. Default 127.0.0.1 (local only; safer than upstream's "
        "0.0.0.0). Use 0.0.0.0 to accept envs/trainers on other machines, ideally with --api-key.",
    )
    port: int = Field(default=DEFAULT_API_PORT, ge=0, le=65535, description="TCP port to listen on.")
    reload: bool = Field(
        default=False,
        description="Restart the server when source files change (development only; without "
        "--db the queue is lost on every reload).",
    )
    db: Path | None = Field(
        default=None,
        description="SQLite file for a durable queue: accepted groups, registrations, envs and the "
        "step survive a crash or restart. Default: in memory only.",
    )
    db_synchronous: Literal["NORMAL", "FULL"] = Field(
        default="NORMAL",
        description="SQLite synchronous mode (WAL journal). NORMAL survives a crash or kill -9 of "
        "the server; FULL also survives power loss / OS crash at the cost of one fsync per write.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description=f"Bearer token required on every endpoint except GET / (and the docs). "
        f"Default: ${API_KEY_ENV}, else no authentication. Prefer ${API_KEY_ENV} or "
        "--api-key-file: every local user can read a --api-key value in the process list.",
    )
    api_key_file: Path | None = Field(
        default=None,
        description="Read the bearer token from this file (surrounding whitespace stripped); "
        "keep it readable by you alone (chmod 600).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Extra names clients may use in the Host header (e.g. this machine's name or "
        "IP when --host 0.0.0.0), '*.example.com' for a domain, or '*' for any. Always allowed: "
        "localhost, 127.0.0.1, ::1, the --host address and this machine's hostname. Other Hosts "
        "get 400 (guards a local run-api against DNS-rebinding web pages).",
    )
    max_queued_groups: int = Field(
        default=10_000, gt=0,
        description="Back-pressure: POST /scored_data answers 429 once this many groups are queued.",
    )
    max_queued_tokens: int = Field(
        default=50_000_000, gt=0,
        description="Back-pressure: POST /scored_data answers 429 once this many tokens are queued "
        "(about 16 bytes of memory per token without --db).",
    )
    retry_after_s: int = Field(
        default=1, ge=0, description="Retry-After (seconds) sent with 429 answers (queue full) "
        "and 507 answers (the --db disk is full)."
    )
    max_body_bytes: int = Field(
        default=256 * 2**20, gt=0,
        description="Largest request body accepted as sent on the wire (bytes); larger -> 413.",
    )
    max_decompressed_bytes: int = Field(
        default=256 * 2**20, gt=0,
        description="Largest request body after gunzip (bytes); larger -> 413 (gzip-bomb guard). "
        "Inflation stops as soon as the body passes it.",
    )
    max_buffered_groups_per_env: int = Field(
        default=64, gt=0,
        description="Partial groups (fewer sequences than the env's group_size) wait to be merged "
        "into a full group; past this many per env the oldest is queued on its own.",
    )
    observe_retention_groups: int = Field(
        default=1000, ge=0,
        description="GET /observe keeps this many recently served groups readable (queued groups, "
        "and the groups of the batches kept for --replay-batches, are always readable).",
    )
    observe_retention_tokens: int = Field(
        default=4_000_000, ge=0,
        description="Token budget of the served groups kept for GET /observe.",
    )
    max_staleness: int | None = Field(
        default=None, ge=0,
        description="Drop queued groups whose policy_version (the trainer step of the weights "
        "that generated them) is more than this many steps behind the current step, instead of "
        "serving them; counted per env in /status. Groups without a policy_version are never "
        "dropped. A trainer's /register max_staleness overrides it. Default: no limit.",
    )
    replay_batches: int | None = Field(
        default=None, ge=1,
        description="GET /batch?step=N answers again any of the last this many served batches "
        "(with --db, across restarts too), so a trainer that restarts from a checkpoint re-fetches "
        "the batches it had not trained on. Default: the trainer's save_checkpoint_interval + 2 "
        f"(capped at {REPLAY_BATCHES_CAP}), or 1 when it registers no interval. Their groups stay "
        "stored (in memory without --db) until they leave this window.",
    )
    idempotency_keys: int = Field(
        default=100_000, gt=0,
        description="POSTs of scored data that carry an Idempotency-Key header are remembered "
        "(with --db, on disk): a retry with the same key gets the first answer and stores nothing "
        "twice. The newest this many keys are kept (about 400 bytes of memory each).",
    )
    env_heartbeat_timeout_s: float | None = Field(
        default=600.0,
        description="An env silent this long (no /status-env poll, no data) stops counting for "
        "weights and min_batch_allocation, so a dead env cannot stall batching. 0 disables.",
    )
    gzip_batch: bool = Field(
        default=False,
        description="Allow gzip on GET /batch responses. Off by default: on a LAN the compression "
        "time costs more than the bytes it saves (see benchmarks/bench_api.py).",
    )
    gzip_level: int = Field(
        default=1, ge=1, le=9, description="Compression level for gzip responses (>= 1000 bytes)."
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins allowed by CORS (browser dashboards). Default none; credentials are "
        "never allowed.",
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="Close a connection whose request headers are not complete this many seconds "
        "after it opened or after its previous response (slow or idle clients).",
    )
    timeout_keep_alive_s: int = Field(
        default=5, gt=0,
        description="Close an idle keep-alive connection after this many seconds.",
    )
    limit_concurrency: int = Field(
        default=1000, gt=0,
        description="Most open connections plus requests in flight; past it new requests get 503.",
    )
    max_header_bytes: int = Field(
        default=64 * 2**10, gt=0,
        description="Largest request line plus headers (bytes); larger -> 400 and the connection "
        "is closed.",
    )
    backlog: int = Field(
        default=2048, gt=0, description="Most TCP connections waiting to be accepted."
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info", description="Log level (one line per state change at info)."
    )
    access_log: bool = Field(
        default=False, description="Log every HTTP request (uvicorn access log)."
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> ApiSettings:
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            # an empty token would quietly turn authentication off
            raise ValueError("--api-key is empty: give a token (better: $ATROPOS_API_KEY or "
                             "--api-key-file, which keep it out of the process list), or leave "
                             "the flag out to run without authentication")
        if self.api_key is not None and self.api_key_file:
            raise ValueError("give --api-key or --api-key-file, not both")
        return self

    def api_key_value(self) -> str | None:
        """Return the effective bearer token.

        Order: ``api_key``, else ``api_key_file``'s content, else ``$ATROPOS_API_KEY``, else None.

        Raises:
            ValueError: ``api_key_file`` cannot be read or holds only whitespace, or
                ``$ATROPOS_API_KEY`` is set but empty (an empty token would turn auth off).
        """
        secret = self.api_key.get_secret_value() if self.api_key is not None else None
        return resolve_api_key(secret, self.api_key_file)

    def host_names(self) -> list[str]:
        """Names accepted in the ``Host`` header.

        These are localhost, 127.0.0.1, ::1, ``host`` unless it is a wildcard address, this
        machine's hostname, and ``allowed_hosts``.
        """
        names = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
        if self.host not in ("0.0.0.0", "::", ""):
            names.append(self.host)
        return names + list(self.allowed_hosts)

    def to_env_json(self) -> str:
        """Serialise for a ``--reload`` worker (see :func:`settings_from_env`)."""
        data = self.model_dump(mode="json")
        data["api_key"] = self.api_key.get_secret_value() if self.api_key else None
        return orjson.dumps(data).decode()


def settings_from_env() -> ApiSettings:
    """Return the settings a parent ``run-api --reload`` put in ``$ATROPOS_API_SETTINGS``, else defaults."""
    raw = os.environ.get(SETTINGS_ENV)
    return ApiSettings.model_validate(orjson.loads(raw)) if raw else ApiSettings()
