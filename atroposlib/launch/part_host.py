"""What runs inside the Ray actor that hosts one part on its node (``atropos-launch --ray``).

:class:`PartHost` is a plain class: :mod:`atroposlib.launch.ray_cluster` makes it a Ray actor
placed by the part's ``placement``. On its node it starts the part's command as a
:class:`~atroposlib.launch.supervision.Part` (own process group, log file under its own run
directory), keeps the output lines until the launcher reads them, and serves the files the part
wrote, in chunks, so nothing needs a filesystem shared with the launching host.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from atroposlib.launch.supervision import Part, write_private_files
from atroposlib.utils.offline import OFFLINE_ENV


class LineBuffer:
    """A console for :class:`Part` that keeps its lines until the launcher has read them.

    Lines are numbered from 0; :meth:`read` from line ``cursor`` drops every line before it
    (the reader has them), so the buffer holds only what was not read yet.
    """

    def __init__(self) -> None:
        """An empty buffer."""
        self._lines: list[str] = []
        self._first = 0  # number of the first line still held
        self._partial = ""
        self._cond = threading.Condition()

    def write(self, text: str) -> None:
        """Append ``text``; complete lines become readable."""
        with self._cond:
            pieces = (self._partial + text).split("\n")
            self._partial = pieces.pop()
            if pieces:
                self._lines.extend(pieces)
                self._cond.notify_all()

    def flush(self) -> None:
        """Nothing to flush: lines are readable as soon as they are complete."""

    def read(self, cursor: int, wait: float = 0.0) -> tuple[int, list[str]]:
        """Lines from number ``cursor`` on, waiting up to ``wait`` seconds for one.

        Returns:
            ``(next_cursor, lines)``: pass ``next_cursor`` to the next call.
        """
        with self._cond:
            end = self._first + len(self._lines)
            if cursor >= end and wait > 0:
                self._cond.wait(wait)
                end = self._first + len(self._lines)
            drop = max(0, min(cursor, end) - self._first)
            del self._lines[:drop]
            self._first += drop
            return end, self._lines[max(0, cursor - self._first):]


class PartHost:
    """Runs one part on this node and answers the launcher's questions about it.

    Every method is called remotely by the launcher (a threaded actor, so :meth:`read_lines`
    may wait while :meth:`poll` and :meth:`stop` answer).
    """

    def __init__(self, name: str, run_name: str, node_run_dir: str | None = None):
        """Create the part's run directory on this node: ``<node_run_dir>/<run_name>``.

        Args:
            name: the part's name (log prefix, ``logs/<name>.log``).
            run_name: the run's name (the launching host's run directory name).
            node_run_dir: the parent directory on this node (default: the temp dir +
                ``/atropos-runs``).
        """
        base = Path(node_run_dir) if node_run_dir else Path(tempfile.gettempdir()) / "atropos-runs"
        self.name = name
        self.run_dir = (base / run_name).resolve()
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._buffer = LineBuffer()
        self._part: Part | None = None

    def where(self) -> dict[str, Any]:
        """This node: Ray node id, IP, hostname, the Python and the run directory here."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "python": sys.executable, "run_dir": str(self.run_dir)}

    def free_port(self, host: str) -> int:
        """A TCP port free on ``host`` (this node's address) a moment ago."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]

    def start(self, argv: list[str], name: str | None = None,
              files: dict[str, str] | None = None) -> int:
        """Write ``files`` under the run dir, then start ``argv`` here in its own process group.

        The environment is this worker's (Ray sets ``CUDA_VISIBLE_DEVICES`` and
        ``OMP_NUM_THREADS`` from the placement) over the offline switches.

        Returns:
            The part's pid.
        """
        if name:
            self.name = name
        write_private_files(self.run_dir, files or {})
        self._part = Part(self.name, argv, self.run_dir / "logs", {**OFFLINE_ENV, **os.environ},
                          self._buffer, threading.Lock())  # type: ignore[arg-type]
        return self._part.proc.pid

    def read_lines(self, cursor: int, wait: float = 1.0) -> tuple[int, list[str], bool]:
        """Output lines from number ``cursor`` on (``[name] ...``), waiting up to ``wait`` s.

        Returns:
            ``(next_cursor, lines, finished)``; ``finished`` once the process exited and
            every line was returned.
        """
        finished = self._part is not None and self._part.output_closed()
        next_cursor, lines = self._buffer.read(cursor, 0.0 if finished else wait)
        return next_cursor, lines, finished and not lines

    def poll(self) -> int | None:
        """The part's exit code, or None while it runs (or before it started)."""
        return None if self._part is None else self._part.poll()

    def remember_descendants(self) -> None:
        """Record what the part spawned (e.g. vLLM in its own group), to stop it too."""
        if self._part is not None:
            self._part.remember_descendants()

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the part and its descendants, SIGKILL after ``timeout``; its exit code."""
        return None if self._part is None else self._part.stop(timeout)

    def list_files(self, rel: str) -> list[tuple[str, int]]:
        """``(path, bytes)`` of every file at ``rel`` (a file or a directory) under the run dir.

        Raises:
            ValueError: ``rel`` points outside the run directory.
        """
        path = self._inside(rel)
        if path.is_file():
            return [(rel, path.stat().st_size)]
        if not path.is_dir():
            return []
        return [(str(p.relative_to(self.run_dir)), p.stat().st_size)
                for p in sorted(path.rglob("*")) if p.is_file()]

    def read_file(self, rel: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of the file ``rel`` (under the run dir) from byte ``offset``.

        Raises:
            ValueError: ``rel`` points outside the run directory.
        """
        with open(self._inside(rel), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def _inside(self, rel: str) -> Path:
        path = (self.run_dir / rel).resolve()
        if path != self.run_dir and self.run_dir not in path.parents:
            raise ValueError(f"{rel!r} is outside the run directory {self.run_dir}")
        return path
