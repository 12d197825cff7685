#!/usr/bin/env bash
# Sourced by scripts/demo.sh and scripts/test.sh: makes .venv (torch 2.14.1, a CUDA 13.0 build, and the
# test tools), then builds replayssm._C in place (CUDA sources too whenever nvcc is found; set CUDA_HOME
# if it is somewhere unusual). Rebuilds only when a source is newer than the built library.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
if ! python -c "import torch, numpy, pytest, ninja" 2>/dev/null; then
  python -m pip install -q --upgrade pip setuptools wheel
  python -m pip install -q "torch==2.14.1" numpy pytest ninja
fi
lib=$(ls replayssm/_C*.so 2>/dev/null | head -1 || true)
if [ -z "$lib" ] || [ -n "$(find csrc setup.py -newer "$lib" -type f 2>/dev/null | head -1)" ]; then
  echo "building replayssm._C (a few minutes on 2 cores)..."
  MAX_JOBS=${MAX_JOBS:-$(nproc)} python -m pip install -q -e . --no-build-isolation
fi
