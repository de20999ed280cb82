#!/usr/bin/env bash
# Sourced by scripts/demo.sh and scripts/test.sh: makes .venv with the project installed.
# Idempotent: reinstalls only when the packaging or the locked toolchain (constraints.txt) changed.
# Every version pip installs is held by constraints.txt (PIP_CONSTRAINT also reaches pip's isolated build
# environments), so a fresh clone installs what main was tested with, whatever upstream released since.
# Needs Python >= 3.11.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLEXNPU_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  # apt_install PKG...: install the Debian packages that are missing.
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: apt-get install ${missing[*]}" >&2
    as_root apt-get update -qq >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  echo "bootstrap: need Python >= 3.11 as '$PY' (set PYTHON=...)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    apt_install python3-venv python3-pip
    "$PY" -m venv "$VENV"
  fi
fi
STAMP="$VENV/.flexnpu-installed"
export PIP_CONSTRAINT="$ROOT/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/client/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
# Reinstall when the packaging changed, or when the install no longer imports this tree's top-level
# packages (a venv made by an older checkout: its editable install does not know a package added since).
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ] \
  || ! "$VENV/bin/python" -I -c 'import dra_driver, flexnpu_runtime, dra_kubeletplugin, kubeletplugin, controller, api_protos' 2>/dev/null; then
  echo "bootstrap: installing the project and its dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true  # to the locked pip
  # The driver brings the container client from ./client (setup.py); then the client is made
  # editable too, so a change under client/ needs no reinstall.
  "$VENV/bin/python" -m pip install -q -e "$ROOT[dev]" 2>&1 | grep -v -e '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT/client" 2>&1 | grep -v -e '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -c 'import dra_driver, flexnpu_runtime, dra_kubeletplugin, kubeletplugin, controller, flexnpu_client, flexnpu_wire, grpc, kubernetes, pyroute2' || { echo "bootstrap: install failed" >&2; exit 1; }
  echo "$WANT" >"$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# The C client (libascendcl/): gcc and make from apt, then make (a no-op when nothing changed).
# (g++ only for the test that builds a C++ program against the headers; gcc brings the sanitizer runtimes)
if ! command -v cc >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
  apt_install gcc g++ make libc6-dev
fi
make -s -C "$ROOT/libascendcl" >/dev/null
