"""The scope model: the profile a catalog grants, the scope a scan was admitted with, and its vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from connector.contract.transports import Transport
from connector.core.transports import TRANSPORT_FACTS


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
    """The catalog's `discovery` profile of an action (CONTRACT §6.1)."""

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

ORDERED_FILTER_KEYS: tuple[str, ...] = tuple(
    key for facts in TRANSPORT_FACTS.values() for key in facts.filter_keys
)
ALL_FILTER_KEYS: frozenset[str] = frozenset(ORDERED_FILTER_KEYS)
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


def filter_keys(scope_filter: ScopeFilter) -> tuple[str, ...]:
    """The keys set in a filter, in vocabulary order."""
    return tuple(key for key in ORDERED_FILTER_KEYS if getattr(scope_filter, key) not in (None, ()))
