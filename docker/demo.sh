#!/usr/bin/env bash
# A verified two-plane MRC transfer between two containers: build the image (docker/build.sh),
# run docker/compose.yaml (mrc-recv and mrc-send joined by two IPv6 networks) and print the
# JSON object mrc-send --json prints. Exit 0 only if both sides verified the data.
# Works with Docker or Podman; needs no image registry. Exit 3: no container engine can run here.
#   MRC_SIZE     bytes to send (default 64M)
#   MRC_PROJECT  compose project name (default mrcdemo<pid>); containers and networks carry it
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash tools/setup.sh >&2
source docker/engine.sh
[ ${#COMPOSE[@]} -gt 0 ] || _cannot "no compose tool for podman (pip install podman-compose)"

export MRC_IMAGE
MRC_IMAGE=$(bash docker/build.sh)
project=${MRC_PROJECT:-mrcdemo$$}
compose() { "${COMPOSE[@]}" -p "$project" -f docker/compose.yaml "$@"; }
cleanup() { compose down -t 1 >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

_say "transfer between two containers over two planes ($ENGINE, project $project)"
log=$(mktemp)
status=0
compose up --no-build --abort-on-container-exit --exit-code-from send >"$log" 2>&1 || status=$?
container() {
  "$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1" | head -n 1
}
send=$(container send)
recv=$(container recv)
if [ -z "$send" ] || [ -z "$recv" ]; then
  tail -n 20 "$log" >&2
  rm -f "$log"
  printf '[docker] error: compose did not start both containers\n' >&2
  exit 1
fi
rm -f "$log"
result=$("$ENGINE" logs "$send" 2>/dev/null | tail -n 1)
recv_status=$("$ENGINE" inspect -f '{{.State.ExitCode}}' "$recv")
recv_result=$("$ENGINE" logs "$recv" 2>/dev/null | tail -n 1)
printf '%s\n' "$result"
.venv/bin/python - "$status" "$recv_status" "$result" "$recv_result" <<'PY' >&2
import json, sys
status, recv_status, send_line, recv_line = sys.argv[1:]
try:
    send, recv = json.loads(send_line), json.loads(recv_line)
except ValueError:
    sys.exit(f"[docker] error: no JSON result (mrc-send exit {status}, mrc-recv exit {recv_status})")
good = (status == recv_status == "0" and send["ok"] and recv["ok"]
        and send["checksum"] == recv["checksum"]
        and send["digest"] == send["digest_receiver"] == recv["digest"])
if not good:
    sys.exit(f"[docker] error: transfer not verified (mrc-send exit {status}, "
             f"mrc-recv exit {recv_status}: {send.get('error') or recv.get('error')})")
print(f"[docker] verified: {send['bytes']} bytes over {send['planes']} planes, "
      f"same {send['checksum']} {send['digest'][:16]}... in both containers")
PY
