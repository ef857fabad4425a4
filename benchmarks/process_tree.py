"""A benchmark's child process in its own session: its descendants, their peak RSS, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from atroposlib.utils.offline import OFFLINE_ENV

ROOT = Path(__file__).resolve().parents[1]


class Tree:
    """A child started in its own session; tracks its descendants and the tree's peak RSS.

    Use it as a context manager (the tree is stopped on exit); every tree started and not
    stopped yet is in :data:`LIVE`, so a bench can stop them all when it is interrupted.
    """

    def __init__(self, argv: list[str], log_path: Path, cwd: Path = ROOT):
        """Start ``argv`` (offline env vars set, output to ``log_path``) and a 0.5 s RSS poller."""
        import psutil

        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        LIVE.add(self)
        self.root = psutil.Process(self.proc.pid)
        self.known: dict[int, Any] = {self.proc.pid: self.root}
        self.peak_rss = 0
        self._done = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True, name="rss")
        self._poller.start()

    def _poll(self) -> None:
        import psutil

        while not self._done.is_set():
            total = 0
            try:
                for child in self.root.children(recursive=True):
                    self.known.setdefault(child.pid, child)
            except psutil.Error:
                pass
            for pid, proc in list(self.known.items()):
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    self.known.pop(pid, None)
            self.peak_rss = max(self.peak_rss, total)
            self._done.wait(0.5)

    def wait(self, timeout: float) -> int:
        """Exit code; on timeout the tree is stopped and TimeoutError raised."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self.stop()
            raise TimeoutError(f"{self.proc.args[:4]} ran past {timeout:.0f}s; see {self.log_path}") from exc

    def stop(self, grace: float = 40.0) -> None:
        """SIGTERM the child (our launcher then stops its parts), then SIGKILL every known pid."""
        import psutil

        LIVE.discard(self)
        self._done.set()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        alive = [p for pid, p in self.known.items() if pid != self.proc.pid and _running(p)]
        for proc in alive:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(alive, timeout=10)
        for proc in still:
            try:
                proc.kill()
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._log.close()


    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: Trees started and not stopped yet.
LIVE: set[Tree] = set()


def _running(proc: Any) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


__all__ = ["LIVE", "Tree"]
