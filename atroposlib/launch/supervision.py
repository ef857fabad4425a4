"""Starting, watching and stopping the parts of a run: one child process each, logs prefixed ``[name]``."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, TextIO

from atroposlib.errors import AtroposError


class Part:
    """One child process: own process group, output to a log file and the prefixed console."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str],
                 console: TextIO, console_lock: threading.Lock):
        """Start ``argv`` now.

        Args:
            name: prefix and log-file name.
            argv: the command.
            log_dir: where ``<name>.log`` goes.
            env: full environment of the child.
            console: stream for prefixed output (stdout).
            console_lock: serialises console lines from all parts.
        """
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115
        self._log.write(f"$ {shlex.join(argv)}\n".encode())
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self._descendants: dict[int, Any] = {}
        self._reader = threading.Thread(target=self._pump, args=(console, console_lock),
                                        daemon=True, name=f"log-{name}")
        self._reader.start()

    def _pump(self, console: TextIO, lock: threading.Lock) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self._log.write(raw)
            line = raw.decode(errors="replace").rstrip("\n")
            # tqdm progress bars redraw with \r; show only the final state of the line
            line = line.split("\r")[-1]
            with lock:
                console.write(f"[{self.name}] {line}\n")
                console.flush()

    def poll(self) -> int | None:
        """Exit code, or None while running."""
        return self.proc.poll()

    def remember_descendants(self) -> None:
        """Record the pids this part spawned (e.g. vLLM in its own group) to stop them later."""
        import psutil

        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self._descendants[child.pid] = child
        except psutil.Error:
            pass

    def tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of this part's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the part's process group (ignored when already gone)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the group and recorded descendants; SIGKILL what is left after ``timeout``."""
        import psutil

        self.remember_descendants()
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
        for proc in list(self._descendants.values()):
            try:
                proc.terminate()
            except psutil.Error:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(10)
        alive = []
        for proc in self._descendants.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(alive, timeout=timeout)
        for proc in still:
            try:
                proc.kill()
            except psutil.Error:
                pass
        self._reader.join(5)
        self._log.close()
        return self.proc.returncode


class LaunchError(AtroposError, RuntimeError):
    """A part failed to come up or died early (the message has its log tail)."""

