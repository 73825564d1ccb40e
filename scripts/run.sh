#!/usr/bin/env bash
# The main job: set up .venv, then run the connector service (connector, reference host, poller, console)
# on 127.0.0.1:8787 with its embedded SQLite state under .sensorium/. On the first run it creates a caller
# and an operator principal and prints their bearer tokens once (only hashes are stored); every run prints
# what to try next. Extra arguments go to `sensorium-connector serve`, for example
# `scripts/run.sh --replay ble=hw-fixtures/ble-heart-rate-lab.jsonl` for BLE devices without a radio.
# SENSORIUM_DATA_DIR chooses another state directory (tests use it to stay out of .sensorium/).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help)  # help only: no bootstrap, no data dir, no tokens
    sed -n '2,7s/^# \{0,1\}//p' "$0"
    echo
    if [ -x .venv/bin/sensorium-connector ]; then
      echo "the arguments \`sensorium-connector serve\` takes:"
      .venv/bin/sensorium-connector serve --help
    fi
    exit 0
    ;;
esac
scripts/bootstrap.sh
data_dir=${SENSORIUM_DATA_DIR:-.sensorium}
mkdir -p "$data_dir"
cli=.venv/bin/sensorium-connector
if [ ! -f "$data_dir/principals.json" ]; then
  caller=$("$cli" principals add --data-dir "$data_dir" --id bench --role caller \
    --grant device.discovery.scan --grant whisper.redaction.prepare --grant sensorium.os.info | tail -n 1)
  operator=$("$cli" principals add --data-dir "$data_dir" --id operator --role operator | tail -n 1)
  echo "caller token (principal 'bench'):     $caller"
  echo "operator token (principal 'operator'): $operator"
  echo "(shown only now: only their hashes are stored)"
else
  echo "tokens were printed on the first start only; mint a new one with:"
  echo "  $cli principals add --data-dir $data_dir --id NAME --role caller --grant device.discovery.scan"
  echo "  $cli principals add --data-dir $data_dir --id NAME --role operator"
fi
cat <<NEXT
next steps (see README.md, "Usage"):
  console:          http://127.0.0.1:8787/admin/deferred-operations  (sign in with the operator token)
  adapters:         http://127.0.0.1:8787/admin/adapters
  no radio here?    scripts/run.sh --replay ble=hw-fixtures/ble-heart-rate-lab.jsonl
  terminal scan:    $cli scan --transport ble --window 5 --filter service_uuid=180d --replay hw-fixtures/ble-heart-rate-lab.jsonl
  HTTP with curl:   admit, long poll, cancel and bind, as in README.md
NEXT
exec "$cli" serve --data-dir "$data_dir" "$@"
