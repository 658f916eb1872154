#!/usr/bin/env bash
# Make a base image for docker/Dockerfile from Debian packages, for hosts that reach no image
# registry (only Debian's package mirror): debootstrap a minimal bookworm with python3, its
# venv module and iproute2 (about a minute), then import it. Usage: base-image.sh NAME
# Needs root. MRC_DEBIAN_MIRROR overrides the mirror.
set -euo pipefail
name=${1:?usage: base-image.sh IMAGE-NAME}
source "$(dirname "$0")/engine.sh"

if ! command -v debootstrap >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || _cannot "debootstrap is missing (and no apt-get)"
  _say "installing debootstrap"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } \
    >/dev/null 2>&1 || _cannot "apt-get install debootstrap failed"
fi
root=$(mktemp -d /tmp/mrc-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
_say "debootstrap bookworm into $root (about a minute)"
log=$root.log
if ! debootstrap --variant=minbase --include=python3,python3-venv,iproute2 bookworm "$root" \
    ${MRC_DEBIAN_MIRROR:-} >"$log" 2>&1; then
  tail -n 5 "$log" >&2
  rm -f "$log"
  printf '[docker] error: debootstrap failed (is a Debian mirror reachable?)\n' >&2
  exit 1
fi
rm -f "$log"
tar -C "$root" -c . | "$ENGINE" import - "$name" >/dev/null 2>&1 \
  || { printf '[docker] error: %s import of the base image failed\n' "$ENGINE" >&2; exit 1; }
_say "base image $name made"
