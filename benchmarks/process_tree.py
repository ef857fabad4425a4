"""A benchmark's child process in its own session: its descendants, their peak RSS and PSS per part, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from atroposlib.utils.offline import OFFLINE_ENV

ROOT = Path(__file__).resolve().parents[1]

#: (part, substring of the command line), first match wins; anything else is ``other``
PARTS: tuple[tuple[str, str], ...] = (
    ("vllm-worker", "VLLM::Worker"),
    ("vllm-engine", "VLLM::EngineCore"),
    ("vllm-api", "vllm.entrypoints"),
    ("trainer", "example_trainer"),
    ("trainer", "atropos-grpo"),
    ("run-api", "atroposlib.cli.run_api"),
    ("launcher", "atroposlib.cli.launch"),
    ("trl", "--trl-worker"),
    ("env", " serve"),
    ("eval", " evaluate"),
)


def part_of(cmdline: str) -> str:
    """The part a process belongs to, from its command line (see :data:`PARTS`)."""
    return next((part for part, needle in PARTS if needle in cmdline), "other")


class Tree:
    """A child started in its own session; tracks its descendants and their RSS.

    A poller samples every known process's RSS every ``interval`` seconds. Kept: the peak of
    the tree's total (``peak_rss``) and, per part (:func:`part_of`: trainer, vllm-api,
    vllm-engine, vllm-worker, env, run-api, launcher, trl ...), the peak of that part's sum
    (``peak_rss_by_part``). A part's peak and the total's need not fall in the same sample,
    so the parts' peaks may add up to more than the total's: ``rss_by_part_at_peak`` is the
    sample that set the total's peak, and ``other_cmdlines`` names the processes counted as
    ``other`` (a fork that has not exec'd yet shows its parent's whole resident set).

    Use it as a context manager (the tree is stopped on exit); every tree started and not
    stopped yet is in :data:`LIVE`, so a bench can stop them all when it is interrupted.

    RSS counts a shared page (a library that several processes map, such as libtorch) once in
    every process; every ``pss_every``-th sample also reads the proportional set size (PSS:
    each shared page split between the processes that map it), and ``peak_pss`` is the peak
    of the tree's total PSS: the memory the tree really needs.
    """

    def __init__(self, argv: list[str], log_path: Path, cwd: Path = ROOT, interval: float = 0.5,
                 env: dict[str, str] | None = None, pss_every: int = 4):
        """Start ``argv`` (offline env vars set, output to ``log_path``) and the RSS poller."""
        import psutil

        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        full_env = {**os.environ, **OFFLINE_ENV, **(env or {}), "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        LIVE.add(self)
        self.root = psutil.Process(self.proc.pid)
        self.known: dict[int, Any] = {self.proc.pid: self.root}
        self.parts: dict[int, str] = {}
        self.parents: dict[int, int] = {}
        self.peak_rss = 0
        self.peak_rss_by_part: dict[str, int] = {}
        self.rss_by_part_at_peak: dict[str, int] = {}
        self.other_cmdlines: dict[str, int] = {}  # command line (first 200 chars) -> its peak RSS
        self.peak_pss = 0
        self.interval = interval
        self.pss_every = pss_every
        self._samples = 0
        self._done = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True, name="rss")
        self._poller.start()

    def _part(self, pid: int, proc: Any) -> str:
        import psutil

        if self.parts.get(pid, "other") == "other":  # a spawned child renames itself later
            try:
                self.parts[pid] = part_of(" ".join(proc.cmdline()) or proc.name())
                self.parents.setdefault(pid, proc.ppid())
            except psutil.Error:
                return "other"
        part = self.parts[pid]
        if part == "other":  # until it does, it counts as its parent's (vLLM's API server
            parent = self.parts.get(self.parents.get(pid, -1), "other")  # spawns its engine)
            part = "vllm-engine" if parent == "vllm-api" else parent
        return part

    def sample(self) -> dict[str, int]:
        """One sample: RSS bytes per part now (also updates the peaks)."""
        import psutil

        try:
            for child in self.root.children(recursive=True):
                self.known.setdefault(child.pid, child)
        except psutil.Error:
            pass
        now: dict[str, int] = {}
        pss = 0
        with_pss = self._samples % self.pss_every == 0
        self._samples += 1
        for pid, proc in list(self.known.items()):
            try:
                rss = proc.memory_info().rss
                if with_pss:
                    pss += proc.memory_full_info().pss
            except psutil.Error:
                self.known.pop(pid, None)
                continue
            part = self._part(pid, proc)
            now[part] = now.get(part, 0) + rss
            if part == "other":
                try:
                    name = (" ".join(proc.cmdline()) or proc.name())[:200]
                except psutil.Error:
                    name = f"pid {pid} (gone)"
                self.other_cmdlines[name] = max(self.other_cmdlines.get(name, 0), rss)
        if sum(now.values()) > self.peak_rss:
            self.peak_rss, self.rss_by_part_at_peak = sum(now.values()), dict(now)
        self.peak_pss = max(self.peak_pss, pss)
        for part, rss in now.items():
            self.peak_rss_by_part[part] = max(self.peak_rss_by_part.get(part, 0), rss)
        return now

    def _poll(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(self.interval)

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
