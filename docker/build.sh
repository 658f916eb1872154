#!/usr/bin/env bash
# Build the mrc image with whichever engine is present and print its name on stdout.
#
#   MRC_BASE   base image (default: docker.io/library/python:3.12-slim if it is here or can be pulled, else a
#              Debian image made locally by base-image.sh and kept as localhost/mrc-base:bookworm)
#   MRC_IMAGE  name of the image to build (default localhost/mrc:latest)
#
# mrc and its dependencies are installed from wheels built on this host for the base image's
# Python and C library, so the image build needs no package index (inside a container here,
# HTTPS to it fails certificate checks). Exits 3 when no engine can run here.
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/engine.sh

DEFAULT_BASE=docker.io/library/python:3.12-slim
LOCAL_BASE=localhost/mrc-base:bookworm
image=${MRC_IMAGE:-localhost/mrc:latest}

have_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
base=${MRC_BASE:-}
if [ -z "$base" ]; then
  if have_image "$DEFAULT_BASE" || timeout 60 "$ENGINE" pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
    base=$DEFAULT_BASE
  else
    _say "$DEFAULT_BASE cannot be pulled (no registry?): using a local Debian base image"
    have_image "$LOCAL_BASE" || bash docker/base-image.sh "$LOCAL_BASE"
    base=$LOCAL_BASE
  fi
fi
have_image "$base" || _cannot "base image $base is not here and could not be pulled"

# Wheels for the base image's Python and glibc, built and downloaded on this host. An engine
# that cannot start a container here (no cgroup mount, no runtime) is "cannot run" too.
probe=$("$ENGINE" run --rm --network none "$base" python3 -c \
  'import platform, sys; print("%d.%d" % sys.version_info[:2], platform.libc_ver()[1])' \
  2>/dev/null) || _cannot "$ENGINE cannot run python3 in a container of $base here"
read -r pyver glibc <<<"$probe" || true
[ -n "${glibc:-}" ] || _cannot "base image $base has no python3 with glibc"
arch=$(uname -m)
platforms=(--platform "manylinux2014_$arch")
minor=${glibc#2.}
for ((m = 17; m <= minor; m++)); do platforms+=(--platform "manylinux_2_${m}_$arch"); done
[ -x .venv/bin/python ] || bash tools/setup.sh >&2
wheels=docker/.wheels
rm -rf "$wheels"
_say "wheels for Python $pyver, glibc $glibc"
# a pure wheel (MRC_PURE_PYTHON=1: no native receive kernel): the image has no compiler to
# build one for its own Python, and the pure-Python kernel does the same work, slower
MRC_PURE_PYTHON=1 .venv/bin/python -m pip wheel -q --no-deps -w "$wheels" . >&2
.venv/bin/python -m pip download -q --only-binary=:all: --python-version "$pyver" \
  --implementation cp "${platforms[@]}" -d "$wheels" "$wheels"/mrc_transport-*.whl uvloop pyroute2 2>&1 \
  | grep -v "is ignored" >&2 || true
ls "$wheels"/uvloop-*.whl >/dev/null 2>&1 || {
  rm -rf "$wheels"
  printf '[docker] error: could not download wheels for Python %s\n' "$pyver" >&2
  exit 1
}

_say "building $image on $base with $ENGINE"
log=$(mktemp)
if ! "$ENGINE" build -f docker/Dockerfile --build-arg "BASE=$base" -t "$image" . >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  rm -f "$log"
  rm -rf "$wheels"
  printf '[docker] error: image build failed\n' >&2
  exit 1
fi
rm -f "$log"
rm -rf "$wheels"
echo "$image"
