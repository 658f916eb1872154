#!/usr/bin/env bash
# Set everything up (tools/setup.sh), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
