#!/usr/bin/env bash
# Set everything up (tools/setup.sh), check lint, format and types, then run the whole test
# suite. Any failing step fails the run. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

step() { printf '[test] %s\n' "$*" >&2; }
step "ruff check"
.venv/bin/ruff check --quiet .
step "ruff format --check"
.venv/bin/ruff format --check --quiet .
step "mypy (strict for mrc.core, mrc.wire, mrc.lab.sim, mrc.transport)"
.venv/bin/mypy
step "pytest"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
