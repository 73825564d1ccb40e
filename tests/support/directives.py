"""`sensorium-directive.v1` builders: a discovery scan and a command invocation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCAN = "device.discovery.scan"
HEART_RATE = "0000180d-0000-1000-8000-00805f9b34fb"
HTTP = "_http._tcp.local."
DEFAULT_FILTERS: dict[str, dict[str, Any]] = {
    "ble": {"service_uuids": [HEART_RATE]},
    "mdns": {"service_types": [HTTP]},
}


def scan_directive(
    window: int = 1,
    *,
    transport: str = "ble",
    filters: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
    key: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An async, status-v2 discovery scan (heart-rate straps unless `filters`); `extra`: top-level keys."""
    chosen = filters if filters is not None else DEFAULT_FILTERS.get(transport, {})
    directive: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "action_id": SCAN,
        "timing": {"mode": "async", "status_versions": [2], **(timing or {})},
        "input": {"transport": transport, "window_seconds": window, "filters": dict(chosen)},
        **(extra or {}),
    }
    if key is not None:
        directive["idempotency_key"] = key
    return directive


def command_directive(
    action_id: str,
    mode: str = "async",
    input: Mapping[str, Any] | None = None,
    *,
    timing: Mapping[str, Any] | None = None,
    key: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A command invocation (no input unless `input`); `extra` adds top-level keys."""
    directive: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "action_id": action_id,
        "timing": {"mode": mode, **(timing or {})},
        "input": dict(input or {}),
        **(extra or {}),
    }
    if key is not None:
        directive["idempotency_key"] = key
    return directive
