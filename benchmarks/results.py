"""The one way a benchmark writes its result file: the numbers plus where they came from.

Every benchmark in ``benchmarks/`` ends with :func:`write_result`. The file is JSON with the
benchmark's own payload (every raw number behind each ratio it prints) and a ``meta`` record:
the command line, the git commit (and whether the tree had uncommitted changes), the machine
(CPU cores, RAM, GPU or none), the UTC date and the seeds. ``docs/benchmarks.md`` and the
README's figures are generated from these files (``make bench-docs``), so a figure without a
file cannot be published.

By default a result goes to ``benchmarks/results/<benchmark>_<YYYY-MM-DD>.json``
(:func:`default_result_path`); every benchmark's ``--json-out`` overrides it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: where published result files live
RESULTS_DIR = ROOT / "benchmarks" / "results"


def default_result_path(benchmark: str, tag: str | None = None,
                        day: dt.date | None = None) -> Path:
    """``benchmarks/results/<benchmark>[_<tag>]_<YYYY-MM-DD>.json`` for today (UTC) or ``day``."""
    day = day or dt.datetime.now(dt.UTC).date()
    return RESULTS_DIR / f"{benchmark}{'_' + tag if tag else ''}_{day.isoformat()}.json"


def git_commit(cwd: Path = ROOT) -> dict[str, Any]:
    """``{"sha", "dirty"}`` of the checkout at ``cwd``; ``sha`` None outside a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if sha else None
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def machine() -> dict[str, Any]:
    """The machine a result was measured on.

    Returns:
        ``{"cpu_cores", "cpu_cores_usable", "cpu_model", "cpu_native_bf16", "ram_bytes", "gpu",
        "platform", "python"}``. ``cpu_native_bf16`` says whether the CPU has bfloat16
        instructions (AVX512_BF16, AMX-BF16, Arm BF16): without them bf16 runs (the quickstart's
        sampler and trainer) are several times slower, so results from the two kinds of CPU do
        not compare.
        ``gpu`` is a list of GPU names (from torch when it is already imported and sees CUDA,
        else from ``nvidia-smi``), or None when there is none. ``cpu_cores_usable`` is the
        process's CPU affinity, which can be smaller than ``cpu_cores``.
    """
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    from atroposlib.utils.cpu_features import cpu_model, native_bf16

    return {"cpu_cores": os.cpu_count(), "cpu_cores_usable": usable, "cpu_model": cpu_model(),
            "cpu_native_bf16": native_bf16(), "ram_bytes": ram,
            "gpu": _gpus(), "platform": sys.platform, "python": sys.version.split()[0]}


def _gpus() -> list[str] | None:
    torch = sys.modules.get("torch")  # never import torch just to look
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:  # noqa: BLE001 - a broken CUDA setup means "no usable GPU" here
            return None
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        return names if done.returncode == 0 and names else None
    return None


def command_argv(script: str | Path, argv: list[str] | None) -> list[str] | None:
    """The command line of a ``main(argv)`` call: ``[script, *argv]``, or None (use ``sys.argv``).

    A benchmark whose ``main`` takes ``argv`` (tests call it so) passes this to
    :func:`write_result`, so the recorded command is the benchmark's and not the caller's.
    """
    return None if argv is None else [str(script), *argv]


def meta(benchmark: str, *, seeds: Any, argv: list[str] | None = None,
         now: dt.datetime | None = None) -> dict[str, Any]:
    """The ``meta`` record of a result file.

    Args:
        benchmark: the benchmark's name (its script's stem, e.g. ``"bench_api"``).
        seeds: every seed the run used (a dict of name -> seed, a list, or None when the
            benchmark has no randomness it controls; say so rather than leave it out).
        argv: the command line; default ``sys.argv`` as run (``python`` + script + args).
        now: the date to record (default: now, UTC).

    Returns:
        ``{"benchmark", "command", "git", "machine", "date", "seeds"}``.
    """
    argv = list(sys.argv) if argv is None else list(argv)
    if argv and argv[0].endswith(".py"):
        try:
            argv[0] = str(Path(argv[0]).resolve().relative_to(ROOT))
        except ValueError:
            pass
        argv = ["python", *argv]
    return {"benchmark": benchmark, "command": shlex.join(argv), "git": git_commit(),
            "machine": machine(),
            "date": (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
            "seeds": seeds}


def write_result(path: Path | str, benchmark: str, payload: dict[str, Any], *, seeds: Any,
                 notes: str | list[str] | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Write a result file: ``payload`` plus ``meta`` (and ``notes`` if given).

    Args:
        path: the JSON file; its folder is created.
        benchmark: the benchmark's name, for ``meta``.
        payload: the benchmark's numbers: every raw figure behind each ratio it reports.
            Must not have a ``meta`` key, and must be JSON-serialisable.
        seeds: see :func:`meta`.
        notes: what the figures mean, how the run went; kept with the numbers.
        argv: see :func:`meta`.

    Returns:
        What was written.

    Raises:
        ValueError: ``payload`` already has ``meta`` or ``notes`` (they are this function's).
        TypeError: ``payload`` holds something JSON cannot write.
    """
    for key in ("meta", "notes"):
        if key in payload:
            raise ValueError(f"the payload has its own {key!r} key; write_result adds it: rename yours")
    record = {"meta": meta(benchmark, seeds=seeds, argv=argv), **payload}
    if notes is not None:
        record["notes"] = notes
    text = json.dumps(record, indent=2)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(f"[bench] wrote {path}", flush=True)
    return record


def read_result(path: Path | str) -> dict[str, Any]:
    """A result file's JSON.

    Raises:
        FileNotFoundError: no such file (its message names the path).
        ValueError: the file is not JSON.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
