#!/usr/bin/env bash
# Fetches the baselines that bench/ compares against into third_party/.cache (ignored by git), on a machine
# that reaches PyPI. Nothing of them is committed; the GPU machine gets the folder by copy.
#   mamba_ssm 2.3.2.post1: only its Triton selective_state_update (Mamba-2 standard decode). Its package
#   __init__ needs the CUDA build, so the two Triton modules are laid out under a bare package skeleton.
#   fla-core 0.6.0 (flash-linear-attention's kernels: fused_recurrent_gated_delta_rule, the standard GDN decode)
#   and einops 0.8.2, its one dependency: pure-Python wheels, unpacked under .cache/fla.
set -euo pipefail
PY=${PYTHON:-python3}
# A relative PYTHON (e.g. .venv/bin/python) names a path from where the script was called: resolve it first.
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
cd "$(dirname "$0")"
MAMBA_SSM_VERSION=2.3.2.post1
CACHE=.cache
mkdir -p "$CACHE/downloads"
if [ ! -f "$CACHE/mamba_ssm_triton/mamba_ssm/ops/triton/selective_state_update.py" ]; then
  # pip reads mamba_ssm's sdist metadata by running its setup.py, which imports torch (and needs wheel).
  if ! "$PY" -c "import torch, wheel" 2>/dev/null; then
    echo "get_baselines.sh: $PY cannot import torch and wheel (mamba_ssm's setup.py needs them to give its metadata);" \
         "run it with PYTHON=<a python that has both>, e.g. PYTHON=.venv/bin/python after scripts/test.sh" >&2
    exit 1
  fi
  MAMBA_SKIP_CUDA_BUILD=TRUE "$PY" -m pip download --no-deps --no-build-isolation --no-binary :all: \
    "mamba_ssm==$MAMBA_SSM_VERSION" -d "$CACHE/downloads" >/dev/null
  tmp=$(mktemp -d)
  tar -xzf "$CACHE/downloads/mamba_ssm-$MAMBA_SSM_VERSION.tar.gz" -C "$tmp"
  dst="$CACHE/mamba_ssm_triton/mamba_ssm/ops/triton"
  mkdir -p "$dst"
  cp "$tmp/mamba_ssm-$MAMBA_SSM_VERSION/mamba_ssm/ops/triton/"{selective_state_update.py,softplus.py} "$dst/"
  cp "$tmp/mamba_ssm-$MAMBA_SSM_VERSION/LICENSE" "$CACHE/mamba_ssm_triton/" 2>/dev/null || true
  touch "$CACHE/mamba_ssm_triton/mamba_ssm/__init__.py" "$CACHE/mamba_ssm_triton/mamba_ssm/ops/__init__.py" \
        "$dst/__init__.py"
  rm -rf "$tmp"
fi
FLA_VERSION=0.6.0
EINOPS_VERSION=0.8.2
if [ ! -f "$CACHE/fla/fla/ops/gated_delta_rule/fused_recurrent.py" ]; then
  "$PY" -m pip download --no-deps "fla-core==$FLA_VERSION" "einops==$EINOPS_VERSION" -d "$CACHE/downloads" >/dev/null
  mkdir -p "$CACHE/fla"
  "$PY" -m zipfile -e "$CACHE/downloads/fla_core-$FLA_VERSION-py3-none-any.whl" "$CACHE/fla"
  "$PY" -m zipfile -e "$CACHE/downloads/einops-$EINOPS_VERSION-py3-none-any.whl" "$CACHE/fla"
fi
echo "baselines in third_party/$CACHE: mamba_ssm $MAMBA_SSM_VERSION (Triton selective_state_update), fla-core $FLA_VERSION"
