"""Upstream's env files on this package (and on upstream's own): the compatibility table's figures.

Usage::

    git clone https://github.com/NousResearch/atropos /tmp/atropos-upstream
    python benchmarks/compat_upstream.py /tmp/atropos-upstream [--upstream-python VENV/bin/python]
                                        [--jobs 2] [--timeout 120] [--json-out RESULT.json]

Counts every ``*.py`` file under the checkout's ``environments/`` (``__init__.py`` and
``test_*.py`` included), then runs ``benchmarks/compat_env_files.py --every-file`` over them:
each file imported in its own process, ``config_init()`` called on each ``BaseEnv`` subclass it
defines. The files are imported from upstream's layout: a fresh copy of ``environments/`` in a
temporary folder that holds nothing else and is appended to ``sys.path``, so the files'
``from environments.community.x import ...`` work as in upstream's repository.

Sides: ``ours`` is this checkout's ``atroposlib`` on the interpreter running this script (its
root goes first on ``PYTHONPATH``). With ``--upstream-python``, the interpreter of a venv where
upstream's package is installed (``pip install torch==2.13.0`` first, then
``pip install atroposlib==0.4.0``) measures upstream too, with its own dependencies and no
``PYTHONPATH``. ``--jobs N`` runs N shards of each side side by side.

Writes ``benchmarks/results/compat_upstream_<date>.json`` (or ``--json-out``) through
:func:`benchmarks.results.write_result` (``meta``: the command, this checkout's commit, machine,
date): the upstream checkout's commit, per side the totals and one record per file (import outcome and error, each env class and its ``config_init()`` outcome), and with
two sides what works on upstream and not here. Offline: ``HF_HUB_OFFLINE=1``; a file that needs
the network fails the same way on every side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.compat_env_files import count, env_files  # noqa: E402
from benchmarks.results import command_argv, default_result_path, git_commit, write_result  # noqa: E402
from benchmarks.upstream_parity import fresh_tree  # noqa: E402
from tests.fixtures.upstream_suite import OFFLINE_ENV  # noqa: E402

PROBE = ROOT / "benchmarks" / "compat_env_files.py"
#: record keys dropped from the result file (tracebacks: long, and in the printed log anyway)
_DROP = ("import_trace", "trace", "atroposlib")
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^'.]+)")


def package_version(python: Path, env: dict[str, str]) -> tuple[str, str]:
    """``(version, file)`` of the ``atroposlib`` that ``python`` imports under ``env``.

    Raises:
        RuntimeError: that interpreter cannot import atroposlib (the message has its error).
    """
    code = ("import atroposlib, importlib.metadata as m; "
            "print(m.version('atroposlib')); print(atroposlib.__file__)")
    # from an empty folder: ``python -c`` puts the working directory first on sys.path, and
    # from a checkout's root that would import the checkout's package instead of the venv's
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True,
                              cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} cannot import atroposlib; install it into that venv "
                           f"(pip install torch==2.13.0, then atroposlib==0.4.0):\n{proc.stderr[-1500:]}")
    version, file = proc.stdout.split()[-2:]
    return version, file


def side_env(pythonpath: Path | None) -> dict[str, str]:
    """The child environment: offline, ``PYTHONPATH`` set to ``pythonpath`` only (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OFFLINE_ENV)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def summarise(records: list[dict]) -> dict:
    """Totals over per-file records plus why imports failed.

    Returns:
        :func:`benchmarks.compat_env_files.count`'s totals, with ``import_errors`` (failed
        imports per exception type) and ``missing_modules`` (top-level module name -> files
        that failed with ``ModuleNotFoundError`` for it).
    """
    totals = count(records)
    failed = [r["import_error"] or "" for r in records if not r["import_ok"]]
    totals["import_errors"] = dict(Counter(e.split(":")[0] for e in failed).most_common())
    totals["missing_modules"] = dict(Counter(
        m.group(1) for e in failed if (m := _MISSING.match(e))).most_common())
    return totals


def measure(upstream: Path, python: Path, env: dict[str, str], package: str, jobs: int,
            timeout: float, work: Path) -> list[dict]:
    """Probe every file of ``upstream/environments`` on one side; return records sorted by file.

    ``jobs`` shards of ``compat_env_files.py`` run side by side on a fresh copy of the folder.

    Raises:
        RuntimeError: a shard failed (its stderr is in the message), or a file imported another
            ``atroposlib`` than ``package`` (the side's package file).
    """
    project = fresh_tree(work, upstream)
    outs = [work / f"shard-{k}.json" for k in range(jobs)]
    procs = [subprocess.Popen(
        [str(python), str(PROBE), str(project / "environments"), "--every-file",
         "--project-root", str(project), "--json", str(out), "--timeout", str(timeout),
         "--shard", f"{k}/{jobs}"],
        env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True) for k, out in enumerate(outs)]
    records: list[dict] = []
    for proc, out in zip(procs, outs, strict=True):
        _, err = proc.communicate()
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{PROBE.name} {out.stem} failed (exit {proc.returncode}):\n{err[-2000:]}")
        records += json.loads(out.read_text())["files"]
    imported = {r["atroposlib"] for r in records if r.get("atroposlib")}
    if imported - {package}:
        raise RuntimeError(f"the env files imported atroposlib from {sorted(imported)}, not {package}")
    for rec in records:
        for key in _DROP:
            rec.pop(key, None)
        for env_rec in rec["envs"]:
            env_rec.pop("trace", None)
    return sorted(records, key=lambda r: r["file"])


def compare(base: list[dict], ours: list[dict]) -> dict:
    """What works on ``base`` (upstream) and not on ``ours``, and the reverse, file by file.

    Returns:
        ``import_lost`` / ``import_gained``: files importing on one side only;
        ``config_init_lost``: ``"file:Class"`` configured on upstream and not here.
    """
    here = {r["file"]: r for r in ours}
    lost = [r["file"] for r in base if r["import_ok"] and not here[r["file"]]["import_ok"]]
    gained = [r["file"] for r in base if not r["import_ok"] and here[r["file"]]["import_ok"]]
    cfg_lost = [f"{r['file']}:{e['class']}" for r in base for e in r["envs"] if e["config_init_ok"]
                and not any(o["class"] == e["class"] and o["config_init_ok"]
                            for o in here[r["file"]]["envs"])]
    return {"import_lost": lost, "import_gained": gained, "config_init_lost": cfg_lost}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream", type=Path, help="a checkout of github.com/NousResearch/atropos")
    parser.add_argument("--upstream-python", type=Path,
                        help="python of a venv with upstream's atroposlib: measure it too")
    parser.add_argument("--jobs", type=int, default=2, help="shards run side by side (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per file (default 120)")
    parser.add_argument("--json-out", type=Path, help="result file (default "
                        "benchmarks/results/compat_upstream_<date>.json)")
    args = parser.parse_args(argv)
    upstream = args.upstream.resolve()
    if not (upstream / "environments").is_dir():
        parser.error(f"{upstream} has no environments/ folder: pass a checkout of "
                     "github.com/NousResearch/atropos (git clone it first)")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    if args.upstream_python is not None and not args.upstream_python.exists():
        parser.error(f"--upstream-python {args.upstream_python} does not exist: create the venv "
                     "(python3 -m venv V; V/bin/pip install torch==2.13.0; "
                     "V/bin/pip install atroposlib==0.4.0)")

    files = env_files(upstream / "environments", every_file=True)
    result = {"upstream_sha": git_commit(upstream)["sha"], "jobs": args.jobs,
              "timeout_s": args.timeout, "offline_env": OFFLINE_ENV,
              "upstream_files": len(files), "sides": {}}
    sides = [("ours", Path(sys.executable), side_env(ROOT))]
    if args.upstream_python is not None:
        sides.append(("upstream", args.upstream_python, side_env(None)))
    with tempfile.TemporaryDirectory(prefix="compat-upstream-") as tmp:
        for name, python, env in sides:
            version, package = package_version(python, env)
            if (name == "ours") != Path(package).is_relative_to(ROOT):
                raise RuntimeError(f"side {name} imports atroposlib from {package}: ours must come "
                                   f"from {ROOT}, upstream's from its venv")
            if name == "upstream":
                name = f"upstream-{version}"
            begin = time.monotonic()
            records = measure(upstream, python, env, package, args.jobs, args.timeout,
                              Path(tmp) / name)
            seconds = time.monotonic() - begin
            totals = summarise(records)
            result["sides"][name] = {"python": str(python), "atroposlib_version": version,
                                     "atroposlib_file": package, "seconds": round(seconds, 1),
                                     "totals": totals, "files": records}
            print(f"[compat] {name}: {totals['files']} files, import {totals['import_ok']}, "
                  f"BaseEnv subclass {totals['files_with_env']}, config_init "
                  f"{totals['files_config_init_ok']} files / {totals['config_init_ok']} of "
                  f"{totals['env_classes']} classes ({seconds:.0f} s)", flush=True)
    names = list(result["sides"])
    if len(names) == 2:
        diff = compare(result["sides"][names[1]]["files"], result["sides"]["ours"]["files"])
        result["compare"] = {"base": names[1], **diff}
        print(f"[compat] on {names[1]} and not on ours: {len(diff['import_lost'])} imports, "
              f"{len(diff['config_init_lost'])} config_init; on ours only: "
              f"{len(diff['import_gained'])} imports", flush=True)
    write_result(args.json_out or default_result_path("compat_upstream"), "compat_upstream",
                 result, seeds=None, argv=command_argv(__file__, argv),
                 notes="Nothing here is random (seeds: none). Each side's env files are imported "
                       "from a fresh copy of the checkout's environments/ folder, offline.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
