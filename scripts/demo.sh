#!/usr/bin/env bash
# Quick start, command 1: a local node with emulated NPUs walks claims through their whole lifecycle.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/bootstrap.sh
source "$ROOT/scripts/bootstrap.sh"
if [ "$(id -u)" = 0 ]; then apt_install iproute2; fi
# The demo drives the test doubles (flexnpu_testing/), which live in the repository, not in any wheel.
cd "$ROOT"
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" python -m flexnpu_testing.demo "$@"
