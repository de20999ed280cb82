#!/usr/bin/env bash
# Quick start, command 2: lint, type-check and run every test (unit, integration, e2e with podman).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/bootstrap.sh
source "$ROOT/scripts/bootstrap.sh"
if [ "$(id -u)" = 0 ]; then
  # podman (with runc) is the real CDI consumer of the e2e tests; busybox-static is its rootfs.
  apt_install podman runc busybox-static iproute2 conmon
fi
# promtool (the alert tests), from Debian's prometheus package: only the one binary is taken out of the
# package, into the venv, because installing the package would also start a Prometheus server (its init
# script) on the machine.
if ! command -v promtool >/dev/null 2>&1; then
  echo "test: promtool from Debian's prometheus package" >&2
  pkg="$(mktemp -d)"
  as_root apt-get update -qq >/dev/null || true
  (cd "$pkg" && apt-get download -qq prometheus 2>/dev/null)
  dpkg-deb -x "$pkg"/prometheus_*.deb "$pkg/x"
  install -m 0755 "$pkg/x/usr/bin/promtool" "$VENV/bin/promtool"
  rm -rf "$pkg"
fi
# The PyTorch test venv (tests/e2e/test_podman_torch.py): cached, reinstalled only when its pins change.
FLEXNPU_TORCH_VENV="$(bash "$ROOT/scripts/torch-venv.sh")"
export FLEXNPU_TORCH_VENV
cd "$ROOT"
echo "== ruff" && ruff check . && ruff format --check .
echo "== mypy" && mypy dra_driver flexnpu_runtime dra_kubeletplugin kubeletplugin controller flexnpu_testing
echo "== pytest"
# --durations: the CI log names the slowest tests, so a suite that grows shows where its minutes went.
exec python -m pytest -p no:cacheprovider --durations=25 "$@"
