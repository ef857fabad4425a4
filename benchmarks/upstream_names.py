"""Count Atropos 0.4 public names importable at the same path here (no download).

Usage: python benchmarks/upstream_names.py UPSTREAM_SITE_PACKAGES/atroposlib [--lib]

Reads upstream's source with ``ast`` (nothing of upstream is imported): each module's top-level
names (defs, classes, constants, from-imports), minus stdlib/typing imports, plain
``import x`` modules, ``logger`` and names under ``if __name__ == "__main__"``. Then tries
``getattr`` on our module of the same path. ``--lib`` leaves out the ``cli`` scripts.
Prints the missing names and ``importable X/Y; defined-upstream X/Y``.

``--write FILE`` writes upstream's (module, name, kind) list instead, one ``module name kind``
a line (cli scripts included): the checked-in ``tests/compat/upstream_names.txt`` that
``tests/compat/test_upstream_names.py`` checks offline was made this way.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import sys
import warnings


def _bind(node: ast.stmt, names: dict[str, str]) -> None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        names[node.name] = "def"
    elif isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    names[n.id] = "def"
    elif isinstance(node, ast.ImportFrom):
        home = "." * node.level + (node.module or "")
        stdlib = node.level == 0 and home.split(".")[0] in sys.stdlib_module_names
        for alias in node.names:
            if not stdlib:
                names[alias.asname or alias.name] = f"from {home}"
    elif isinstance(node, ast.Try):
        for child in node.body + [c for h in node.handlers for c in h.body]:
            _bind(child, names)
    elif isinstance(node, ast.If) and "__main__" not in ast.unparse(node.test):
        for child in node.body + node.orelse:
            _bind(child, names)


def upstream_names(root: pathlib.Path) -> dict[str, dict[str, str]]:
    """module -> {public name: "def" | "from <home>"} of upstream's package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if "tests" in rel.parts:
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        names: dict[str, str] = {}
        for node in ast.parse(path.read_text()).body:
            _bind(node, names)
        out[module] = {k: v for k, v in names.items() if not k.startswith("_") and k != "logger"}
    return out


def main() -> None:
    root = pathlib.Path(sys.argv[1])
    lib_only = "--lib" in sys.argv
    warnings.filterwarnings("ignore")
    if "--write" in sys.argv:
        out = pathlib.Path(sys.argv[sys.argv.index("--write") + 1])
        rows = [f"{module} {name} {kind.replace(' ', ':')}"
                for module, names in upstream_names(root).items() for name, kind in sorted(names.items())]
        out.write_text("\n".join(rows) + "\n")
        print(f"wrote {len(rows)} names to {out}")
        return
    total = ok = defined = defined_ok = 0
    for module, names in upstream_names(root).items():
        if lib_only and module.startswith("atroposlib.cli"):
            continue
        try:
            ours = importlib.import_module(module)
        except ImportError as exc:
            ours = None
            print(f"MODULE {module}: {exc}")
        for name, kind in sorted(names.items()):
            total += 1
            defined += kind == "def"
            if ours is not None and hasattr(ours, name):
                ok += 1
                defined_ok += kind == "def"
            else:
                print(f"  {module}.{name} [{kind}]")
    print(f"importable {ok}/{total}; defined-upstream {defined_ok}/{defined}")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from benchmarks.results import default_result_path, write_result

    write_result(default_result_path("upstream_names"), "upstream_names",
                 {"upstream_root": str(root), "lib_only": lib_only, "names": total, "importable": ok,
                  "defined_upstream": defined, "defined_upstream_importable": defined_ok}, seeds=None)


if __name__ == "__main__":
    main()
