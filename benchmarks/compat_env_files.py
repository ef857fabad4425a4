"""Measure how many Atropos-style environment files import and ``config_init()`` on this interpreter.

Usage::

    python benchmarks/compat_env_files.py DIR [--project-root ROOT] [--json OUT.json] [--timeout 60]
                                          [--shard K/N]

Every ``*.py`` under DIR (skipping ``__init__.py`` and ``test_*.py``) is imported in its own
forked child process, from a temporary working directory outside any repository, with the file's
own directory on ``sys.path`` (as ``python path/to/env.py`` would have it) and, with
``--project-root``, that directory appended to ``sys.path`` after site-packages (as an editable
install of a checkout adds its root), so the project's own ``environments`` package imports
(``from environments.community.x import ...``). For each class defined in
the file that subclasses ``atroposlib.envs.base.BaseEnv``, ``cls.config_init()`` is called and
its result checked to be a pair ``(env_config, server_configs)``. Which ``atroposlib`` is
measured is whichever the interpreter imports: set ``PYTHONPATH`` to a checkout to measure it.

``--shard K/N`` probes only every N-th file from the K-th (0-based) of the sorted list, so N
runs side by side cover every file once (``benchmarks/compat_upstream.py`` does so).

Prints one line per file (``import ok|FAIL``, then each env class's ``config_init`` outcome),
the totals, and with ``--json`` writes the per-file records. Nothing here reaches the network
on purpose; a file whose import tries to download fails the same way on every package measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import multiprocessing
import os
import sys
import tempfile
import traceback
from pathlib import Path

# Third-party and package modules most env files import; importing them in the parent before
# forking means a child does not pay for them again. Results do not depend on this list.
_WARM = (
    "atroposlib.utils.tokenize_for_trainer", "atroposlib.type_definitions",
    "transformers", "datasets", "openai", "tqdm.asyncio", "math_verify",
    "latex2sympy2_extended", "wandb", "numpy",
)


def _error(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"[:300]


def _probe_in_child(path: Path, out: Path, project_root: Path | None = None) -> None:
    """Child body: import ``path`` as a module, call ``config_init`` on its BaseEnv subclasses."""
    import atroposlib
    from atroposlib.envs.base import BaseEnv

    rec: dict = {"file": str(path), "atroposlib": atroposlib.__file__, "import_ok": False,
                 "import_error": None, "envs": []}
    sys.path.insert(0, str(path.parent))
    if project_root is not None:
        sys.path.append(str(project_root))
    try:
        spec = importlib.util.spec_from_file_location("env_under_test", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["env_under_test"] = mod
        spec.loader.exec_module(mod)
        rec["import_ok"] = True
    except BaseException as exc:  # SystemExit from an argparse at import time is a failure too
        rec["import_error"] = _error(exc)
        rec["import_trace"] = traceback.format_exc()[-1500:]
    if rec["import_ok"]:
        for name, cls in list(vars(mod).items()):  # config_init may add module globals
            if not (inspect.isclass(cls) and issubclass(cls, BaseEnv) and cls is not BaseEnv
                    and cls.__module__ == mod.__name__):
                continue
            env = {"class": name, "config_init_ok": False, "error": None}
            try:
                res = cls.config_init()
                if not (isinstance(res, tuple) and len(res) == 2):
                    raise TypeError(f"config_init returned {type(res).__name__}, not a 2-tuple")
                env["config_init_ok"] = True
                env["env_config_type"] = type(res[0]).__name__
                env["server_configs_type"] = type(res[1]).__name__
            except BaseException as exc:
                env["error"] = _error(exc)
                env["trace"] = traceback.format_exc()[-1500:]
            rec["envs"].append(env)
    out.write_text(json.dumps(rec))


def env_files(root: Path, every_file: bool = False) -> list[Path]:
    """Python files under ``root`` that may hold an env: not ``__init__.py``, not ``test_*.py``.

    With ``every_file``, all ``*.py`` files (``__init__.py`` and ``test_*.py`` too).
    """
    return sorted(
        p for p in root.rglob("*.py")
        if every_file or (p.name != "__init__.py" and not p.name.startswith("test_"))
    )


def probe(path: Path, timeout: float, project_root: Path | None = None) -> dict:
    """Import ``path`` in a forked child (cwd: an empty temp dir); return its record.

    The parent has already imported ``atroposlib.envs.base``, so each child starts from the
    same warm interpreter instead of paying the package import again; module state a file
    leaves behind dies with its child.
    """
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as cwd:
        out = Path(cwd) / "result.json"
        old = os.getcwd()
        os.chdir(cwd)
        try:
            child = ctx.Process(target=_probe_in_child, args=(path, out, project_root))
            child.start()
            child.join(timeout)
            if child.is_alive():
                child.kill()
                child.join()
                return {"file": str(path), "import_ok": False,
                        "import_error": f"Timeout: import took over {timeout:.0f} s", "envs": []}
        finally:
            os.chdir(old)
        if not out.exists():
            return {"file": str(path), "import_ok": False,
                    "import_error": f"ChildDied: exit code {child.exitcode}", "envs": []}
        return json.loads(out.read_text())


def count(records: list[dict]) -> dict:
    """Totals over per-file records (as :func:`probe` returns them).

    Returns:
        ``files``; ``import_ok`` (files that imported); ``files_with_env`` (files defining a
        ``BaseEnv`` subclass); ``env_classes`` and ``config_init_ok`` (classes, and those whose
        ``config_init()`` returned a pair); ``files_config_init_ok`` (files with an env class
        whose classes all did); ``atroposlib`` (the package file the children imported).
    """
    return {
        "files": len(records),
        "import_ok": sum(r["import_ok"] for r in records),
        "files_with_env": sum(bool(r["envs"]) for r in records),
        "env_classes": sum(len(r["envs"]) for r in records),
        "config_init_ok": sum(e["config_init_ok"] for r in records for e in r["envs"]),
        "files_config_init_ok": sum(
            bool(r["envs"]) and all(e["config_init_ok"] for e in r["envs"]) for r in records),
        "atroposlib": next((r.get("atroposlib") for r in records if r.get("atroposlib")), None),
    }


def shard(paths: list[Path], spec: str | None) -> list[Path]:
    """The ``K/N`` shard of ``paths``: every N-th path from the K-th (0-based); all when None.

    Raises:
        ValueError: ``spec`` is not ``K/N`` with ``0 <= K < N``.
    """
    if spec is None:
        return paths
    k, sep, n = spec.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise ValueError(f"--shard must be K/N with 0 <= K < N (e.g. 0/4), not {spec!r}")
    return paths[int(k)::int(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory of env files")
    parser.add_argument("--json", type=Path, help="write per-file records here")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per file")
    parser.add_argument("--every-file", action="store_true",
                        help="also import __init__.py and test_*.py files")
    parser.add_argument("--project-root", type=Path,
                        help="appended to sys.path (a checkout whose environments/ files import "
                        "each other as environments.<...>)")
    parser.add_argument("--shard", metavar="K/N",
                        help="probe only every N-th file from the K-th (0-based)")
    args = parser.parse_args(argv)
    try:
        paths = shard(env_files(args.root.resolve(), args.every_file), args.shard)
    except ValueError as exc:
        parser.error(str(exc))

    import atroposlib.envs.base  # noqa: F401  (warm the package once; children are forked)

    for name in _WARM:  # speed only: what every child would import anyway, loaded once
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (a package missing here fails in the child, visibly)
            pass

    records = []
    for path in paths:
        rec = probe(path, args.timeout, args.project_root)
        rec["file"] = str(path.relative_to(args.root.resolve()))
        records.append(rec)
        envs = " ".join(
            f"{e['class']}:{'ok' if e['config_init_ok'] else 'FAIL(' + (e['error'] or '') + ')'}"
            for e in rec["envs"]
        )
        status = "ok" if rec["import_ok"] else f"FAIL({rec['import_error']})"
        print(f"{rec['file']}: import {status} {envs}".rstrip(), flush=True)

    totals = count(records)
    print(json.dumps(totals))
    if args.json:
        args.json.write_text(json.dumps({"totals": totals, "files": records}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
