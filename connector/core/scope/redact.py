"""Projections of a scope: its durable, redacted form (CONTRACT §7) and the hint a backend may filter on."""

from __future__ import annotations

from typing import Any

from connector.core.scope.model import IDENTITY_SELECTORS, PREFIX_KEYS, DiscoveryScope, filter_keys


def redacted_scope(scope: DiscoveryScope) -> dict[str, Any]:
    """The durable form of a scope (CONTRACT §7): no identity selectors, prefixes and exclusions by key
    only."""
    filters: dict[str, Any] = {}
    redacted_keys: list[str] = []
    for key in filter_keys(scope.filters):
        if key in PREFIX_KEYS:
            redacted_keys.append(key)
        elif key not in IDENTITY_SELECTORS:
            filters[key] = _durable_value(key, getattr(scope.filters, key))
    result: dict[str, Any] = {
        "transport": scope.transport,
        "window_seconds": scope.window_seconds,
        "limits": {"max_candidates": scope.max_candidates, "max_snapshot_bytes": scope.max_snapshot_bytes},
        "filters": filters,
    }
    if redacted_keys:
        result["filters_redacted"] = redacted_keys
    if scope.exclusions is not None:
        keys = [key for key in filter_keys(scope.exclusions) if key not in IDENTITY_SELECTORS]
        if keys:
            result["exclusions"] = keys
    if scope.adapter is not None:
        result["adapter"] = scope.adapter
    return result


def _durable_value(key: str, value: Any) -> Any:
    if key == "vid_pid":
        return [{"vid": vid, "pid": pid} for vid, pid in value]
    if isinstance(value, tuple):
        return list(value)
    return value


def backend_filter_hint(scope: DiscoveryScope) -> dict[str, Any]:
    """Positive filters a backend may apply on its side (a superset of the scope; never exclusions)."""
    hint: dict[str, Any] = {}
    for key in ("service_uuids", "manufacturer_ids", "service_types", "vid_pid"):
        value = getattr(scope.filters, key)
        if value:
            hint[key] = list(value)
    if scope.filters.min_rssi_dbm is not None:
        hint["min_rssi_dbm"] = scope.filters.min_rssi_dbm
    return hint
