#!/usr/bin/env bash
# Check lint, format and types (tools/lint.sh, before anything needs root), set everything up
# (tools/setup.sh), then run the whole test suite. Any failing step fails the run. Extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# the checks need only .venv; a machine whose Python cannot make one yet gets the full setup
# (which installs python3-venv and the headers) first
bash tools/setup.sh --python-only 2>/dev/null || bash tools/setup.sh
bash tools/lint.sh
bash tools/setup.sh

printf '[test] %s\n' "pytest" >&2
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
