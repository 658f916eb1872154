#!/usr/bin/env bash
# Install everything mrc needs on a Debian/Ubuntu machine (run as root), idempotently:
# system packages (iproute2, procps, tshark, ...) and a virtualenv in .venv with mrc and its
# test/benchmark dependencies. Prints what it does; exits non-zero with one line on failure.
#
#   bash tools/setup.sh                  # everything (root)
#   bash tools/setup.sh --python-only    # only .venv, no root, no apt: enough for tools/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*" >&2; }
fail() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

python_only=0
case "${1:-}" in
  --python-only) python_only=1 ;;
  "") ;;
  *) fail "unknown option ${1} (use --python-only or nothing)" ;;
esac
[ "$python_only" -eq 1 ] || [ "$(id -u)" -eq 0 ] || fail "run as root (namespaces, veth links and apt need it), or use --python-only"

# ---- system packages (only what is missing; apt-get update once) ----
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v sysctl >/dev/null 2>&1 || need+=(procps)
command -v tshark >/dev/null 2>&1 || need+=(tshark)
# mrc-fabric up --trim: compiles a tc eBPF program (clang + libbpf headers), loads it with libbpf
command -v clang >/dev/null 2>&1 || need+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
# mrc-bench's lossy condition drops packets with ip6tables' statistic match
command -v ip6tables >/dev/null 2>&1 || need+=(iptables)
# pip install compiles the native receive kernel (mrc/_native.c); without a C compiler and
# Python's headers mrc still installs, with the pure-Python kernel (README, "Performance")
command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 || need+=(gcc)
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
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get update -qq >/dev/null || fail "apt-get update failed"
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null \
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
# an install made before a C compiler was here (--python-only on a fresh machine) is redone
# once there is one, so that the native kernels get built
if [ -f "$stamp" ] && [ "$python_only" -eq 0 ] && [ "${MRC_PURE_PYTHON:-0}" != 1 ] &&
   { command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1; } &&
   ! .venv/bin/python -c 'import mrc._native' 2>/dev/null; then
  rm -f "$stamp"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ mrc/_native.c -nt "$stamp" ]; then
  say "installing mrc and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  log=.venv/pip-install.log
  if ! .venv/bin/python -m pip install -e '.[dev]' >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "pip install of mrc failed (full log in $log)"
  fi
  .venv/bin/python -c 'import mrc, pyroute2, pytest, mypy, ruff' || fail "mrc does not import after install"
  touch "$stamp"
fi
say "ready: $(.venv/bin/python --version), mrc $(.venv/bin/python -c 'import mrc; print(mrc.__version__)')"
say "receive kernel: $(.venv/bin/python -c 'from mrc.core import fastpath; print(fastpath.describe())')"
