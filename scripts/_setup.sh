#!/usr/bin/env bash
# Shared setup of scripts/run and scripts/test: a virtual environment in .venv with the
# package installed.  Without an NVIDIA GPU, torch is the CPU wheel (torch==2.13.0, which this
# workplace keeps on local disk) instead of a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SAMU_TUNE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "${PIP[@]}" torch
    else
        "${PIP[@]}" "torch==2.13.0" || "${PIP[@]}" torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi
"${PIP[@]}" -e "$ROOT[test]"
export PATH="$VENV/bin:$PATH"
