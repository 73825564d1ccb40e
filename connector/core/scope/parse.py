"""Parsing a discovery `input` (CONTRACT §6.1): validate, clamp to the profile, refuse with every failing
path.

Refusals are `AdmissionError(code="invalid-input")` whose diagnostics name JSON paths and rule names only;
a caller's value never appears in them. An unknown key is named in its path when it has the shape of a key
(`[a-z_][a-z0-9_]{0,63}`), so a caller can see which one failed; any other key text is left out.

One filter language (CONTRACT §6.1): UUIDs as 128-bit strings or 16-/32-bit short forms in any case, and
`vid_pid` elements as `{vid, pid}` objects or `"0403:6001"` strings, as the CLI writes them. Everything is
normalised (lowercase 128-bit UUIDs, integer pairs) before admission, so the fingerprint, the admitted scope
and every status show one canonical form.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from connector.contract.transports import TRANSPORTS, Transport
from connector.core.scope.model import (
    ALL_FILTER_KEYS,
    BLUETOOTH_BASE_UUID_SUFFIX,
    EMPTY_SNAPSHOT_BYTES,
    INPUT_KEYS,
    LIMIT_KEYS,
    MAX_LIST_ITEMS,
    MAX_STRING_CHARS,
    RSSI_RANGE,
    DiscoveryProfile,
    DiscoveryScope,
    ScopeFilter,
    filter_keys,
)
from connector.core.transports import TRANSPORT_FACTS
from connector.errors import AdmissionError, Code

_UUID128 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_SHORT = re.compile(r"[0-9a-fA-F]{4}|[0-9a-fA-F]{8}")
_SERVICE_TYPE = re.compile(r"_[a-z0-9][a-z0-9-]{0,62}\._(?:tcp|udp)(?:\.local)?\.?")
_ADAPTER = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_VID_PID = re.compile(r"([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4})")
_KEY_SHAPE = re.compile(r"[a-z_][a-z0-9_]{0,63}")


def key_path(path: str, key: object) -> str:
    """The path of an unknown key: named when it has the shape of a key, else its object's path."""
    return f"{path}/{key}" if isinstance(key, str) and _KEY_SHAPE.fullmatch(key) else path


class Problems:
    """Collects `path: rule` diagnostics; never values."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, rule: str) -> None:
        """Record one failing path."""
        self.items.append(f"{path}: {rule}")

    def raise_if_any(self) -> None:
        """Raise the collected refusal, if any."""
        if self.items:
            raise invalid_input(self.items)


def invalid_input(messages: Sequence[str]) -> AdmissionError:
    """The 422 `invalid-input` refusal carrying `path: rule` diagnostics."""
    diagnostics = [{"code": Code.INVALID_INPUT, "message": message} for message in messages]
    return AdmissionError("discovery input is invalid", code=Code.INVALID_INPUT, diagnostics=diagnostics)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value: object, low: int, high: int, path: str, problems: Problems) -> int | None:
    if not _is_int(value):
        problems.add(path, "integer")
        return None
    assert isinstance(value, int)
    if value < low:
        problems.add(path, "minimum")
        return None
    if value > high:
        problems.add(path, "maximum")
        return None
    return value


def _string(value: object, path: str, problems: Problems) -> str | None:
    if not isinstance(value, str):
        problems.add(path, "string")
        return None
    if not value:
        problems.add(path, "min-length")
        return None
    if len(value) > MAX_STRING_CHARS:
        problems.add(path, "max-length")
        return None
    return value


def _items(value: object, path: str, problems: Problems) -> list[tuple[str, Any]]:
    """(item path, item) pairs of a bounded, non-empty JSON list."""
    if not isinstance(value, list):
        problems.add(path, "array")
        return []
    if not value:
        problems.add(path, "min-items")
        return []
    if len(value) > MAX_LIST_ITEMS:
        problems.add(path, "max-items")
        return []
    return [(f"{path}/{index}", item) for index, item in enumerate(value)]


def _unique(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


def normalise_service_type(service_type: str) -> str:
    """`_http._tcp`, `_HTTP._tcp.local` and `_http._tcp.local.` all become `_http._tcp.local.`."""
    text = service_type.strip().lower().rstrip(".")
    if not text.endswith(".local"):
        text += ".local"
    return text + "."


def _uuid_list(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    found = []
    for item_path, item in _items(value, path, problems):
        expanded = expand_uuid(item) if isinstance(item, str) else None
        if expanded is None:
            problems.add(item_path, "uuid")
        else:
            found.append(expanded)
    return _unique(found)


def _int_list(value: object, path: str, problems: Problems, high: int) -> tuple[int, ...]:
    found = [_int_in(item, 0, high, item_path, problems) for item_path, item in _items(value, path, problems)]
    return _unique([item for item in found if item is not None])


def _string_list(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    found = [_string(item, item_path, problems) for item_path, item in _items(value, path, problems)]
    return _unique([item for item in found if item is not None])


def _vid_pid_list(value: object, path: str, problems: Problems) -> tuple[tuple[int, int], ...]:
    found = []
    for item_path, item in _items(value, path, problems):
        pair = _vid_pid(item, item_path, problems)
        if pair is not None:
            found.append(pair)
    return _unique(found)


def _vid_pid(item: object, path: str, problems: Problems) -> tuple[int, int] | None:
    if isinstance(item, str):
        matched = _VID_PID.fullmatch(item)
        if matched is None:
            problems.add(path, "vid-pid")
            return None
        return int(matched[1], 16), int(matched[2], 16)
    if not isinstance(item, Mapping):
        problems.add(path, "vid-pid")
        return None
    for key in sorted(set(item) - {"vid", "pid"}, key=str):
        problems.add(key_path(path, key), "unknown-key")
    values = []
    for key in ("vid", "pid"):
        if key not in item:
            problems.add(f"{path}/{key}", "required")
        else:
            values.append(_int_in(item[key], 0, 0xFFFF, f"{path}/{key}", problems))
    if len(values) != 2 or values[0] is None or values[1] is None:
        return None
    return values[0], values[1]


def _service_type_list(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    found = []
    for item_path, item in _items(value, path, problems):
        if isinstance(item, str) and _SERVICE_TYPE.fullmatch(item.lower()):
            found.append(normalise_service_type(item))
        else:
            problems.add(item_path, "service-type")
    return _unique(found)


def _address_list(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    return _unique([address.upper() for address in _string_list(value, path, problems)])


_ValueRule = Callable[[object, str, Problems], object]

# One value rule per filter key (which keys a transport takes is its `TransportFacts.filter_keys`).
_VALUE_RULES: Mapping[str, _ValueRule] = {
    "service_uuids": _uuid_list,
    "manufacturer_ids": lambda value, path, problems: _int_list(value, path, problems, 0xFFFF),
    "name_prefix": _string,
    "min_rssi_dbm": lambda value, path, problems: _int_in(value, *RSSI_RANGE, path, problems),
    "addresses": _address_list,
    "vid_pid": _vid_pid_list,
    "serial_numbers": _string_list,
    "service_types": _service_type_list,
    "instance_prefix": _string,
}


def _parse_filter(value: object, transport: Transport | None, path: str, problems: Problems) -> ScopeFilter:
    """One `filters` / `exclusions` object, keeping only keys valid for the transport."""
    if not isinstance(value, Mapping):
        problems.add(path, "object")
        return ScopeFilter()
    allowed = TRANSPORT_FACTS[transport].filter_keys if transport is not None else tuple(ALL_FILTER_KEYS)
    fields: dict[str, Any] = {}
    for key, item in value.items():
        if key not in ALL_FILTER_KEYS:
            problems.add(key_path(path, key), "unknown-key")
        elif key not in allowed:
            problems.add(f"{path}/{key}", "not-for-transport")
        else:
            parsed = _VALUE_RULES[key](item, f"{path}/{key}", problems)
            if parsed is not None:
                fields[key] = parsed
    return ScopeFilter(**fields)


def _parse_transport(
    raw: Mapping[str, Any], profile: DiscoveryProfile, problems: Problems
) -> Transport | None:
    if "transport" not in raw:
        problems.add("/input/transport", "required")
        return None
    value = raw["transport"]
    for transport in TRANSPORTS:
        if value == transport:
            if transport not in profile.transports:
                problems.add("/input/transport", "transport-not-allowed")
                return None
            return transport
    problems.add("/input/transport", "enum")
    return None


def _parse_window(
    raw: Mapping[str, Any], profile: DiscoveryProfile, timeout_ms: int | None, problems: Problems
) -> int | None:
    if "window_seconds" not in raw:
        problems.add("/input/window_seconds", "required")
        return None
    window = _int_in(raw["window_seconds"], 1, profile.max_window_seconds, "/input/window_seconds", problems)
    if window is not None and timeout_ms is not None and window * 1000 > timeout_ms:
        problems.add("/input/window_seconds", "window-exceeds-timeout")
        return None
    return window


def _parse_limits(raw: Mapping[str, Any], profile: DiscoveryProfile, problems: Problems) -> tuple[int, int]:
    """Requested limits clamped DOWN to the profile (a caller can only narrow)."""
    candidates, snapshot_bytes = profile.max_candidates, profile.max_snapshot_bytes
    if "limits" not in raw:
        return candidates, snapshot_bytes
    limits = raw["limits"]
    if not isinstance(limits, Mapping):
        problems.add("/input/limits", "object")
        return candidates, snapshot_bytes
    for key in sorted(set(limits) - set(LIMIT_KEYS), key=str):
        problems.add(key_path("/input/limits", key), "unknown-key")
    if "max_candidates" in limits:
        value = _int_in(limits["max_candidates"], 1, 2**31, "/input/limits/max_candidates", problems)
        candidates = min(candidates, value) if value is not None else candidates
    if "max_snapshot_bytes" in limits:
        path = "/input/limits/max_snapshot_bytes"
        value = _int_in(limits["max_snapshot_bytes"], EMPTY_SNAPSHOT_BYTES, 2**31, path, problems)
        snapshot_bytes = min(snapshot_bytes, value) if value is not None else snapshot_bytes
    return candidates, snapshot_bytes


def _parse_adapter(raw: Mapping[str, Any], problems: Problems) -> str | None:
    value = raw.get("adapter")
    if value is None and "adapter" not in raw:
        return None
    if not isinstance(value, str) or not _ADAPTER.fullmatch(value):
        problems.add("/input/adapter", "adapter-name")
        return None
    return value


def _check_filters_present(
    raw_filters: object, transport: Transport | None, profile: DiscoveryProfile, problems: Problems
) -> None:
    """Refuse a scan without filters (unless its profile allows it) or its transport's required keys."""
    given = set(raw_filters) if isinstance(raw_filters, Mapping) else set()
    required = TRANSPORT_FACTS[transport].required_filters if transport is not None else ()
    missing = [key for key in required if key not in given]
    for key in missing:
        problems.add(f"/input/filters/{key}", "required")
    if not missing and not given & ALL_FILTER_KEYS and not profile.allow_unfiltered:
        problems.add("/input/filters", "at-least-one-filter")


def parse_discovery_input(
    raw: Mapping[str, Any], profile: DiscoveryProfile, *, timeout_ms: int | None = None
) -> DiscoveryScope:
    """Validate and clamp a discovery `input` (CONTRACT §6.1); refuse with every failing path at once."""
    problems = Problems()
    if not isinstance(raw, Mapping):
        problems.add("/input", "object")
        problems.raise_if_any()
    for key in sorted(set(raw) - INPUT_KEYS, key=str):
        problems.add(key_path("/input", key), "unknown-key")
    transport = _parse_transport(raw, profile, problems)
    window = _parse_window(raw, profile, timeout_ms, problems)
    max_candidates, max_snapshot_bytes = _parse_limits(raw, profile, problems)
    raw_filters = raw.get("filters", {})
    filters = _parse_filter(raw_filters, transport, "/input/filters", problems)
    _check_filters_present(raw_filters, transport, profile, problems)
    exclusions = None
    if "exclusions" in raw:
        exclusions = _parse_filter(raw["exclusions"], transport, "/input/exclusions", problems)
    adapter = _parse_adapter(raw, problems)
    problems.raise_if_any()
    assert transport is not None and window is not None
    return DiscoveryScope(
        transport=transport,
        window_seconds=window,
        max_candidates=max_candidates,
        max_snapshot_bytes=max_snapshot_bytes,
        filters=filters,
        exclusions=exclusions if exclusions is not None and filter_keys(exclusions) else None,
        adapter=adapter,
        cleanup_timeout_ms=profile.cleanup_timeout_ms,
    )


def normalised_input(raw: Mapping[str, Any], scope: DiscoveryScope) -> dict[str, Any]:
    """The admitted `input` with its UUIDs and `vid_pid` pairs in canonical form (for the fingerprint)."""
    normal = dict(raw)
    for name, parsed in (("filters", scope.filters), ("exclusions", scope.exclusions)):
        given = raw.get(name)
        if not isinstance(given, Mapping) or parsed is None:
            continue
        part = dict(given)
        if "service_uuids" in part:
            part["service_uuids"] = list(parsed.service_uuids)
        if "vid_pid" in part:
            part["vid_pid"] = [{"vid": vid, "pid": pid} for vid, pid in parsed.vid_pid]
        normal[name] = part
    return normal


def expand_uuid(text: str) -> str | None:
    """A 16/32-bit short form (`180d`) on the Bluetooth base UUID, or a 128-bit UUID, lowercased."""
    if _UUID_SHORT.fullmatch(text):
        return f"{int(text, 16):08x}{BLUETOOTH_BASE_UUID_SUFFIX}"
    lowered = text.lower()
    return lowered if _UUID128.fullmatch(lowered) else None
