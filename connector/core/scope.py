"""Discovery scope: the admitted transport, window, limits and filters of one scan (SPEC 6.1, 6.3).

Types only here; parsing, clamping and matching live beside them (pure, shared by provider and host).
"""

from __future__ import annotations

from dataclasses import dataclass

from connector.core.observations import Transport


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


@dataclass(frozen=True, slots=True)
class DiscoveryScope:
    """An admitted scan scope, already clamped to its profile."""

    transport: Transport
    window_seconds: int
    max_candidates: int
    max_snapshot_bytes: int
    filters: ScopeFilter
    exclusions: ScopeFilter | None = None
    adapter: str | None = None
