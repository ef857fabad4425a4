"""NodeSettings: every setting of ``atropos-inference-node``, documented once (the CLI help comes from here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from atroposlib.defaults import DEFAULT_INFERENCE_MODEL
from atroposlib.utils.api_key import API_KEY_ENV, resolve_api_key

#: Environment variable through which the command hands its settings (JSON) to the middleware
#: that vLLM's server process loads; the API key travels in it resolved, never on a command line.
SETTINGS_ENV = "ATROPOS_INFERENCE_NODE_CONFIG"
#: Default TCP port: the development inference port, so envs find a node with no flags.
DEFAULT_NODE_PORT = 9100


class NodeSettings(BaseSettings):
    """Settings of atropos-inference-node: vLLM on this host, updated by a trainer over HTTP.

    Each setting is a kebab-case flag (``--weights-dir /scratch/w``) or an environment variable
    ATROPOS_NODE_<FIELD>; flags win. Flags after ``--`` go to vLLM unchanged.
    """

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix="ATROPOS_NODE_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="atropos-inference-node",
        cli_hide_none_type=True,
    )

    model: str | None = Field(default=None, description="Model to serve: a local HF directory "
                              "or hub id; null: the bundled SmolLM2-135M-Instruct. It must be "
                              "the model the trainer started from: pushes may carry only the "
                              "tensors the trainer changes.")
    served_model_name: str = Field(default=DEFAULT_INFERENCE_MODEL, description="Model name "
                                   "clients send as `model`.")
    host: str = Field(default="127.0.0.1", description="Interface to bind; 0.0.0.0 to accept "
                      "trainers and environments on other hosts (then set an API key).")
    port: int = Field(default=DEFAULT_NODE_PORT, ge=1, le=65535, description="TCP port of the "
                      "OpenAI API and the node's own routes (one port).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="vLLM dtype (auto: float32 on CPU); the trainer sends "
        "weights in this dtype, so bfloat16 halves the bytes of a push.")
    max_model_len: int = Field(default=2048, ge=1, description="Context length in tokens.")
    api_key: SecretStr | None = Field(
        default=None, description=f"Bearer token required on every route but GET /health "
        f"(completions and weight pushes alike). Default: ${API_KEY_ENV}, else no "
        f"authentication. Prefer ${API_KEY_ENV} or --api-key-file: a --api-key value is "
        "visible to every local user in the process list.")
    api_key_file: Path | None = Field(default=None, description="Read the bearer token from "
                                      "this file (chmod 600).")
    weights_dir: Path | None = Field(default=None, description="Node-local directory that "
                                     "received weights are written to before vLLM loads them "
                                     "(about one copy of the pushed tensors); null: a new "
                                     "temporary directory, removed on exit.")
    serve_base: bool = Field(default=False, description="Serve the starting model as policy "
                             "version 0 at once. Default: answer completions with 503 until a "
                             "trainer has pushed weights, so a restarted node never serves "
                             "stale weights.")
    drain_timeout_s: float = Field(default=120.0, gt=0, description="Seconds an update waits "
                                   "for the completions in flight to finish on the old "
                                   "weights; past it they are aborted (clients get an error and "
                                   "retry).")
    retry_after_s: int = Field(default=5, ge=0, description="Retry-After (seconds) sent with "
                               "503 answers while the node has no weights.")
    max_weights_bytes: int = Field(default=64 * 2**30, gt=0, description="Largest weight push "
                                   "accepted (bytes); larger -> 413.")
    weight_transfer: Literal["http", "nccl", "nccl-sparse"] = Field(
        default="http", description="http: receive safetensors over HTTP (tested); nccl: also "
        "start vLLM's NCCL weight-transfer engine and accept NCCL broadcasts from a trainer "
        "with --weight-transport nccl (CUDA only; never run in this project's CI); "
        "nccl-sparse: the same with vLLM's sparse NCCL engine, which receives only the changed "
        "elements (flat indices and values) after the first sync (CUDA only; never run).")
    start_timeout_s: float = Field(default=600.0, gt=0, description="Seconds to wait for vLLM "
                                   "to become healthy.")
    log: Path | None = Field(default=None, description="vLLM's log file; null: a new file in "
                             "the temporary directory.")

    @model_validator(mode="after")
    def _one_key_source(self) -> NodeSettings:
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            # an empty token would quietly turn authentication off
            raise ValueError("--api-key is empty: give a token (better: $ATROPOS_API_KEY or "
                             "--api-key-file), or leave the flag out to run without "
                             "authentication")
        if self.api_key is not None and self.api_key_file:
            raise ValueError("give --api-key or --api-key-file, not both")
        return self

    def api_key_value(self) -> str | None:
        """Return the effective bearer token (``api_key``, the key file, ``$ATROPOS_API_KEY``).

        Raises:
            ValueError: ``api_key_file`` cannot be read or is empty.
        """
        secret = self.api_key.get_secret_value() if self.api_key is not None else None
        return resolve_api_key(secret, self.api_key_file)

    def to_env_json(self) -> str:
        """Serialise for the middleware in vLLM's process, the API key resolved (see :meth:`from_env`).

        Raises:
            ValueError: as :meth:`api_key_value`.
        """
        data = self.model_dump(mode="json", exclude={"api_key_file"})
        data["api_key"] = self.api_key_value()
        return json.dumps(data)

    @classmethod
    def from_env(cls) -> NodeSettings:
        """The settings ``atropos-inference-node`` handed to vLLM's server process.

        Raises:
            RuntimeError: ``$ATROPOS_INFERENCE_NODE_CONFIG`` is not set (the middleware was
                loaded into a vLLM that the command did not start).
        """
        raw = os.environ.get(SETTINGS_ENV)
        if not raw:
            raise RuntimeError(
                f"${SETTINGS_ENV} is not set: start vLLM through atropos-inference-node, which "
                "loads this middleware with its settings, instead of passing --middleware by hand")
        return cls.model_validate_json(raw)


__all__ = ["DEFAULT_NODE_PORT", "SETTINGS_ENV", "NodeSettings"]
