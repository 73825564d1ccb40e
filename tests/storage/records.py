"""Rows the storage tests write: pending discovery records with fresh ids."""

from __future__ import annotations

from connector.storage.state import DiscoveryRecord

WRITERS = 8  # concurrent writers of the group-commit tests


def discovery_record(number: int) -> DiscoveryRecord:
    """A pending BLE discovery record of alice, its id derived from `number`."""
    op_id = f"deferred:sensorium.directive.invoke:{number:026d}"
    metadata = {"operation/id": op_id, "status": "pending"}
    return DiscoveryRecord(op_id, "alice", "device.discovery.scan", "ble", "pending", metadata, {"id": op_id})
