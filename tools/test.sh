#!/usr/bin/env bash
# Check lint, format and types (tools/lint.sh, before anything needs root), set everything up
# (tools/setup.sh), then run the whole test suite, then the core's and the loopback transport's
# tests again with MRC_NATIVE=0 (the pure-Python twins of the native kernels, what a machine
# without a compiler runs). Any failing step fails the run. Extra arguments go to pytest, and
# then only the first pass runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# the checks need only .venv; a machine whose Python cannot make one yet gets the full setup
# (which installs python3-venv and the headers) first
bash tools/setup.sh --python-only 2>/dev/null || bash tools/setup.sh
bash tools/lint.sh
bash tools/setup.sh

printf '[test] %s\n' "pytest" >&2
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
.venv/bin/python -m pytest -q -p no:cacheprovider
printf '[test] %s\n' "pytest tests/core tests/transport with MRC_NATIVE=0 (the Python twins)" >&2
MRC_NATIVE=0 exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/core tests/transport
