#!/usr/bin/env bash
# The one test command: sets up .venv and system packages, then ruff, mypy (strict) and the whole pytest suite.
# Services the tests need (private dbus-daemon + emulated BlueZ, nats-server, Chromium) are started by the
# test fixtures themselves and torn down after.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
echo "== ruff" && .venv/bin/ruff check connector providers tests bench scripts
echo "== mypy" && .venv/bin/mypy
echo "== pytest" && exec .venv/bin/python -m pytest "$@"
