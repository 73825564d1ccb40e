#!/usr/bin/env bash
# The main job: set up .venv, then run the connector service (connector, reference host, poller, console)
# on 127.0.0.1:8787 with its embedded SQLite state under .sensorium/. On the first run it creates a caller
# and an operator principal and prints their bearer tokens once (only hashes are stored).
# Extra arguments go to `sensorium-connector serve` (e.g. --replay ble=hw-fixtures/ble-heart-rate-lab.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
data_dir=.sensorium
mkdir -p "$data_dir"
cli=.venv/bin/sensorium-connector
if [ ! -f "$data_dir/principals.json" ]; then
  caller=$("$cli" principals add --data-dir "$data_dir" --id bench --role caller \
    --grant device.discovery.scan --grant whisper.redaction.prepare --grant sensorium.os.info | tail -n 1)
  operator=$("$cli" principals add --data-dir "$data_dir" --id operator --role operator | tail -n 1)
  echo "caller token (principal 'bench'):     $caller"
  echo "operator token (principal 'operator'): $operator"
  echo "console: http://127.0.0.1:8787/admin/deferred-operations"
fi
exec "$cli" serve --data-dir "$data_dir" "$@"
