#!/usr/bin/env bash
# Install lab and its dependencies into the current Python environment.
#
# On a machine without torch this first installs torch 2.13.0, which here resolves to a local CPU
# wheel; a plain `torch` requirement would otherwise pull a multi-GB CUDA build. Where torch is
# already installed (e.g. a CUDA build on a GPU machine) it is kept as it is.
#   scripts/install.sh          # runtime dependencies
#   scripts/install.sh test     # + pytest, hypothesis, ruff
# Without CUDA it then builds lab's C++ CPU kernels into this install's build directory
# (python -m lab.kernels.build), so no engine start has to; a failure there is a warning: the
# engine builds what it needs when it starts, or runs the kernels' PyTorch references.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "[install] no torch found: installing torch==2.13.0 (CPU wheel where available)"
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
"$PY" -m pip install --quiet -e "$spec"
# pip byte-compiles a regular install, not an editable one: compile lab's modules once here, so
# no process compiles them at import (each would, where PYTHONDONTWRITEBYTECODE is set)
"$PY" -m compileall -q lab >/dev/null
"$PY" -c "import torch, triton, transformers, hydra; print(f'[install] torch {torch.__version__}, triton {triton.__version__}, transformers {transformers.__version__}, hydra {hydra.__version__}')"
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "[install] CUDA: C++ CPU kernels not prebuilt (a CPU run builds them when it starts)"
elif ! "$PY" -m lab.kernels.build; then
  echo "[install] warning: a C++ CPU kernel could not be built (see above); kernels=cpu will" \
       "refuse to start, kernels=auto runs its PyTorch reference" >&2
fi
