#!/usr/bin/env bash
# Set up what the demo needs (tools/setup.sh --for demo: iproute2, procps, a C compiler and
# .venv with mrc's lab extra; no tshark, clang, libbpf-dev or iptables, which only the tests
# use), then run the main demo: a verified 64 MiB MRC transfer between two network namespaces
# joined by two veth links (one per plane), sprayed over 128 EVs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --for demo
exec .venv/bin/python tools/demo.py "$@"
