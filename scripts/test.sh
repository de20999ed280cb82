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
cd "$ROOT"
echo "== ruff" && ruff check . && ruff format --check .
echo "== mypy" && mypy dra_driver dra_kubeletplugin kubeletplugin controller flexnpu_testing
echo "== pytest"
exec python -m pytest -p no:cacheprovider "$@"
