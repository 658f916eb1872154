#!/usr/bin/env bash
# Set everything up (tools/setup.sh), then run the main demo: a verified 64 MiB MRC transfer
# between two network namespaces joined by two veth links (one per plane), sprayed over 128 EVs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python tools/demo.py "$@"
