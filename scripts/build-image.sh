#!/usr/bin/env bash
# Build the FlexNPU image (Containerfile) with podman, on a machine that reaches no container registry.
#
#   scripts/build-image.sh                      # -> localhost/flexnpu-dra-driver:<version>
#   FLEXNPU_IMAGE=registry.example/flexnpu:dev scripts/build-image.sh
#   FLEXNPU_BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm scripts/build-image.sh   # a registry base
#
# Without FLEXNPU_BASE_IMAGE it first makes a base image from Debian packages: mmdebstrap (bookworm, minbase,
# python3 + python3-venv) piped into `podman import`, tagged localhost/flexnpu-base:bookworm-<hash of the recipe>
# and reused while it exists (remove it to rebuild). The Python dependencies and this project are built into
# wheels by the host's pip (build/wheels, build/dist), so the image build needs no Python index; its build stage
# installs gcc and make from the Debian mirror (DEBIAN_MIRROR) to compile libascendcl/ when that folder exists.
# Prints the image name and its size on the last line.
#
# Environment: FLEXNPU_IMAGE, FLEXNPU_BASE_IMAGE, DEBIAN_MIRROR (default http://deb.debian.org/debian),
# PYTHON (python with pip; default .venv/bin/python, else python3), PODMAN_BUILD_ARGS (extra `podman build` flags).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
IMAGE="${FLEXNPU_IMAGE:-localhost/flexnpu-dra-driver:$VERSION}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="python3,python3-venv"
# Podman on this kind of machine: runc refuses the default rlimits (see flexnpu_testing/podman.py),
# and the host network avoids needing a CNI/netavark bridge for the apt step.
BUILD_FLAGS=(--network=host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

need() { command -v "$1" >/dev/null 2>&1 || { echo "build-image: $1 is required ($2)" >&2; exit 1; }; }
need podman "apt-get install podman runc"

mkdir -p build
exec 9>build/.build-image.lock
flock 9  # one build at a time per checkout

BASE="${FLEXNPU_BASE_IMAGE:-}"
if [ -z "$BASE" ]; then
  recipe="bookworm minbase $BASE_PACKAGES $MIRROR v1"
  BASE="localhost/flexnpu-base:bookworm-$(printf '%s' "$recipe" | sha256sum | cut -c1-12)"
  if ! podman image exists "$BASE"; then
    if ! command -v mmdebstrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "build-image: apt-get install mmdebstrap" >&2
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
    fi
    need mmdebstrap "apt-get install mmdebstrap"
    echo "build-image: making $BASE from Debian packages" >&2
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      bookworm - "$MIRROR" \
      | podman import --change 'CMD ["/bin/sh"]' \
          --change 'LABEL org.opencontainers.image.description="Debian bookworm minbase with python3, made by scripts/build-image.sh"' \
          - "$BASE" >/dev/null
  fi
fi

echo "build-image: wheels" >&2
# The locked toolchain (constraints.txt) holds every version the image gets, as it does for the tests.
export PIP_CONSTRAINT="$ROOT/constraints.txt"
rm -rf build/dist
mkdir -p build/wheels build/dist
# This project's two distributions (the driver, and the container client in client/ when the tree has it),
# then every dependency, resolved against them.
dists=(./)
if [ -f client/pyproject.toml ]; then dists=(./client .); fi
for d in "${dists[@]}"; do
  "$PY" -m pip wheel -q --disable-pip-version-check --wheel-dir build/dist --no-deps "$d" 2>&1 \
    | grep -v '^WARNING: Location' >&2 || true
done
"$PY" -m pip wheel -q --disable-pip-version-check --wheel-dir build/wheels --find-links build/dist \
  build/dist/flexnpu_dra_driver-*.whl 2>&1 | grep -v '^WARNING: Location' >&2 || true
rm -f build/wheels/flexnpu_dra_driver-*.whl build/wheels/flexnpu_client-*.whl
ls build/dist/flexnpu_dra_driver-*.whl >/dev/null

echo "build-image: podman build $IMAGE on $BASE" >&2
# shellcheck disable=SC2086
podman build "${BUILD_FLAGS[@]}" ${PODMAN_BUILD_ARGS:-} \
  --build-arg BASE_IMAGE="$BASE" \
  --build-arg VERSION="$VERSION" \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -f Containerfile -t "$IMAGE" . >&2
# Earlier builds of this image that the tag moved away from (labelled, untagged): not a cache anyone uses.
podman image prune -f --filter label=org.opencontainers.image.title=flexnpu-dra-driver >/dev/null 2>&1 || true
size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
echo "$IMAGE $size"
