"""Recorder tests reuse the transport peers of the provider tests (emulated BlueZ, a zeroconf responder)."""

from __future__ import annotations

import sys
from pathlib import Path

PROVIDER_PEERS = Path(__file__).resolve().parents[1] / "providers"
if str(PROVIDER_PEERS) not in sys.path:
    # `bluez_mock` and `mdns_peer` live beside the provider tests, which import them as top-level modules.
    sys.path.insert(0, str(PROVIDER_PEERS))
