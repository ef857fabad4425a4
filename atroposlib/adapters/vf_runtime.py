"""Run verifiers' bundled harness programs with this interpreter instead of a fresh uv env.

verifiers runs each rollout's harness as a PEP 723 script that its runtime first provisions
with ``uv sync --script`` (downloading the script's dependencies from a package index). The
bundled chat programs only need packages verifiers itself depends on (``openai``, ``mcp``,
``httpx`` ...), which are installed beside it, so on a machine without index access (or
without ``uv``) the local subprocess runtime can run them with ``sys.executable`` directly.
:func:`use_local_python` switches the ``subprocess`` runtime to that; a script whose declared
dependencies are not all installed still goes through uv, and the error says which are missing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_PEP723 = re.compile(r"(?m)^# /// script\s*$\n(?P<body>(?:^#(?: .*)?$\n)*?)^# ///\s*$")
_installed = False


def script_dependencies(script: str) -> list[str]:
    """The ``dependencies`` of a script's PEP 723 ``# /// script`` block (``[]`` if none)."""
    match = _PEP723.search(script)
    if match is None:
        return []
    toml = "".join(line[2:] if line.startswith("# ") else line[1:]
                   for line in match.group("body").splitlines(keepends=True))
    return list(tomllib.loads(toml).get("dependencies", []))


def missing_requirements(requirements: list[str]) -> list[str]:
    """The requirements (PEP 508 strings) the running interpreter does not satisfy."""
    from packaging.requirements import Requirement

    missing = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            missing.append(text)
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            missing.append(f"{text} (installed: {installed})")
    return missing


def use_local_python() -> None:
    """Make verifiers' ``subprocess`` runtime run satisfiable PEP 723 scripts with this Python.

    Idempotent; affects this process only. Scripts whose dependencies are not all installed
    are provisioned by uv as before.
    """
    global _installed
    if _installed:
        return
    import verifiers.v1.runtimes as runtimes
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    class LocalPythonRuntime(SubprocessRuntime):
        """``SubprocessRuntime`` whose PEP 723 scripts run on ``sys.executable`` when possible."""

        async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None,
                                    *, activate: bool = True) -> list[str]:
            text = script.decode() if isinstance(script, bytes) else script
            missing = missing_requirements(script_dependencies(text))
            if missing:
                logger.warning("verifiers script needs %s, not installed here; provisioning it "
                               "with uv (needs uv and a package index)", ", ".join(missing))
                return await super().prepare_uv_script(script, env, activate=activate)
            digest = hashlib.sha256(text.encode()).hexdigest()
            path = Path(self.scripts_dir) / f"local-{digest}.py"
            if not path.exists():
                # Concurrent rollouts prepare the same script: write aside, then rename
                # atomically, so no program ever starts on a half-written file.
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.{id(self):x}.tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
            return [sys.executable, str(path)]

    original = runtimes._runtime_cls

    def runtime_cls(config: Any) -> type:
        cls = original(config)
        return LocalPythonRuntime if cls is SubprocessRuntime else cls

    runtimes._runtime_cls = runtime_cls
    _installed = True


__all__ = ["missing_requirements", "script_dependencies", "use_local_python"]
