"""``atropos-inference-node``: run vLLM on this host as a node that trainers push weights to over HTTP.

Examples::

    atropos-inference-node                                   # bundled model, 127.0.0.1:9100
    ATROPOS_API_KEY=s3cret atropos-inference-node --host 0.0.0.0 --dtype bfloat16
    atropos-inference-node --model /models/qwen --port 9200 -- --max-num-seqs 64

Every flag is a field of :class:`atroposlib.inference.node.settings.NodeSettings`; flags after
``--`` go to vLLM unchanged. SIGTERM and SIGINT stop vLLM's whole process group. The trainer
then runs with ``--vllm-url http://THIS_HOST:9100/v1`` (see ``docs/inference-node.md``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: What vLLM loads to become a node.
MIDDLEWARE = "atroposlib.inference.node.middleware.NodeMiddleware"


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` at the first ``--``: (the node's flags, vLLM's flags)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def build_parser() -> Any:
    """The ``atropos-inference-node`` parser: one flag per ``NodeSettings`` field."""
    from atroposlib.inference.node.settings import NodeSettings
    from atroposlib.utils.flags import settings_parser

    return settings_parser(NodeSettings, prog="atropos-inference-node",
                           description="Serve a model with vLLM and take new weights from a "
                           "trainer over HTTP, on a node that shares no disk with it. Every "
                           "flag also takes underscores (--weights_dir).",
                           epilog="Flags after -- are passed to vLLM unchanged.",
                           docs="docs/inference-node.md")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``atropos-inference-node``; returns the exit code.

    Returns:
        0 after Ctrl-C, 143 after SIGTERM, 1 when vLLM failed to start or exited, 2 for a bad
        flag, key file or busy port (one line on stderr).
    """
    from atroposlib.inference.node.settings import SETTINGS_ENV
    from atroposlib.utils.flags import parse_settings

    ours, vllm_args = split_argv(sys.argv[1:] if argv is None else argv)
    settings = parse_settings(build_parser(), ours)
    from atroposlib.utils.preflight import check_port_free

    busy = check_port_free(settings.host, settings.port, f"stop it or pass --port {settings.port + 1}")
    if busy:
        print(f"atropos-inference-node: {busy}", file=sys.stderr)
        return 2
    model = settings.model
    if model is None:
        from atroposlib.inference.bundled import prepare_bundled_model

        model = str(prepare_bundled_model())
    own_dir = settings.weights_dir is None
    weights_dir = Path(tempfile.mkdtemp(prefix="atropos-node-weights-")) if own_dir \
        else Path(settings.weights_dir)  # type: ignore[arg-type]
    weights_dir.mkdir(parents=True, exist_ok=True)
    settings = settings.model_copy(update={"model": model, "weights_dir": weights_dir})
    try:
        config_json = settings.to_env_json()
        api_key = settings.api_key_value()
    except ValueError as exc:
        print(f"atropos-inference-node: {exc}", file=sys.stderr)
        return 2
    try:
        return _serve(settings, vllm_args, {SETTINGS_ENV: config_json}, api_key is not None)
    finally:
        if own_dir:
            shutil.rmtree(weights_dir, ignore_errors=True)


def _serve(settings: Any, vllm_args: list[str], env: dict[str, str], auth: bool) -> int:
    """Start vLLM with the node middleware and keep it in the foreground until a signal."""
    from atroposlib.inference.vllm_process import VLLMProcess, run_foreground

    extra = ["--middleware", MIDDLEWARE]
    if settings.weight_transfer == "nccl":
        extra += ["--weight-transfer-config", '{"backend": "nccl"}']
    elif settings.weight_transfer == "nccl-sparse":  # vLLM's sparse (delta) NCCL engine
        extra += ["--weight-transfer-config", '{"backend": "sparse_nccl"}']
    vllm = VLLMProcess(settings.model, served_model_name=settings.served_model_name,
                       host=settings.host, port=settings.port, dtype=settings.dtype,
                       max_model_len=settings.max_model_len, extra_args=[*extra, *vllm_args],
                       env=env, log_path=settings.log, dev_mode=False)
    local = settings.host in ("127.0.0.1", "localhost", "::1")

    def announce() -> None:
        first = ("serving the starting model as policy version 0" if settings.serve_base else
                 "completions answer 503 until a trainer pushes weights (--serve-base to serve "
                 "the starting model at once)")
        print(f"atropos-inference-node: {settings.served_model_name!r} at {vllm.base_url}, "
              f"{first}; pushed weights land in {settings.weights_dir}; auth "
              f"{'on' if auth else 'off'}; vLLM log {vllm.log_path}", flush=True)
        if not local and not auth:
            print(f"atropos-inference-node: WARNING: listening on {settings.host} without an API "
                  "key: anyone who can reach this port can replace the weights; set "
                  "$ATROPOS_API_KEY or --api-key-file", file=sys.stderr, flush=True)

    return run_foreground(vllm, announce, settings.start_timeout_s, "atropos-inference-node: ")


if __name__ == "__main__":
    sys.exit(main())
