"""Atropos 0.4 parity: upstream's own test suite and its env files, on upstream and on ours.

Usage::

    python benchmarks/upstream_parity.py [--upstream-src CHECKOUT] [--only suite|envs]
                                         [--sets own,shared] [--json OUT.json]

What is measured, each side installed NON-editable from a wheel (what users get):

* ``upstream-0.4.0``: ``atroposlib==0.4.0`` from the package index;
* ``upstream-head``: upstream's repository (``--upstream-src``, a checkout; its ``main`` has a
  few tests and ``envs/teacher_distillation_env.py`` newer than 0.4.0), built into a wheel;
* ``ours``: this checkout, built into a wheel (``pip wheel --no-deps --no-build-isolation``).

Two dependency sets:

* ``own``: each side with its own declared dependencies, in its own venv: upstream with
  ``atroposlib[dev]==0.4.0`` (what its CI installs), ours with ``torch==2.13.0`` then
  ``atroposlib[all]`` from the wheel. ``upstream-head`` runs on upstream's venv.
* ``shared``: one venv holding the union of both sides' dependencies and no ``atroposlib``;
  each side's package comes from a ``pip install --no-deps --target`` folder on ``PYTHONPATH``.

Suite: upstream's ``atroposlib/tests`` (from the checkout when given, else from the 0.4.0 wheel),
run with pytest against each side (see ``tests/fixtures/upstream_suite.py``). Env files (needs
``--upstream-src``): every ``*.py`` file under the checkout's ``environments/``, through
``benchmarks/compat_env_files.py --every-file`` (import, a ``BaseEnv`` subclass found,
``config_init()``), with that ``environments`` package importable as in upstream's own layout:
each run gets a fresh copy of the folder, whose parent (holding nothing else; upstream's
``atroposlib`` is not there) is appended to ``sys.path``.

Everything is built under ``.bench/parity/`` (ignored by git); venvs are reused while their
requirements are unchanged, our wheel is rebuilt and reinstalled every run. Needs the package
index (pip); the suites and env files themselves run offline (``HF_HUB_OFFLINE=1``).
Prints one table per measurement and, per side, the tests that pass on upstream-0.4.0 and not
there. Take the heavy-work lock on a shared machine: ``flock /tmp/atropos-heavy.lock python ...``.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.upstream_suite import (  # noqa: E402
    OFFLINE_ENV,
    build_wheel,
    download_upstream_wheel,
    ensure_venv,
    extract_suite,
    run_suite,
)

TORCH = "torch==2.13.0"  # the local CPU wheel; install first so nothing pulls a CUDA build


def wheel_requires(wheel: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """The wheel's ``Requires-Dist`` entries: the core ones plus those of ``extras``."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        marker = marker.replace('"', "'").strip()
        if not marker or any(marker == f"extra == '{e}'" for e in extras):
            out.append(spec.strip())
    return out


def target_install(wheel: Path, dest: Path, python: Path) -> Path:
    """``pip install --no-deps --target dest wheel`` (replacing what was there); returns dest."""
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(dest),
                    str(wheel)], check=True)
    return dest


def prepare(bench: Path, upstream_src: Path | None, sets: list[str]) -> dict:
    """Build the wheels, venvs and target folders; return where everything is."""
    wheels = bench / "wheels"
    ours_whl = build_wheel(ROOT, wheels / "ours")
    up_whl = download_upstream_wheel(wheels / "upstream")
    head_whl = build_wheel(upstream_src, wheels / "upstream-head") if upstream_src else None
    pkgs = {"upstream-0.4.0": up_whl, "ours": ours_whl}
    if head_whl:
        pkgs["upstream-head"] = head_whl
    out: dict = {"wheels": {k: str(v) for k, v in pkgs.items()}, "python": {}, "targets": {}}
    # our wheel's path is the same every run: its dependencies decide when its venvs are rebuilt
    ours_deps = wheel_requires(ours_whl, ("all", "trainer", "tools", "dev", "envs"))
    if "own" in sets:
        print("[parity] venv own-upstream: atroposlib[dev]==0.4.0", flush=True)
        up_py = ensure_venv(bench / "own-upstream", [[f"{up_whl}[dev]"]])
        print("[parity] venv own-ours: torch 2.13.0, then atroposlib[all] from our wheel", flush=True)
        ours_py = ensure_venv(bench / "own-ours", [[TORCH], [f"{ours_whl}[all]"]], key=ours_deps)
        subprocess.run([str(ours_py), "-m", "pip", "install", "-q", "--no-deps",
                        "--force-reinstall", str(ours_whl)], check=True)
        out["python"]["own"] = {"upstream-0.4.0": up_py, "ours": ours_py}
        if head_whl:
            out["python"]["own"]["upstream-head"] = up_py
            out["targets"]["own"] = {"upstream-head": target_install(
                head_whl, bench / "pkgs-own" / "upstream-head", up_py)}
    if "shared" in sets:
        print("[parity] venv shared: torch 2.13.0, our [all] and upstream's [dev] dependencies, "
              "no atroposlib", flush=True)
        shared_py = ensure_venv(
            bench / "shared",
            [[TORCH], [f"{ours_whl}[all]", *wheel_requires(up_whl, ("dev",))]],
            remove=("atroposlib",), key=ours_deps)
        out["python"]["shared"] = dict.fromkeys(pkgs, shared_py)
        out["targets"]["shared"] = {
            side: target_install(whl, bench / "pkgs-shared" / side, shared_py)
            for side, whl in pkgs.items()}
    return out


def project_root(bench: Path, upstream_src: Path | None) -> Path | None:
    """A folder holding only a link to the checkout's ``environments`` (upstream's layout)."""
    if upstream_src is None:
        return None
    root = bench / "project"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "environments"
    if not link.is_symlink():
        link.symlink_to((upstream_src / "environments").resolve())
    return root


def measure_suite(bench: Path, setup: dict, suite: Path, project: Path | None) -> dict:
    """Run the suite for every (set, side); return ``{set: {side: {counts, passed ids}}}``."""
    results: dict = {}
    for set_name, pythons in setup["python"].items():
        results[set_name] = {}
        for side, python in pythons.items():
            target = setup["targets"].get(set_name, {}).get(side)
            start = time.monotonic()
            res = run_suite(python, suite, bench / "junit" / f"{set_name}-{side}.xml",
                            pythonpath=[target] if target else [], project_root=project)
            counts = res.count()
            print(f"[parity] suite {set_name:6s} {side:15s} passed {counts['passed']:3d} failed "
                  f"{counts['failed']:3d} errors {counts['error']:3d} skipped "
                  f"{counts['skipped']:3d} ({time.monotonic() - start:.0f} s)", flush=True)
            results[set_name][side] = {"counts": dict(counts), "outcomes": res.outcomes}
    return results


def fresh_tree(bench: Path, upstream_src: Path) -> Path:
    """A fresh copy of the checkout's ``environments/`` under ``bench/envs-tree`` (its root).

    Some env files write files next to themselves when imported; each run starts from the
    checkout's files, so every side imports the same ones.
    """
    root = bench / "envs-tree"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(upstream_src / "environments", root / "environments", symlinks=True)
    return root


def measure_envs(bench: Path, setup: dict, upstream_src: Path) -> dict:
    """Run compat_env_files.py over every file of the checkout's environments/, every side."""
    results: dict = {}
    script = ROOT / "benchmarks" / "compat_env_files.py"
    for set_name, pythons in setup["python"].items():
        results[set_name] = {}
        for side, python in pythons.items():
            project = fresh_tree(bench, upstream_src)
            target = setup["targets"].get(set_name, {}).get(side)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env.update(OFFLINE_ENV)
            if target:
                env["PYTHONPATH"] = str(target)
            out = bench / "envs" / f"{set_name}-{side}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            proc = subprocess.run(
                [str(python), str(script), str(project / "environments"), "--every-file",
                 "--project-root", str(project), "--json", str(out), "--timeout", "120"],
                env=env, capture_output=True, text=True, cwd=bench, start_new_session=True)
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"env files on {set_name}/{side} failed: {proc.stderr[-2000:]}")
            data = json.loads(out.read_text())
            t = data["totals"]
            print(f"[parity] envs  {set_name:6s} {side:15s} files {t['files']} import "
                  f"{t['import_ok']} subclass {t['files_with_env']} config_init "
                  f"{t['files_config_init_ok']} files / {t['config_init_ok']} of "
                  f"{t['env_classes']} classes ({time.monotonic() - start:.0f} s)", flush=True)
            results[set_name][side] = data
    return results


def print_report(suite: dict | None, envs: dict | None) -> None:
    """The tables, and per side what works on upstream-0.4.0 and not there."""
    if suite:
        print("\n## Upstream's test suite\n")
        print("| set | side | passed | failed | errors | skipped |\n|---|---|---|---|---|---|")
        for set_name, sides in suite.items():
            for side, r in sides.items():
                c = r["counts"]
                print(f"| {set_name} | {side} | {c.get('passed', 0)} | {c.get('failed', 0)} | "
                      f"{c.get('error', 0)} | {c.get('skipped', 0)} |")
        for set_name, sides in suite.items():
            for base in ("upstream-0.4.0", "upstream-head"):
                if base not in sides:
                    continue
                passed = {t for t, o in sides[base]["outcomes"].items() if o == "passed"}
                ours = sides["ours"]["outcomes"]
                lost = sorted(t for t in passed if ours.get(t) != "passed")
                print(f"\n{set_name}: passing on {base} and not on ours: {len(lost)}")
                for t in lost:
                    print(f"  {t}: {ours.get(t, 'absent')}")
    if envs:
        print("\n## Upstream's env files\n")
        print("| set | side | files | import | BaseEnv subclass found | config_init (files) | "
              "config_init (classes) |\n|---|---|---|---|---|---|---|")
        for set_name, sides in envs.items():
            for side, data in sides.items():
                t = data["totals"]
                print(f"| {set_name} | {side} | {t['files']} | {t['import_ok']} | "
                      f"{t['files_with_env']} | {t['files_config_init_ok']} | "
                      f"{t['config_init_ok']} / {t['env_classes']} |")
        for set_name, sides in envs.items():
            ours = {r["file"]: r for r in sides["ours"]["files"]}
            for base in ("upstream-0.4.0", "upstream-head"):
                if base not in sides:
                    continue
                lost = [r for r in sides[base]["files"] if r["import_ok"]
                        and not ours[r["file"]]["import_ok"]]
                print(f"\n{set_name}: env files importing on {base} and not on ours: {len(lost)}")
                for r in lost:
                    print(f"  {r['file']}: {ours[r['file']]['import_error']}")
                worse = [(r["file"], e["class"]) for r in sides[base]["files"] for e in r["envs"]
                         if e["config_init_ok"] and not any(
                             o["class"] == e["class"] and o["config_init_ok"]
                             for o in ours[r["file"]]["envs"])]
                print(f"{set_name}: env classes found and config_init-ing on {base} and not on "
                      f"ours: {len(worse)}")
                for file, cls in worse:
                    print(f"  {file}: {cls}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-src", type=Path,
                        help="a checkout of upstream's repository (needed for the env files)")
    parser.add_argument("--only", choices=("suite", "envs"), help="measure one thing only")
    parser.add_argument("--sets", default="own,shared",
                        help="dependency sets, comma-separated: own, shared (default both)")
    parser.add_argument("--bench-dir", type=Path, default=ROOT / ".bench" / "parity")
    parser.add_argument("--json", type=Path, default=None,
                        help="result file (default: benchmarks/results/upstream_parity_<date>.json)")
    args = parser.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    if args.only == "envs" and args.upstream_src is None:
        parser.error("the env files are only in upstream's repository: pass --upstream-src")
    src = args.upstream_src.resolve() if args.upstream_src else None
    bench = args.bench_dir.resolve()
    setup = prepare(bench, src, sets)
    project = project_root(bench, src)
    suite = envs = None
    if args.only in (None, "suite"):
        suite_src = src if src else Path(setup["wheels"]["upstream-0.4.0"])
        suite_dir = bench / ("suite-head" if src else "suite-0.4.0")
        subprocess.run(["rm", "-rf", str(suite_dir)], check=True)
        suite = measure_suite(bench, setup, extract_suite(suite_src, suite_dir), project)
    if args.only in (None, "envs") and src is not None:
        envs = measure_envs(bench, setup, src)
    print_report(suite, envs)
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json or default_result_path("upstream_parity"), "upstream_parity",
                 json.loads(json.dumps({"suite": suite, "envs": envs}, default=str)), seeds=None, argv=command_argv(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
