#!/usr/bin/env bash
# Lint, format and type checks: ruff, ruff format --check, mypy (mrc, tools, examples as
# pyproject.toml says). Needs no root and no system packages: only a Python >= 3.11 with venv,
# for .venv (tools/setup.sh --python-only). Any failing check fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --python-only

step() { printf '[lint] %s\n' "$*" >&2; }
step "ruff check"
.venv/bin/ruff check --quiet .
step "ruff format --check"
.venv/bin/ruff format --check --quiet .
step "mypy"
.venv/bin/mypy
