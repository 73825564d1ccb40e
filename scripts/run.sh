#!/usr/bin/env bash
# The main job: set up .venv, verify the example catalog.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/sensorium-connector catalog verify catalog/actions.json --data-dir .sensorium "$@"
