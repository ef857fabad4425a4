"""The in-process sampler's HTTP server: uvicorn in a daemon thread of the trainer's process."""

from __future__ import annotations

import threading
import time
from typing import Any

from atroposlib.errors import InferenceError


class InProcessServer:
    """Serves an app on ``host:port`` from a thread, with the start/stop/health surface of a vLLM process.

    Attributes:
        base_url: ``http://HOST:PORT/v1`` once :meth:`start` returned.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None):
        """Describe the server; nothing listens until :meth:`start`.

        Args:
            app: the ASGI app (:func:`~atroposlib.inference.hf_rollout.factory.create_app`).
            host: interface to listen on (loopback by default).
            port: TCP port; None picks a free one.
        """
        self.app, self.host, self.port = app, host, port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stopping = False

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (raises RuntimeError before :meth:`start`)."""
        if self.port is None or self._thread is None:
            raise RuntimeError("the in-process sampler was not started; call start() first")
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> float:
        """Start listening; return the seconds it took.

        Raises:
            InferenceError: the port is taken, or the server did not start within ``timeout``.
        """
        import uvicorn

        from atroposlib.inference.process_group import find_free_port

        begin = time.perf_counter()
        if self.port is None:
            self.port = find_free_port()
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the trainer owns SIGINT/SIGTERM
        self._thread = threading.Thread(target=self._serve, name="hf-rollout-server", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise InferenceError(f"the in-process sampler could not listen on "
                                     f"{self.host}:{self.port}: {self._error or 'it exited'}; "
                                     "free the port or set another --vllm-port")
            if time.perf_counter() - begin > timeout:
                raise InferenceError(f"the in-process sampler did not start within {timeout:g} s")
            time.sleep(0.02)
        return time.perf_counter() - begin

    def _serve(self) -> None:
        try:
            self._server.run()
        except BaseException as exc:  # noqa: BLE001 - kept for death_report
            self._error = exc
        if self._error is None and not self._stopping and not self._server.started:
            self._error = RuntimeError("uvicorn exited before listening (port taken?)")

    def death_report(self) -> str | None:
        """None while it serves; why it stopped serving otherwise (before :meth:`stop`)."""
        if self._thread is None or self._stopping or self._thread.is_alive():
            return None
        return f"the in-process sampler's server thread ended: {self._error or 'it exited'}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening (requests in flight get ``timeout`` seconds to finish)."""
        self._stopping = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


__all__ = ["InProcessServer"]
