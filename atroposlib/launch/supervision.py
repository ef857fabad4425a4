"""Starting, watching and stopping the parts of a run: one child process each, logs prefixed ``[name]``.

A :class:`Backend` decides where each part runs and hands out a :class:`Site` for it: an
address other parts reach it at, a Python, a run directory, free ports, and a way to start the
part's command there. :class:`LocalBackend` runs every part as a child of ``atropos-launch``;
:mod:`atroposlib.launch.ray_cluster` runs each one as a Ray actor on the node its placement
picks. Either way a started part is watched through the same :class:`PartHandle` methods.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from atroposlib.errors import AtroposError
from atroposlib.launch.commands import free_port

if TYPE_CHECKING:
    from atroposlib.launch.config import Placement

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

    def output_closed(self) -> bool:
        """True once the process exited and every line of its output was passed on."""
        return self.proc.poll() is not None and not self._reader.is_alive()

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
    """A part failed to come up or died early (the message has its log tail).

    Attributes:
        part: the name of the part that failed (``api``, ``trainer``, an env's name), or None.
        reason: what happened to it, in one line (``exited early with code 3``).
    """

    def __init__(self, message: str, part: str | None = None, reason: str | None = None):
        """Keep ``part`` and ``reason`` beside the full message."""
        super().__init__(message)
        self.part = part
        self.reason = reason or message



class PartHandle(Protocol):
    """A started part, wherever it runs (a local :class:`Part` or a Ray actor's)."""

    name: str

    @property
    def log_path(self) -> Path:
        """The part's log on the launching host."""

    def poll(self) -> int | None:
        """Exit code, or None while running."""

    def tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of its log."""

    def remember_descendants(self) -> None:
        """Record what it spawned, to stop that too."""

    def stop(self, timeout: float) -> int | None:
        """SIGTERM it and its descendants, SIGKILL after ``timeout`` seconds; its exit code."""


class Site(ABC):
    """Where one part runs: its node's address, Python, run directory and free ports.

    Attributes:
        name: the part's name (log prefix).
        host: the address other parts use to reach a server this part runs (it binds there).
        python: the interpreter on that node.
        run_dir: the directory the part writes in, on its node.
        node: the node, in words, for the launch log.
        node_id: an identifier of the node (``"local"`` here, Ray's node id on a cluster).
    """

    name: str
    host: str
    python: str
    run_dir: str
    node: str
    node_id: str

    @abstractmethod
    def free_port(self) -> int:
        """A TCP port that was free on the part's node a moment ago (bound on :attr:`host`)."""

    @abstractmethod
    def start(self, argv: list[str], name: str | None = None,
              files: dict[str, str] | None = None) -> PartHandle:
        """Start ``argv`` there, named ``name`` (default: the site's) in logs.

        Args:
            argv: the command.
            name: the part's name in logs (default: the site's).
            files: ``{path relative to run_dir: text}`` written on the node first (mode 600;
                e.g. a server list that holds a key), for ``argv`` to name.
        """


class Backend(ABC):
    """Places parts on nodes and stops them all at the end."""

    @abstractmethod
    def place(self, name: str, placement: Placement, count: int = 1) -> list[Site]:
        """``count`` sites for part ``name``, each on a node that fits ``placement``.

        With ``count > 1`` (a trainer over several nodes) the sites are placed together, each
        on a different node, or not at all.

        Raises:
            LaunchError: the cluster has no node that fits (the message names the placement).
        """

    def collect(self, site: Site, into: Path, paths: list[str]) -> list[str]:
        """Copy ``paths`` (files or directories, relative to ``site.run_dir``) into ``into``.

        Returns:
            The paths that were copied (those that exist on the node). Here the part wrote
            into ``into`` already, so nothing is copied.
        """
        return []

    def close(self) -> None:  # noqa: B027 - an optional hook: the local backend holds nothing
        """Release what the backend holds (after every part was stopped)."""


class LocalSite(Site):
    """This host: parts are child processes of ``atropos-launch``."""

    def __init__(self, name: str, run_dir: Path, env: dict[str, str], console: TextIO,
                 lock: threading.Lock):
        """A site on this host writing under ``run_dir`` (logs in ``run_dir/logs``)."""
        self.name = name
        self.host = "127.0.0.1"
        self.python = sys.executable
        self.run_dir = str(run_dir)
        self.node = "this host"
        self.node_id = "local"
        self._env, self._console, self._lock = env, console, lock

    def free_port(self) -> int:
        """A free TCP port on 127.0.0.1."""
        return free_port()

    def start(self, argv: list[str], name: str | None = None,
              files: dict[str, str] | None = None) -> Part:
        """Write ``files`` under the run dir, then start ``argv`` in its own process group."""
        write_private_files(Path(self.run_dir), files or {})
        return Part(name or self.name, argv, Path(self.run_dir) / "logs", self._env,
                    self._console, self._lock)


class LocalBackend(Backend):
    """Every part on this host; placements are not used."""

    def __init__(self, run_dir: Path, env: dict[str, str], console: TextIO, lock: threading.Lock):
        """Parts write under ``run_dir`` with environment ``env``; output to ``console``."""
        self._args = (run_dir, env, console, lock)

    def place(self, name: str, placement: Placement, count: int = 1) -> list[Site]:
        """This host, once.

        Raises:
            LaunchError: ``count > 1`` (several nodes need ``--ray`` or torchrun by hand).
        """
        if count > 1:
            raise LaunchError(f"{name} asks for {count} nodes, but without --ray every part runs "
                              "on this host: pass --ray ADDRESS (or set ray: in the config), or "
                              "start torchrun on each node by hand (docs/tutorials/train-on-a-cluster.md)", part=name)
        return [LocalSite(name, *self._args)]


def write_private_files(run_dir: Path, files: dict[str, str]) -> None:
    """Write each ``{relative path: text}`` under ``run_dir``, readable by this user only.

    Raises:
        ValueError: a path points outside ``run_dir``.
    """
    root = run_dir.resolve()
    for rel, text in files.items():
        path = (root / rel).resolve()
        if root not in path.parents:
            raise ValueError(f"{rel!r} is outside the run directory {root}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
