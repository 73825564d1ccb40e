"""Discovery scope: the admitted transport, window, limits and filters of one scan (SPEC 6.1, 6.3).

Rules of this file:
- parsing refuses with `AdmissionError(code="invalid-input")` whose diagnostics name JSON paths and rule
  names only; a caller's value (or an unknown key name, which is caller text too) never appears in them;
- within `filters` the keys combine with AND and a list matches any of its elements; within `exclusions`
  every key excludes on its own;
- `name_prefix` and `instance_prefix` compare case-sensitively (a literal prefix, as typed);
- a removal observation is judged only on the fields it carries: a USB `remove` often lacks vid/pid, and it
  must still reach the candidate table, which drops it unless its device key is already a candidate.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connector.contract.transports import TRANSPORTS, Transport
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.errors import AdmissionError


@dataclass(frozen=True, slots=True)
class ScopeFilter:
    """One `filters` or `exclusions` object; only the scope transport's keys are ever set."""

    service_uuids: tuple[str, ...] = ()
    manufacturer_ids: tuple[int, ...] = ()
    name_prefix: str | None = None
    min_rssi_dbm: int | None = None
    addresses: tuple[str, ...] = ()
    vid_pid: tuple[tuple[int, int], ...] = ()
    serial_numbers: tuple[str, ...] = ()
    service_types: tuple[str, ...] = ()
    instance_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class DiscoveryProfile:
    """The catalog's `discovery` profile of an action (SPEC 6.1)."""

    transports: tuple[Transport, ...]
    max_window_seconds: int
    max_candidates: int
    max_snapshot_bytes: int
    min_revision_interval_ms: int
    max_revisions: int
    candidate_ttl_seconds: int
    cleanup_timeout_ms: int
    allow_unfiltered: bool = False
    result_retention_seconds: int = 600


@dataclass(frozen=True, slots=True, weakref_slot=True)
class DiscoveryScope:
    """An admitted scan scope, already clamped to its profile."""

    transport: Transport
    window_seconds: int
    max_candidates: int
    max_snapshot_bytes: int
    filters: ScopeFilter
    exclusions: ScopeFilter | None = None
    adapter: str | None = None
    # Copied from the profile so that a provider can bound its own stop().
    cleanup_timeout_ms: int = 2000


# ---------------------------------------------------------------------------------------------------------
# Vocabulary

FILTER_KEYS: Mapping[Transport, tuple[str, ...]] = {
    "ble": ("service_uuids", "manufacturer_ids", "name_prefix", "min_rssi_dbm", "addresses"),
    "usb-serial": ("vid_pid", "serial_numbers"),
    "mdns": ("service_types", "instance_prefix"),
}
ALL_FILTER_KEYS: frozenset[str] = frozenset(key for keys in FILTER_KEYS.values() for key in keys)
IDENTITY_SELECTORS: frozenset[str] = frozenset({"addresses", "serial_numbers"})
PREFIX_KEYS: frozenset[str] = frozenset({"name_prefix", "instance_prefix"})
INPUT_KEYS: frozenset[str] = frozenset(
    {"transport", "window_seconds", "limits", "filters", "exclusions", "adapter"}
)
LIMIT_KEYS: tuple[str, ...] = ("max_candidates", "max_snapshot_bytes")

MAX_LIST_ITEMS = 64
MAX_STRING_CHARS = 256
# `{"candidates":[]}`: no byte bound can be smaller than the empty snapshot; each candidate adds its
# canonical bytes and, after the first, one comma.
EMPTY_SNAPSHOT_BYTES = 17
RSSI_RANGE = (-128, 127)
BLUETOOTH_BASE_UUID_SUFFIX = "-0000-1000-8000-00805f9b34fb"

_UUID128 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_SHORT = re.compile(r"[0-9a-fA-F]{4}|[0-9a-fA-F]{8}")
_SERVICE_TYPE = re.compile(r"_[a-z0-9][a-z0-9-]{0,62}\._(?:tcp|udp)(?:\.local)?\.?")
_ADAPTER = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_HEX16 = re.compile(r"[0-9a-fA-F]{1,4}")


# ---------------------------------------------------------------------------------------------------------
# Parsing (SPEC 6.1)


class _Problems:
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
    diagnostics = [{"code": "invalid-input", "message": message} for message in messages]
    return AdmissionError("discovery input is invalid", code="invalid-input", diagnostics=diagnostics)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value: object, low: int, high: int, path: str, problems: _Problems) -> int | None:
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


def _string(value: object, path: str, problems: _Problems) -> str | None:
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


def _items(value: object, path: str, problems: _Problems) -> list[tuple[str, Any]]:
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


def _uuid_list(value: object, path: str, problems: _Problems) -> tuple[str, ...]:
    found = []
    for item_path, item in _items(value, path, problems):
        if isinstance(item, str) and _UUID128.fullmatch(item):
            found.append(item)
        else:
            problems.add(item_path, "uuid-128-lowercase")
    return _unique(found)


def _int_list(value: object, path: str, problems: _Problems, high: int) -> tuple[int, ...]:
    found = [_int_in(item, 0, high, item_path, problems) for item_path, item in _items(value, path, problems)]
    return _unique([item for item in found if item is not None])


def _string_list(value: object, path: str, problems: _Problems) -> tuple[str, ...]:
    found = [_string(item, item_path, problems) for item_path, item in _items(value, path, problems)]
    return _unique([item for item in found if item is not None])


def _vid_pid_list(value: object, path: str, problems: _Problems) -> tuple[tuple[int, int], ...]:
    found = []
    for item_path, item in _items(value, path, problems):
        pair = _vid_pid(item, item_path, problems)
        if pair is not None:
            found.append(pair)
    return _unique(found)


def _vid_pid(item: object, path: str, problems: _Problems) -> tuple[int, int] | None:
    if not isinstance(item, Mapping):
        problems.add(path, "object")
        return None
    if set(item) - {"vid", "pid"}:
        problems.add(path, "unknown-key")
    values = []
    for key in ("vid", "pid"):
        if key not in item:
            problems.add(f"{path}/{key}", "required")
        else:
            values.append(_int_in(item[key], 0, 0xFFFF, f"{path}/{key}", problems))
    if len(values) != 2 or values[0] is None or values[1] is None:
        return None
    return values[0], values[1]


def _service_type_list(value: object, path: str, problems: _Problems) -> tuple[str, ...]:
    found = []
    for item_path, item in _items(value, path, problems):
        if isinstance(item, str) and _SERVICE_TYPE.fullmatch(item.lower()):
            found.append(normalise_service_type(item))
        else:
            problems.add(item_path, "service-type")
    return _unique(found)


def _address_list(value: object, path: str, problems: _Problems) -> tuple[str, ...]:
    return _unique([address.upper() for address in _string_list(value, path, problems)])


def _parse_filter_value(key: str, value: object, path: str, problems: _Problems) -> object:
    """Dispatch one filter key to its value rule."""
    if key == "service_uuids":
        return _uuid_list(value, path, problems)
    if key == "manufacturer_ids":
        return _int_list(value, path, problems, 0xFFFF)
    if key in PREFIX_KEYS:
        return _string(value, path, problems)
    if key == "min_rssi_dbm":
        return _int_in(value, RSSI_RANGE[0], RSSI_RANGE[1], path, problems)
    if key == "addresses":
        return _address_list(value, path, problems)
    if key == "vid_pid":
        return _vid_pid_list(value, path, problems)
    if key == "serial_numbers":
        return _string_list(value, path, problems)
    return _service_type_list(value, path, problems)


def _parse_filter(value: object, transport: Transport | None, path: str, problems: _Problems) -> ScopeFilter:
    """One `filters` / `exclusions` object, keeping only keys valid for the transport."""
    if not isinstance(value, Mapping):
        problems.add(path, "object")
        return ScopeFilter()
    allowed = FILTER_KEYS[transport] if transport is not None else tuple(ALL_FILTER_KEYS)
    fields: dict[str, Any] = {}
    for key, item in value.items():
        if key not in ALL_FILTER_KEYS:
            problems.add(path, "unknown-key")
        elif key not in allowed:
            problems.add(f"{path}/{key}", "not-for-transport")
        else:
            parsed = _parse_filter_value(key, item, f"{path}/{key}", problems)
            if parsed is not None:
                fields[key] = parsed
    return ScopeFilter(**fields)


def filter_keys(scope_filter: ScopeFilter) -> tuple[str, ...]:
    """The keys set in a filter, in vocabulary order."""
    return tuple(key for key in _ORDERED_KEYS if getattr(scope_filter, key) not in (None, ()))


_ORDERED_KEYS: tuple[str, ...] = tuple(key for keys in FILTER_KEYS.values() for key in keys)


def _parse_transport(
    raw: Mapping[str, Any], profile: DiscoveryProfile, problems: _Problems
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
    raw: Mapping[str, Any], profile: DiscoveryProfile, timeout_ms: int | None, problems: _Problems
) -> int | None:
    if "window_seconds" not in raw:
        problems.add("/input/window_seconds", "required")
        return None
    window = _int_in(raw["window_seconds"], 1, profile.max_window_seconds, "/input/window_seconds", problems)
    if window is not None and timeout_ms is not None and window * 1000 > timeout_ms:
        problems.add("/input/window_seconds", "window-exceeds-timeout")
        return None
    return window


def _parse_limits(raw: Mapping[str, Any], profile: DiscoveryProfile, problems: _Problems) -> tuple[int, int]:
    """Requested limits clamped DOWN to the profile (a caller can only narrow)."""
    candidates, snapshot_bytes = profile.max_candidates, profile.max_snapshot_bytes
    if "limits" not in raw:
        return candidates, snapshot_bytes
    limits = raw["limits"]
    if not isinstance(limits, Mapping):
        problems.add("/input/limits", "object")
        return candidates, snapshot_bytes
    if set(limits) - set(LIMIT_KEYS):
        problems.add("/input/limits", "unknown-key")
    if "max_candidates" in limits:
        value = _int_in(limits["max_candidates"], 1, 2**31, "/input/limits/max_candidates", problems)
        candidates = min(candidates, value) if value is not None else candidates
    if "max_snapshot_bytes" in limits:
        path = "/input/limits/max_snapshot_bytes"
        value = _int_in(limits["max_snapshot_bytes"], EMPTY_SNAPSHOT_BYTES, 2**31, path, problems)
        snapshot_bytes = min(snapshot_bytes, value) if value is not None else snapshot_bytes
    return candidates, snapshot_bytes


def _parse_adapter(raw: Mapping[str, Any], problems: _Problems) -> str | None:
    value = raw.get("adapter")
    if value is None and "adapter" not in raw:
        return None
    if not isinstance(value, str) or not _ADAPTER.fullmatch(value):
        problems.add("/input/adapter", "adapter-name")
        return None
    return value


def _check_filters_present(
    raw_filters: object, transport: Transport | None, profile: DiscoveryProfile, problems: _Problems
) -> None:
    """Refuse a scan without filters (unless the profile allows it) and an mDNS scan without types."""
    given = set(raw_filters) if isinstance(raw_filters, Mapping) else set()
    if transport == "mdns" and "service_types" not in given:
        problems.add("/input/filters/service_types", "required")
    elif not given & ALL_FILTER_KEYS and not profile.allow_unfiltered:
        problems.add("/input/filters", "at-least-one-filter")


def parse_discovery_input(
    raw: Mapping[str, Any], profile: DiscoveryProfile, *, timeout_ms: int | None = None
) -> DiscoveryScope:
    """Validate and clamp a discovery `input` (SPEC 6.1); refuse with every failing path at once."""
    problems = _Problems()
    if not isinstance(raw, Mapping):
        problems.add("/input", "object")
        problems.raise_if_any()
    if set(raw) - INPUT_KEYS:
        problems.add("/input", "unknown-key")
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


# ---------------------------------------------------------------------------------------------------------
# CLI forms (SPEC 12)

_CLI_LIST_KEYS: Mapping[str, str] = {
    "service_uuid": "service_uuids",
    "manufacturer_id": "manufacturer_ids",
    "address": "addresses",
    "vid_pid": "vid_pid",
    "serial_number": "serial_numbers",
    "service_type": "service_types",
}
_CLI_SCALAR_KEYS: Mapping[str, str] = {
    "name_prefix": "name_prefix",
    "min_rssi_dbm": "min_rssi_dbm",
    "instance_prefix": "instance_prefix",
}


def expand_uuid(text: str) -> str | None:
    """A 16/32-bit short form (`180d`) on the Bluetooth base UUID, or a 128-bit UUID, lowercased."""
    if _UUID_SHORT.fullmatch(text):
        return f"{int(text, 16):08x}{BLUETOOTH_BASE_UUID_SUFFIX}"
    lowered = text.lower()
    return lowered if _UUID128.fullmatch(lowered) else None


def _cli_int(text: str, base: int = 10) -> int | None:
    try:
        return int(text, base)
    except ValueError:
        return None


def _cli_vid_pid(text: str) -> dict[str, int] | None:
    vid, sep, pid = text.partition(":")
    if not sep or not _HEX16.fullmatch(vid) or not _HEX16.fullmatch(pid):
        return None
    return {"vid": int(vid, 16), "pid": int(pid, 16)}


def _cli_value(key: str, text: str) -> object:
    """Convert one CLI value to its JSON form; None when malformed."""
    if key == "service_uuid":
        return expand_uuid(text)
    if key == "manufacturer_id":
        # Decimal (as SPEC 13 fixtures write company ids) or 0x hex (as the scan table prints them).
        if re.fullmatch(r"0[xX][0-9a-fA-F]{1,4}", text):
            return int(text, 16)
        return _cli_int(text) if re.fullmatch(r"[0-9]+", text) else None
    if key == "min_rssi_dbm":
        return _cli_int(text) if re.fullmatch(r"-?[0-9]+", text) else None
    if key == "vid_pid":
        return _cli_vid_pid(text)
    return text if text else None


def _cli_filter(pairs: Sequence[str], flag: str, problems: _Problems) -> dict[str, Any]:
    """`KEY=VALUE` pairs to one `filters`/`exclusions` object; list keys accumulate."""
    result: dict[str, Any] = {}
    for index, pair in enumerate(pairs):
        path = f"{flag}/{index}"
        key, sep, text = pair.partition("=")
        if not sep:
            problems.add(path, "key-value-form")
        elif key in _CLI_LIST_KEYS:
            value = _cli_value(key, text)
            if value is None:
                problems.add(f"{path}/{key}", "value-form")
            else:
                result.setdefault(_CLI_LIST_KEYS[key], []).append(value)
        elif key in _CLI_SCALAR_KEYS:
            value = _cli_value(key, text)
            if value is None:
                problems.add(f"{path}/{key}", "value-form")
            elif _CLI_SCALAR_KEYS[key] in result:
                problems.add(f"{path}/{key}", "repeated-key")
            else:
                result[_CLI_SCALAR_KEYS[key]] = value
        else:
            problems.add(path, "unknown-key")
    return result


def scope_input_from_cli(
    transport: str,
    window_seconds: int,
    filters: Sequence[str],
    exclusions: Sequence[str],
    max_candidates: int | None,
    adapter: str | None,
) -> dict[str, Any]:
    """Build a discovery `input` from `scan` flags; refuse malformed `KEY=VALUE` pairs."""
    problems = _Problems()
    raw: dict[str, Any] = {"transport": transport, "window_seconds": window_seconds}
    parsed_filters = _cli_filter(filters, "--filter", problems)
    parsed_exclusions = _cli_filter(exclusions, "--exclude", problems)
    problems.raise_if_any()
    if parsed_filters:
        raw["filters"] = parsed_filters
    if parsed_exclusions:
        raw["exclusions"] = parsed_exclusions
    if max_candidates is not None:
        raw["limits"] = {"max_candidates": max_candidates}
    if adapter is not None:
        raw["adapter"] = adapter
    return raw


# ---------------------------------------------------------------------------------------------------------
# Matching (SPEC 6.1, 6.3): compiled once per scope, because providers call it for every advert.

Matcher = Callable[[Observation], bool]
_Test = Callable[[Any], bool]


def _ble_tests(scope_filter: ScopeFilter) -> list[_Test]:
    tests: list[_Test] = []
    if scope_filter.service_uuids:
        uuids = frozenset(scope_filter.service_uuids)
        tests.append(lambda o: not uuids.isdisjoint(map(str.lower, o.service_uuids)))
    if scope_filter.manufacturer_ids:
        ids = frozenset(scope_filter.manufacturer_ids)
        tests.append(lambda o: not ids.isdisjoint(o.manufacturer_data))
    if scope_filter.name_prefix is not None:
        prefix = scope_filter.name_prefix
        tests.append(lambda o: o.name is not None and o.name.startswith(prefix))
    if scope_filter.min_rssi_dbm is not None:
        floor = scope_filter.min_rssi_dbm
        tests.append(lambda o: o.rssi >= floor)
    if scope_filter.addresses:
        addresses = frozenset(scope_filter.addresses)
        tests.append(lambda o: o.address.upper() in addresses)
    return tests


def _usb_tests(scope_filter: ScopeFilter, *, removal: bool) -> list[_Test]:
    # `removal`: a remove event is judged on what it carries; absent fields neither match nor refuse.
    tests: list[_Test] = []
    if scope_filter.vid_pid:
        pairs = frozenset(scope_filter.vid_pid)
        if removal:
            tests.append(lambda o: o.vid is None or o.pid is None or (o.vid, o.pid) in pairs)
        else:
            tests.append(lambda o: o.vid is not None and o.pid is not None and (o.vid, o.pid) in pairs)
    if scope_filter.serial_numbers:
        serials = frozenset(scope_filter.serial_numbers)
        if removal:
            tests.append(lambda o: o.serial_number is None or o.serial_number in serials)
        else:
            tests.append(lambda o: o.serial_number in serials)
    return tests


def _mdns_tests(scope_filter: ScopeFilter) -> list[_Test]:
    tests: list[_Test] = []
    if scope_filter.service_types:
        types = frozenset(scope_filter.service_types)
        tests.append(lambda o: normalise_service_type(o.service_type) in types)
    if scope_filter.instance_prefix is not None:
        prefix = scope_filter.instance_prefix
        tests.append(lambda o: mdns_instance(o.name, o.service_type).startswith(prefix))
    return tests


def _usb_exclusion_tests(scope_filter: ScopeFilter) -> list[_Test]:
    tests: list[_Test] = []
    if scope_filter.vid_pid:
        pairs = frozenset(scope_filter.vid_pid)
        tests.append(lambda o: o.vid is not None and o.pid is not None and (o.vid, o.pid) in pairs)
    if scope_filter.serial_numbers:
        serials = frozenset(scope_filter.serial_numbers)
        tests.append(lambda o: o.serial_number is not None and o.serial_number in serials)
    return tests


def mdns_instance(name: str, service_type: str) -> str:
    """The instance part of an mDNS service name (`Printer._ipp._tcp.local.` -> `Printer`)."""
    bare_type = normalise_service_type(service_type)[:-1]
    stripped = name.rstrip(".")
    lowered = stripped.lower()
    for suffix in (bare_type, bare_type.removesuffix(".local")):
        if lowered.endswith("." + suffix):
            return stripped[: -len(suffix) - 1]
    return stripped


def _both(first: _Test, second: _Test) -> _Test:
    return lambda o: first(o) and second(o)


def _either(first: _Test, second: _Test) -> _Test:
    return lambda o: first(o) or second(o)


def _all(tests: Sequence[_Test]) -> _Test:
    if not tests:
        return lambda o: True
    return functools.reduce(_both, tests)


def _any(tests: Sequence[_Test]) -> _Test:
    if not tests:
        return lambda o: False
    return functools.reduce(_either, tests)


def _transport_matcher(scope: DiscoveryScope, removal: bool) -> _Test:
    """Filters AND-ed, each exclusion key OR-ed and negated, for one transport and event kind."""
    exclusions = scope.exclusions or ScopeFilter()
    if scope.transport == "ble":
        keep, drop = _all(_ble_tests(scope.filters)), _any(_ble_tests(exclusions))
    elif scope.transport == "usb-serial":
        keep = _all(_usb_tests(scope.filters, removal=removal))
        drop = _any(_usb_exclusion_tests(exclusions))
    else:
        keep, drop = _all(_mdns_tests(scope.filters)), _any(_mdns_tests(exclusions))
    if scope.exclusions is None:
        return keep
    return lambda o: keep(o) and not drop(o)


@dataclass(frozen=True, slots=True)
class _Compiled:
    """The tests of one scope: for present observations, for removals, and with the type check."""

    present: _Test
    removed: _Test
    matcher: Matcher


# Keyed weakly: a compiled scope lives exactly as long as its scope (whose filters may hold addresses).
_COMPILED: weakref.WeakKeyDictionary[DiscoveryScope, _Compiled] = weakref.WeakKeyDictionary()


def _compile(scope: DiscoveryScope) -> _Compiled:
    present = _transport_matcher(scope, removal=False)
    if scope.transport == "ble":
        return _Compiled(present, present, lambda o: type(o) is BleObservation and present(o))
    removed = _transport_matcher(scope, removal=True)
    kind = UsbObservation if scope.transport == "usb-serial" else MdnsObservation

    def matcher(observation: Any) -> bool:
        if type(observation) is not kind:
            return False
        return removed(observation) if observation.event == "remove" else present(observation)

    return _Compiled(present, removed, matcher)


def _compiled(scope: DiscoveryScope) -> _Compiled:
    compiled = _COMPILED.get(scope)
    if compiled is None:
        compiled = _COMPILED[scope] = _compile(scope)
    return compiled


def scope_predicate(scope: DiscoveryScope, *, removal: bool = False) -> Callable[[Any], bool]:
    """The scope test for an observation already known to be of the scope's transport (hot paths)."""
    compiled = _compiled(scope)
    return compiled.removed if removal else compiled.present


def scope_matcher(scope: DiscoveryScope) -> Matcher:
    """A fast predicate equivalent to `matches_scope(scope, ...)`, built once per scope."""
    return _compiled(scope).matcher


def matches_scope(scope: DiscoveryScope, observation: Observation) -> bool:
    """True when an observation is in the admitted scope (providers and host use this same rule)."""
    return scope_matcher(scope)(observation)


# ---------------------------------------------------------------------------------------------------------
# Projections of a scope


def redacted_scope(scope: DiscoveryScope) -> dict[str, Any]:
    """The durable form of a scope (SPEC 7): no identity selectors, prefixes and exclusions by key only."""
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
