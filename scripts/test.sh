#!/usr/bin/env bash
# The one test command: sets up .venv and system packages, then ruff, mypy (strict) and the whole pytest suite
# on xdist workers.
# Services the tests need (private dbus-daemon + emulated BlueZ, nats-server, Chromium) are started by the
# test fixtures themselves and torn down after.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
echo "== ruff" && .venv/bin/ruff check connector providers tests bench scripts
echo "== mypy" && .venv/bin/mypy
# pytest-xdist: most tests wait on real peers (nats-server, serve, the emulated BlueZ), so more workers than
# cores pay. `--dist loadfile` keeps each file on one worker, so a module-scoped peer (a lab, a built wheel, a
# shared avahi) starts once and its tests run in order (xdist 3.8's `loadgroup` groups nothing under
# pytest 9). SENSORIUM_TEST_WORKERS overrides the count; `-n 0` among the arguments runs serially.
echo "== pytest" && exec .venv/bin/python -m pytest -n "${SENSORIUM_TEST_WORKERS:-6}" --dist loadfile "$@"
