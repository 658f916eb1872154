#!/usr/bin/env bash
# Install what mrc needs on a Debian/Ubuntu machine (run as root), idempotently: system
# packages and a virtualenv in .venv with mrc. Prints what it does; exits non-zero with one
# line on failure. docs/USAGE.md, "Install", says why each package is there.
#
#   bash tools/setup.sh                  # everything the tests need (root; tools/test.sh)
#   bash tools/setup.sh --for demo       # only what tools/demo.sh needs (root): no tshark,
#                                        # clang, libbpf-dev or iptables; mrc with its lab extra
#   bash tools/setup.sh --python-only    # only .venv, no root, no apt: enough for tools/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*" >&2; }
fail() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,9s/^# \{0,1\}//p' "$0"; }

python_only=0
for_demo=0
case "${1:-}" in
  --python-only) python_only=1 ;;
  --for)
    case "${2:-}" in
      demo) for_demo=1 ;;
      test | all) ;;
      *) fail "--for takes demo or test, not '${2:-}'" ;;
    esac
    shift ;;
  --for=demo) for_demo=1 ;;
  --for=test | --for=all) ;;
  -h | --help) usage; exit 0 ;;
  "") ;;
  *) fail "unknown option ${1} (use --for demo, --python-only, --help or nothing)" ;;
esac
[ "$#" -le 1 ] || fail "one option at most (use --for demo, --python-only, --help or nothing)"
[ "$python_only" -eq 1 ] || [ "$(id -u)" -eq 0 ] || fail "run as root (namespaces, veth links and apt need it), or use --python-only"
# the Python extras: the demo needs the lab's (pyroute2: it waits on a namespace's socket);
# the tests, the lint and the benchmarks need all of dev's
extra=dev
[ "$for_demo" -eq 0 ] || extra=lab

# ---- system packages (only what is missing; apt-get update once) ----
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v sysctl >/dev/null 2>&1 || need+=(procps)
if [ "$for_demo" -eq 0 ]; then
  # the tests decode captures with tshark (mrc/wireshark/mrc.lua)
  command -v tshark >/dev/null 2>&1 || need+=(tshark)
  # mrc-fabric up --trim: compiles a tc eBPF program (clang + libbpf headers), loads it with libbpf
  command -v clang >/dev/null 2>&1 || need+=(clang)
  [ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
  # mrc-bench's lossy condition drops packets with ip6tables' statistic match
  command -v ip6tables >/dev/null 2>&1 || need+=(iptables)
fi
# pip install compiles the native receive kernel (mrc/_native.c); without a C compiler and
# Python's headers mrc still installs, with the pure-Python kernel (docs/USAGE.md, "Install")
command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 || need+=(gcc)
# keyed mode's kernels (mrc/_native_gcm.c) do AES-GCM with OpenSSL's libcrypto and build
# against its headers; without them the other kernels still build and keyed mode runs Python
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
pick_python() {
  for py in python3.13 python3.12 python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}
PY=$(pick_python || true)
[ -n "$PY" ] || need+=(python3 python3-venv python3-dev)
if [ -n "$PY" ] && [[ "$(command -v "$PY")" == /usr/bin/* ]] &&
   ! "$PY" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  need+=("$(basename "$PY")-dev")  # e.g. python3.11-dev: the headers of that very Python
fi
if [ "$python_only" -eq 1 ]; then
  need=()  # no system packages: whatever is missing, the full setup brings
fi
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)  # ip and tc both need iproute2
fi
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get update -qq >/dev/null || fail "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || fail "apt-get install ${need[*]} failed"
  PY=${PY:-$(pick_python || true)}
elif [ ${#need[@]} -gt 0 ]; then
  say "warning: missing ${need[*]} and no apt-get; some tests will be skipped"
fi
[ -n "$PY" ] || fail "need Python >= 3.11 with venv (apt-get install python3 python3-venv)"

# ---- virtualenv with mrc ----
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  say "creating .venv with $PY"
  rm -rf .venv
  "$PY" -m venv .venv || fail "python -m venv failed"
fi
stamp=.venv/.mrc-installed
# the stamp holds the extra installed: "lab" (--for demo) or "dev" (empty: an older set-up's,
# which installed dev); a lab install is completed with dev when the full set-up runs
if [ -f "$stamp" ] && [ "$extra" = dev ] && [ "$(cat "$stamp")" = lab ]; then
  rm -f "$stamp"
fi
# an install made before a C compiler was here (--python-only on a fresh machine) is redone
# once there is one, so that the native kernels get built
if [ -f "$stamp" ] && [ "$python_only" -eq 0 ] && [ "${MRC_PURE_PYTHON:-0}" != 1 ] &&
   { command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1; } &&
   ! .venv/bin/python -c 'import mrc._native' 2>/dev/null; then
  rm -f "$stamp"
fi
# likewise keyed mode's kernels once OpenSSL's headers are here
if [ -f "$stamp" ] && [ "$python_only" -eq 0 ] && [ "${MRC_PURE_PYTHON:-0}" != 1 ] &&
   [ -f /usr/include/openssl/evp.h ] &&
   ! .venv/bin/python -c 'import mrc._native_gcm' 2>/dev/null; then
  rm -f "$stamp"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ mrc/_native.c -nt "$stamp" ] ||
   [ mrc/_native_gcm.c -nt "$stamp" ]; then
  say "installing mrc and its dependencies into .venv (pip install -e '.[$extra]')"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # the distribution was called mrc before it became mrc-transport: an install under the old
  # name (known by its mrc-send) goes first, or removing it later would take the commands along
  if .venv/bin/python -c 'import sys
from importlib.metadata import PackageNotFoundError, distribution
try:
    dist = distribution("mrc")
except PackageNotFoundError:
    sys.exit(1)
sys.exit(not any(e.name == "mrc-send" for e in dist.entry_points))' 2>/dev/null; then
    say "removing the install made under the old name, mrc"
    .venv/bin/python -m pip uninstall -y -q mrc >/dev/null 2>&1 || true
  fi
  log=.venv/pip-install.log
  if ! .venv/bin/python -m pip install -e ".[$extra]" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "pip install of mrc failed (full log in $log)"
  fi
  if [ "$extra" = dev ]; then
    .venv/bin/python -c 'import mrc, pyroute2, pytest, mypy, ruff' || fail "mrc does not import after install"
  else
    .venv/bin/python -c 'import mrc, pyroute2' || fail "mrc does not import after install"
  fi
  echo "$extra" >"$stamp"
fi
say "ready: $(.venv/bin/python --version), mrc $(.venv/bin/python -c 'import mrc; print(mrc.__version__)')"
say "receive kernel: $(.venv/bin/python -c 'from mrc.core import fastpath; print(fastpath.describe())')"
