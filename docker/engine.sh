# Sourced by the scripts in docker/: picks the container engine and its compose tool.
#   ENGINE   docker or podman (MRC_ENGINE overrides the choice)
#   COMPOSE  the compose command for it, as an array
# A Docker client without a running engine does not count. With neither engine and root
# with apt-get, podman and runc are installed. Exits 3 (with one line) when no engine can
# run here, so that callers can tell "cannot run" from "failed".
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_say() { printf '[docker] %s\n' "$*" >&2; }
_cannot() { printf '[docker] cannot run: %s\n' "$*" >&2; exit 3; }

_pick_engine() {
  if [ -n "${MRC_ENGINE:-}" ]; then echo "$MRC_ENGINE"; return; fi
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker; return; fi
  if command -v podman >/dev/null 2>&1; then echo podman; return; fi
  echo ""
}
ENGINE=$(_pick_engine)
if [ -z "$ENGINE" ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    _say "no container engine: installing podman and runc"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq podman runc; } >/dev/null 2>&1 \
      || _cannot "apt-get install podman runc failed"
    ENGINE=podman
  else
    _cannot "neither a running Docker engine nor podman (as root with apt-get, podman is installed)"
  fi
fi
command -v "$ENGINE" >/dev/null 2>&1 || _cannot "MRC_ENGINE=$ENGINE is not installed"

if [ "$ENGINE" = podman ]; then
  if [ -z "${CONTAINERS_CONF:-}" ] && command -v runc >/dev/null 2>&1; then
    export CONTAINERS_CONF="$_here/podman.conf"
  fi
  if podman compose version >/dev/null 2>&1; then
    COMPOSE=(podman compose)
  elif command -v podman-compose >/dev/null 2>&1; then
    COMPOSE=(podman-compose)
  elif [ -x "$_here/../.venv/bin/podman-compose" ]; then
    COMPOSE=("$_here/../.venv/bin/podman-compose")
  else
    COMPOSE=()
  fi
else
  COMPOSE=(docker compose)
fi
