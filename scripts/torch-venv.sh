#!/usr/bin/env bash
# The PyTorch test venv (issue 24): torch 2.13.0's CPU build (the wheel this machine keeps on disk; never
# the PyPI CUDA build, whose libc10_cuda clashes with torch_npu), torch-npu 2.13.0 without its
# dependencies, numpy and pyyaml, for the system Python (/usr/bin/python3, so a container that mounts
# the venv and the system stdlib runs it). Cached across runs and checkouts; reinstalled only when the
# pins below change. Quiet; prints the venv's path as its last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_PINS="torch==2.13.0+cpu numpy==2.4.6 pyyaml==6.0.4"
NPU_PIN="torch-npu==2.13.0"
VENV="${FLEXNPU_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/flexnpu/torch-2.13.0}"
PY=/usr/bin/python3
STAMP="$VENV/.flexnpu-torch"
# torch_npu itself imports only where CANN's libraries (or a share's) are loaded: check its install.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0  # importing torch would load torch_npu
CHECK='import importlib.metadata as m, torch; assert m.version("torch-npu") == "2.13.0"' 
WANT="$(printf '%s %s %s\n' "$TORCH_PINS" "$NPU_PIN" "$("$PY" -c 'import sys; print(sys.version)')" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ] || ! "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  echo "torch-venv: installing torch 2.13.0 (CPU) and torch-npu 2.13.0 into $VENV" >&2
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then  # a fresh Debian has no python3-venv
    echo "torch-venv: apt-get install python3-venv" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  "$PY" -m venv "$VENV"
  export PIP_CONSTRAINT="$ROOT/constraints.txt" PIP_DISABLE_PIP_VERSION_CHECK=1
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q $TORCH_PINS 2>&1 | grep -v '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -m pip install -q --no-deps "$NPU_PIN" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qi '^nvidia-'; then
    echo "torch-venv: pip installed a CUDA build; refusing it (is /opt/wheels' torch-2.13.0+cpu gone?)" >&2
    exit 1
  fi
  "$VENV/bin/python" -c "$CHECK" || {
    echo "torch-venv: the install failed" >&2
    exit 1
  }
  echo "$WANT" >"$STAMP"
fi
echo "$VENV"
