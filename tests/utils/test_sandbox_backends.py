"""Choosing the sandbox backend: the refusal without isolation, the explicit ``"none"``, and runs
that never reach the program (an error of the host or configuration, never a result)."""

from __future__ import annotations

import logging
import os
import platform
import sys

import pytest

from atroposlib.errors import ConfigError
from atroposlib.utils import sandbox, sandbox_backends
from atroposlib.utils.sandbox import (
    SandboxLimits,
    SandboxStartError,
    SandboxUnavailableError,
    available_backends,
    isolation_support,
    resolve_backend,
    run_python,
)
from tests.utils.test_sandbox_hostile import interpreter_for

ISOLATING_HERE = [b for b in ("bwrap", "unshare") if b in available_backends()]


@pytest.fixture
def no_isolation(monkeypatch, tmp_path):
    """A host where neither bwrap nor unshare exists (an empty PATH); probes re-run after."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    sandbox_backends.clear_probes()
    yield
    sandbox_backends.clear_probes()


def test_without_isolation_code_execution_is_refused_with_both_fixes(no_isolation):
    assert available_backends() == ["none"]
    for call in (lambda: resolve_backend(None), lambda: resolve_backend("auto"),
                 lambda: run_python("print('ran')")):
        with pytest.raises(SandboxUnavailableError) as info:
            call()
        message = str(info.value)
        assert "no isolating sandbox backend works on this host" in message
        assert "bwrap: `bwrap` is not on PATH" in message and "unshare: `unshare` is not on PATH" in message
        assert "apt-get install bubblewrap" in message
        assert "backend='none'" in message and "--env.sandbox none" in message
        assert "/reset_data" in message  # the risk of the opt-in, stated
    assert isinstance(info.value, ConfigError)  # the env CLI exits 2 with the message


def test_a_named_backend_that_does_not_work_is_refused(no_isolation):
    with pytest.raises(SandboxUnavailableError, match="sandbox backend 'bwrap' does not work"):
        run_python("pass", backend="bwrap")
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'"):
        resolve_backend("docker")


def test_explicit_none_runs_and_warns_once(no_isolation, monkeypatch, caplog):
    python = interpreter_for("none")
    monkeypatch.setattr(sandbox, "_warned_none", False)  # as in a fresh process
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="atroposlib.utils.sandbox"):
        first = run_python("print('ran')", backend="none", python=python)
        second = run_python("print('again')", backend="none", python=python)
    assert (first.stdout, second.stdout) == ("ran\n", "again\n")
    assert first.backend == second.backend == "none"
    assert not {"netns", "pidns", "mountns", "rootfs"} & set(first.isolation)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "unconfined" in warnings[0].getMessage() and "chosen explicitly" in warnings[0].getMessage()


@pytest.mark.parametrize("backend", ISOLATING_HERE)
def test_every_result_names_its_backend(backend, caplog):
    with caplog.at_level(logging.DEBUG, logger="atroposlib.utils.sandbox"):
        result = run_python("print(1)", backend=backend)
    assert result.ok and result.backend == backend
    assert f"sandbox run: backend={backend} returncode=0" in caplog.text
    assert resolve_backend(None) == ISOLATING_HERE[0]
    assert isolation_support(backend)["netns"] and isolation_support(backend)["ipcns"]


def test_unshare_bootstrap_refuses_exit_125_without_its_private_root(monkeypatch):
    if "unshare" not in available_backends() or not isolation_support("unshare")["rootfs"]:
        pytest.skip("the unshare backend with a mount namespace does not work on this host")
    # not a system call: pivot_root fails, as it would on a kernel that refuses it
    monkeypatch.setitem(sandbox_backends.NR_PIVOT_ROOT, platform.machine(), 1_000_000)
    with pytest.raises(SandboxStartError) as info:
        run_python("import sys\nsys.stderr.write('THE PROGRAM RAN')\n", backend="unshare")
    error = info.value
    assert error.returncode == 125 and error.backend == "unshare"
    assert "cannot build the private root filesystem" in error.stderr
    assert "THE PROGRAM RAN" not in error.stderr
    assert "refused to run the program" in str(error) and "apt-get install bubblewrap" in str(error)


@pytest.mark.parametrize("backend", ISOLATING_HERE)
def test_a_run_that_never_reaches_the_program_raises(backend):
    with pytest.raises(SandboxStartError, match="ran out of memory while starting: raise memory_bytes"):
        run_python("print('ok')", backend=backend, limits=SandboxLimits(memory_bytes=4 * 2**20))
    with pytest.raises(SandboxStartError, match="did not reach the program within wall_seconds"):
        run_python("print('ok')", backend=backend, limits=SandboxLimits(wall_seconds=0.001))
    # the program's own failures stay results, even when it prints what a refusal prints
    fake = run_python("import sys\nsys.stderr.write('sandbox: cannot build the private root "
                      "filesystem')\nsys.exit(125)\n", backend=backend)
    assert fake.returncode == 125 and not fake.ok
    killed = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", backend=backend)
    assert killed.returncode == -9


def test_interpreter_closed_to_the_run_uid_is_named():
    """The env's Python under a directory other users cannot enter (e.g. /root/.pyenv) cannot
    start as the run's unprivileged uid under ``"none"``: an error naming it, never a result."""
    dirs = sandbox_backends.interpreter_dirs(sys.executable)
    closed = sandbox_backends.closed_to_others(dirs, parents=True)
    if os.geteuid() != 0 or closed is None:
        pytest.skip("needs a root host whose interpreter lies under a directory closed to "
                    f"other users (euid {os.geteuid()}, interpreter dirs {dirs})")
    with pytest.raises(SandboxStartError) as info:
        run_python("print('ok')", backend="none")
    message = str(info.value)
    assert closed in message and "closed to other users" in message
    assert "No module named" in info.value.stderr
    assert "use backend 'bwrap' or 'unshare'" in message


# ------------------------------------------------------------------ a non-root host
_REMOUNT_ATTACK = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
target = %r
rc = libc.mount(None, target.encode(), None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND: read-write
err = ctypes.get_errno()
fd = libc.open((target + "/planted.py").encode(), os.O_WRONLY | os.O_CREAT, 0o644)
print("remount", rc, err, "open", fd)
'''

_AS_NOBODY = r'''
import json, sys
from atroposlib.utils.sandbox import available_backends, run_python
from atroposlib.utils.sandbox_backends import probe_unshare
out = {"backends": available_backends(), "unshare_why": probe_unshare().why_not}
if "bwrap" in out["backends"]:
    out["bwrap"] = run_python(ATTACK % sys.prefix, backend="bwrap").stdout
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def nobody_python():
    """A venv of ``/usr/bin/python3`` owned by ``nobody`` (as a non-root user's own venv is)."""
    import shutil
    import subprocess
    import tempfile

    from tests.utils.test_sandbox_hostile import REPO, _open_to_others

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs a root host with setpriv (util-linux) and /usr/bin/python3")
    if not _open_to_others(REPO / "atroposlib" / "utils" / "sandbox.py"):
        pytest.skip(f"the working tree {REPO} is closed to other users")
    base = tempfile.mkdtemp(prefix="atropos-nobody-")
    os.chmod(base, 0o755)
    os.chown(base, 65534, 65534)
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    made = subprocess.run([*as_nobody, "/usr/bin/python3", "-m", "venv", "--without-pip",
                           f"{base}/venv"], capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(base)
        pytest.skip(f"cannot create a venv as nobody: {made.stderr.strip()[-200:]}")
    try:
        yield as_nobody, f"{base}/venv"
    finally:
        shutil.rmtree(base)


def test_a_non_root_host_gets_no_unshare_and_bwrap_forbids_remounts(nobody_python):
    import json
    import subprocess

    from tests.utils.test_sandbox_hostile import REPO

    as_nobody, venv = nobody_python
    script = f"ATTACK = {_REMOUNT_ATTACK!r}\n" + _AS_NOBODY
    done = subprocess.run([*as_nobody, f"{venv}/bin/python", "-c", script], capture_output=True,
                          text=True, cwd="/", env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert "unshare" not in seen["backends"]
    if sandbox_backends.shutil.which("unshare"):
        assert seen["unshare_why"] == sandbox_backends.UNSHARE_NEEDS_ROOT
    assert not os.path.exists(f"{venv}/planted.py")  # nothing written into the host's venv
    if "bwrap" not in seen["backends"]:
        pytest.skip("bwrap cannot create a user namespace for nobody here")
    remount = seen["bwrap"].split()
    assert remount[:2] == ["remount", "-1"] and remount[-2:] == ["open", "-1"], seen["bwrap"]
