"""Builders shared by the pure discovery core tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from connector.core.observations import BleObservation, MdnsObservation, UsbObservation
from connector.core.scope import DiscoveryProfile, DiscoveryScope, parse_discovery_input
from connector.core.snapshot import CandidateTable

# 2026-11-30T12:00:00Z
T0 = 1_796_040_000_000
HR_UUID = "0000180d-0000-1000-8000-00805f9b34fb"
BATTERY_UUID = "0000180f-0000-1000-8000-00805f9b34fb"

CATALOG_PROFILE = DiscoveryProfile(
    transports=("ble", "usb-serial", "mdns"),
    max_window_seconds=60,
    max_candidates=64,
    max_snapshot_bytes=65536,
    min_revision_interval_ms=250,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=2000,
)


def profile(**changes: Any) -> DiscoveryProfile:
    """The catalog profile with some fields changed."""
    fields = {name: getattr(CATALOG_PROFILE, name) for name in CATALOG_PROFILE.__slots__}
    fields.update(changes)
    return DiscoveryProfile(**fields)


def scope_of(raw: dict[str, Any], prof: DiscoveryProfile = CATALOG_PROFILE) -> DiscoveryScope:
    """Parse a raw input with a window default."""
    return parse_discovery_input({"window_seconds": 10, **raw}, prof)


def ble(address: str = "C2:00:00:00:00:01", rssi: int = -60, **fields: Any) -> BleObservation:
    """A BLE advert."""
    return BleObservation(address=address, rssi=rssi, **fields)


def usb(device: str = "/dev/ttyUSB0", event: str = "add", **fields: Any) -> UsbObservation:
    """A USB serial port event."""
    return UsbObservation(event=event, device=device, **fields)  # type: ignore[arg-type]


def mdns(name: str = "Lab printer._ipp._tcp.local.", event: str = "add", **fields: Any) -> MdnsObservation:
    """An mDNS service instance event."""
    fields.setdefault("service_type", "_ipp._tcp.local.")
    return MdnsObservation(event=event, name=name, **fields)  # type: ignore[arg-type]


def ref_factory(prefix: str = "ref") -> Callable[[], str]:
    """Deterministic refs for tests (the runtime passes random ones)."""
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter):04d}"


def table_for(
    raw: dict[str, Any], prof: DiscoveryProfile = CATALOG_PROFILE, generation: str = "gen-1"
) -> CandidateTable:
    """A table over a parsed scope."""
    return CandidateTable(scope_of(raw, prof), prof, generation=generation, new_ref=ref_factory())
