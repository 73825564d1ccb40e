"""The candidate table of one discovery session and the revisions cut from it (CONTRACT §6.2, 6.4, 6.5).

Rules of this file:
- the scope is re-checked first; an out-of-scope observation is neither stored nor counted;
- one candidate per device key, with a random ref that stays stable for that device within the session;
- a new device that would exceed `max_candidates` or the snapshot byte bound is refused (the first ones are
  kept), sets `limit_reason`, and from then on no new device is accepted; a content change of a known device
  that would break the byte bound is not applied and sets `limit_reason` too;
- the byte bound reserves four characters for every RSSI (`-128`), so RSSI changes can never break it;
  revisions report their exact canonical size;
- a candidate expires at the `expires_at` it shows: `last_seen_at` (whole seconds) + its TTL (for mDNS the
  record TTL when shorter; a TTL of 0 removes the instance);
- a revision is cut only when the candidate documents changed, at most once per `min_revision_interval_ms`
  (unless `final`), never more than `max_revisions` times; reaching that number sets `limit_reason`;
- `ingest` is the hot path: it compares cheap fields and keeps byte sizes up to date incrementally;
  documents are built by `cut`, and only for candidates whose shown fields changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from connector.core.candidates import (
    CANDIDATE_SCHEMA,
    candidate_content,
    candidate_size,
    format_second,
    merged_size,
)
from connector.core.observations import BleObservation, MdnsObservation, Observation, UsbObservation
from connector.core.scope import (
    EMPTY_SNAPSHOT_BYTES,
    RSSI_RANGE,
    DiscoveryProfile,
    DiscoveryScope,
    scope_matcher,
    scope_predicate,
)
from connector.core.transports import TRANSPORT_FACTS

LIMIT_REACHED: Final = "limit-reached"
RSSI_RESERVED_CHARS: Final = 4


class IngestOutcome(StrEnum):
    """What one observation did to the table."""

    ACCEPTED = "accepted"
    UNCHANGED = "unchanged"
    OUT_OF_SCOPE = "out-of-scope"
    LIMIT_REACHED = "limit-reached"


_ACCEPTED: Final = IngestOutcome.ACCEPTED
_UNCHANGED: Final = IngestOutcome.UNCHANGED
_OUT_OF_SCOPE: Final = IngestOutcome.OUT_OF_SCOPE
# Characters each RSSI leaves unused of its four reserved ones, indexed by RSSI + 128.
_RSSI_SLACK: Final = tuple(RSSI_RESERVED_CHARS - len(str(rssi)) for rssi in range(-128, 128))


@dataclass(frozen=True, slots=True)
class Revision:
    """One immutable snapshot of the table; candidate documents are shared, treat them as read-only."""

    revision: int
    generation: str
    candidates: tuple[dict[str, Any], ...]
    snapshot_bytes: int
    cut_at_ms: int

    def snapshot(self) -> dict[str, Any]:
        """The `snapshot` object of progress: `{"candidates": [...]}`."""
        return {"candidates": list(self.candidates)}


class _Entry:
    """One device: what its document shows, and the document the last cut built from that."""

    __slots__ = (
        "cut_doc",
        "expires_ms",
        "first_s",
        "key",
        "observation",
        "ref",
        "rssi",
        "seen_s",
        "sig",
        "size",
        "static",
        "ttl_ms",
    )

    def __init__(self, key: str, ref: str, observation: Observation, now_ms: int, ttl_ms: int) -> None:
        self.key = key
        self.ref = ref
        self.observation = observation
        self.first_s = self.seen_s = now_ms // 1000
        self.ttl_ms = ttl_ms
        self.expires_ms = self.seen_s * 1000 + ttl_ms
        self.rssi: int | None = None
        # Document fields only a content change alters (ref, generation, first sight, content), with
        # placeholders for the rest, so that a cut builds a document with one copy and three stores.
        self.static: dict[str, Any] = {}
        # Canonical bytes of the document, RSSI counted as four characters.
        self.size = 0
        self.sig: tuple[Any, ...] = ()
        # The document the last cut built; None once anything it shows changed.
        self.cut_doc: dict[str, Any] | None = None

    def saved(self) -> tuple[Any, ...]:
        """The content fields, to undo a change that broke the byte bound."""
        return (self.observation, self.static, self.size, self.rssi, self.sig, self.cut_doc)

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Undo to `saved()`."""
        self.observation, self.static, self.size, self.rssi, self.sig, self.cut_doc = saved


def _signature(observation: Any) -> tuple[Any, ...]:
    """The fields a candidate's content depends on, besides RSSI and time."""
    if type(observation) is BleObservation:
        return (
            observation.name,
            observation.service_uuids,
            observation.tx_power,
            observation.connectable,
            frozenset(observation.manufacturer_data),
        )
    if type(observation) is UsbObservation:
        return (
            observation.vid,
            observation.pid,
            observation.manufacturer,
            observation.product,
            observation.interface,
            observation.location,
        )
    return (observation.service_type, observation.name)


def _identity(observation: Observation) -> tuple[Any, ...]:
    """What tells two devices under one key apart: a serial port path is reused by the next device plugged."""
    if type(observation) is UsbObservation:
        return (observation.vid, observation.pid, observation.serial_number)
    return ()


def _clamped_rssi(rssi: int) -> int:
    return max(RSSI_RANGE[0], min(RSSI_RANGE[1], rssi))


def _never(observation: Any) -> bool:
    return False


class CandidateTable:
    """Deduplicated, bounded candidates of one session, cut into revisions (pure; `now_ms` passed in)."""

    __slots__ = (
        "_ble_kind",
        "_by_ref",
        "_bytes",
        "_departed",
        "_departed_cap",
        "_dirty_since_ms",
        "_entries",
        "_envelope_bytes",
        "_erased",
        "_generation",
        "_interval_ms",
        "_latest",
        "_limit_reason",
        "_match",
        "_max_bytes",
        "_max_candidates",
        "_max_revisions",
        "_new_ref",
        "_next_expiry_ms",
        "_order",
        "_present",
        "_revisions_exhausted",
        "_transport",
        "_ttl_ms",
    )

    def __init__(
        self,
        scope: DiscoveryScope,
        profile: DiscoveryProfile,
        *,
        generation: str,
        new_ref: Callable[[], str],
    ) -> None:
        self._generation = generation
        self._new_ref = new_ref
        self._transport = scope.transport
        self._match: Callable[[Any], bool] = scope_matcher(scope)
        self._present: Callable[[Any], bool] = scope_predicate(scope)
        observed = TRANSPORT_FACTS[scope.transport].observation
        self._ble_kind: type | None = BleObservation if observed is BleObservation else None
        self._ttl_ms = profile.candidate_ttl_seconds * 1000
        self._interval_ms = profile.min_revision_interval_ms
        self._max_revisions = profile.max_revisions
        self._max_candidates = scope.max_candidates
        self._max_bytes = scope.max_snapshot_bytes
        self._entries: dict[str, _Entry] = {}
        self._by_ref: dict[str, _Entry] = {}
        # Refs of devices that left, so that a device coming back keeps its ref; bounded, oldest first out.
        self._departed: dict[str, tuple[str, tuple[Any, ...]]] = {}
        self._departed_cap = max(64, scope.max_candidates)
        # Snapshot bytes with every RSSI counted as four characters (an upper bound of the exact size).
        self._bytes = EMPTY_SNAPSHOT_BYTES
        self._envelope_bytes = self._envelope_size()
        self._order: list[_Entry] | None = []
        self._dirty_since_ms: int | None = None
        self._next_expiry_ms: int | None = None
        self._latest: Revision | None = None
        self._limit_reason: str | None = None
        self._revisions_exhausted = False
        self._erased = False

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def limit_reason(self) -> str | None:
        """`limit-reached` once a bound was hit, else None."""
        return self._limit_reason

    @property
    def latest(self) -> Revision | None:
        """The last revision cut, if any."""
        return self._latest

    @property
    def generation(self) -> str:
        """This table's candidate generation."""
        return self._generation

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot_bytes(self) -> int:
        """Exact canonical byte length the snapshot would have if cut now."""
        slack = sum(_RSSI_SLACK[e.rssi + 128] for e in self._entries.values() if e.rssi is not None)
        return self._bytes - slack

    def binding_target(self, ref: str) -> tuple[str, str] | None:
        """(transport, address) of a current candidate, for bind; the only way out for an address."""
        entry = self._by_ref.get(ref)
        if entry is None:
            return None
        return self._transport, transport_address(entry.observation)

    def candidate_expires_at_ms(self, ref: str) -> int | None:
        """When a current candidate expires (its shown `expires_at`), in epoch milliseconds."""
        entry = self._by_ref.get(ref)
        return None if entry is None else entry.expires_ms

    def candidate_document(self, ref: str) -> dict[str, Any] | None:
        """The current candidate document of a ref (for a binding's details)."""
        entry = self._by_ref.get(ref)
        return None if entry is None else self._document(entry)

    def next_cut_at_ms(self) -> int | None:
        """Earliest time a cut could produce something: a pending change or the next expiry."""
        if self._erased or self._revisions_exhausted:
            return None
        due: int | None = None
        if self._dirty_since_ms is not None:
            due = self._dirty_since_ms
            if self._latest is not None:
                due = max(due, self._latest.cut_at_ms + self._interval_ms)
        if self._next_expiry_ms is not None and (due is None or self._next_expiry_ms < due):
            due = self._next_expiry_ms
        return due

    # -- ingest (hot path) ---------------------------------------------------------------------------------

    def ingest(self, observation: Observation, now_ms: int) -> IngestOutcome:
        """Revalidate, dedupe and apply one observation."""
        if type(observation) is not self._ble_kind:
            return self._ingest_event(observation, now_ms)
        # Inlined BLE path: it runs for every advert, and most adverts change nothing or only the RSSI.
        obs: Any = observation
        if not self._present(obs):
            return _OUT_OF_SCOPE
        entry = self._entries.get(obs.address)
        if entry is None or now_ms >= entry.expires_ms:
            return self._admit(obs.address, obs, now_ms, entry)
        signature = (obs.name, obs.service_uuids, obs.tx_power, obs.connectable, obs.manufacturer_data.keys())
        if signature != entry.sig:
            return self._update_content(entry, obs, now_ms)
        changed = False
        second = now_ms // 1000
        if second > entry.seen_s:
            entry.seen_s = second
            entry.expires_ms = second * 1000 + entry.ttl_ms
            changed = True
        rssi = obs.rssi
        if rssi != entry.rssi:
            entry.rssi = rssi if -128 <= rssi <= 127 else _clamped_rssi(rssi)
            changed = True
        if not changed:
            return _UNCHANGED
        entry.cut_doc = None
        if self._dirty_since_ms is None:
            self._dirty_since_ms = now_ms
        return _ACCEPTED

    def _ingest_event(self, observation: Observation, now_ms: int) -> IngestOutcome:
        """USB port and mDNS instance events (rare next to adverts)."""
        if not self._match(observation):
            return _OUT_OF_SCOPE
        obs: Any = observation
        key = obs.device_key
        entry = self._entries.get(key)
        # A TTL of 0 is mDNS's goodbye: the instance is gone, as with a removal.
        if obs.event == "remove" or (type(obs) is MdnsObservation and obs.ttl == 0):
            if entry is None:
                return _OUT_OF_SCOPE
            self._remove(entry, now_ms)
            return _ACCEPTED
        if entry is None or now_ms >= entry.expires_ms:
            return self._admit(key, obs, now_ms, entry)
        if _signature(obs) != entry.sig:
            return self._update_content(entry, obs, now_ms)
        entry.observation = obs
        if not self._touch(entry, now_ms, self._entry_ttl(obs)):
            return _UNCHANGED
        entry.cut_doc = None
        self._mark_dirty(now_ms)
        return _ACCEPTED

    def _touch(self, entry: _Entry, now_ms: int, ttl_ms: int) -> bool:
        """Move last-seen forward (and apply a TTL); True when the shown times changed."""
        shown = (entry.seen_s, entry.expires_ms)
        entry.ttl_ms = ttl_ms
        entry.seen_s = max(entry.seen_s, now_ms // 1000)
        entry.expires_ms = entry.seen_s * 1000 + ttl_ms
        return shown != (entry.seen_s, entry.expires_ms)

    def _mark_dirty(self, now_ms: int) -> None:
        if self._dirty_since_ms is None:
            self._dirty_since_ms = now_ms

    def _hit_limit(self) -> IngestOutcome:
        self._limit_reason = LIMIT_REACHED
        return IngestOutcome.LIMIT_REACHED

    # -- new devices, content changes, removals ------------------------------------------------------------

    def _entry_ttl(self, obs: Observation) -> int:
        if type(obs) is MdnsObservation and obs.ttl is not None:
            return max(0, min(self._ttl_ms, obs.ttl * 1000))
        return self._ttl_ms

    def _admit(self, key: str, obs: Observation, now_ms: int, stale: _Entry | None) -> IngestOutcome:
        """A device not (or no longer) in the table."""
        if stale is not None:
            self._remove(stale, now_ms)
        if self._limit_reason is not None:
            return IngestOutcome.LIMIT_REACHED
        if len(self._entries) >= self._max_candidates:
            self._expire(now_ms)
            if len(self._entries) >= self._max_candidates:
                return self._hit_limit()
        ref = self._returning_ref(key, obs) or self._new_ref()
        entry = _Entry(key, ref, obs, now_ms, self._entry_ttl(obs))
        self._apply_content(entry, obs)
        added = entry.size + (1 if self._entries else 0)
        if self._bytes + added > self._max_bytes:
            return self._hit_limit()
        self._departed.pop(key, None)
        self._entries[key] = entry
        self._by_ref[ref] = entry
        self._bytes += added
        self._order = None
        if self._next_expiry_ms is None or entry.expires_ms < self._next_expiry_ms:
            self._next_expiry_ms = entry.expires_ms
        self._mark_dirty(now_ms)
        return _ACCEPTED

    def _returning_ref(self, key: str, obs: Observation) -> str | None:
        """The ref a departed device had, if this is the same device again."""
        departed = self._departed.get(key)
        if departed is None or departed[1] != _identity(obs):
            return None
        return departed[0]

    def _update_content(self, entry: _Entry, obs: Observation, now_ms: int) -> IngestOutcome:
        """A known device whose candidate-relevant fields changed."""
        self._touch(entry, now_ms, self._entry_ttl(obs))
        entry.cut_doc = None
        self._mark_dirty(now_ms)
        saved = entry.saved()
        previous_size = entry.size
        self._apply_content(entry, obs)
        grow = entry.size - previous_size
        if grow > 0 and self._bytes + grow > self._max_bytes:
            entry.restore(saved)
            return self._hit_limit()
        self._bytes += grow
        return _ACCEPTED

    def _apply_content(self, entry: _Entry, obs: Observation) -> None:
        """Recompute content and size from an observation (the only place that builds content)."""
        entry.observation = obs
        entry.sig = _signature(obs)
        content = candidate_content(obs, include_signal=False)
        entry.static = {
            "schema": CANDIDATE_SCHEMA,
            "candidate/ref": entry.ref,
            "transport": self._transport,
            "generation": self._generation,
            "first_seen_at": format_second(entry.first_s),
            "last_seen_at": "",
            "expires_at": "",
            **content,
        }
        if type(obs) is BleObservation:
            entry.static["signal"] = None
        entry.cut_doc = None
        # Size without building the document: the envelope's bytes (constant but for the ref) merged with
        # the content's, the RSSI counted as its four reserved characters.
        envelope = self._envelope_bytes + candidate_size(entry.ref)
        if type(obs) is BleObservation:
            entry.rssi = _clamped_rssi(obs.rssi)
            entry.size = merged_size(envelope, {**content, "signal": {"rssi_dbm": -128}})
        else:
            entry.size = merged_size(envelope, content)

    def _remove(self, entry: _Entry, now_ms: int) -> None:
        del self._entries[entry.key]
        del self._by_ref[entry.ref]
        self._bytes -= entry.size + (1 if self._entries else 0)
        self._order = None
        if len(self._departed) >= self._departed_cap:
            del self._departed[next(iter(self._departed))]
        self._departed[entry.key] = (entry.ref, _identity(entry.observation))
        self._mark_dirty(now_ms)

    # -- cutting revisions ---------------------------------------------------------------------------------

    def _expire(self, now_ms: int) -> None:
        """Drop every candidate whose `expires_at` has passed; recompute the next expiry."""
        if self._next_expiry_ms is None or now_ms < self._next_expiry_ms:
            return
        for entry in [e for e in self._entries.values() if now_ms >= e.expires_ms]:
            self._remove(entry, now_ms)
        self._next_expiry_ms = min((e.expires_ms for e in self._entries.values()), default=None)

    def _envelope_size(self) -> int:
        """Bytes of a candidate with no content and an empty ref (times are always 20 characters)."""
        time_text = format_second(0)
        envelope = {
            "schema": CANDIDATE_SCHEMA,
            "candidate/ref": "",
            "transport": self._transport,
            "generation": self._generation,
            "first_seen_at": time_text,
            "last_seen_at": time_text,
            "expires_at": time_text,
        }
        return candidate_size(envelope) - len('""')

    def _document(self, entry: _Entry, texts: dict[int, str] | None = None) -> dict[str, Any]:
        """The candidate document; `texts` memoises second -> RFC 3339 text across one cut."""
        texts = {} if texts is None else texts
        doc = entry.static.copy()
        seen, expires = entry.seen_s, entry.expires_ms // 1000
        doc["last_seen_at"] = texts.get(seen) or texts.setdefault(seen, format_second(seen))
        doc["expires_at"] = texts.get(expires) or texts.setdefault(expires, format_second(expires))
        if entry.rssi is not None:
            doc["signal"] = {"rssi_dbm": entry.rssi}
        return doc

    def _ordered(self) -> list[_Entry]:
        if self._order is None:
            self._order = sorted(self._entries.values(), key=lambda e: (e.first_s, e.ref))
        return self._order

    def _current_documents(self) -> tuple[tuple[dict[str, Any], ...], int]:
        """Documents in snapshot order (rebuilt only when what they show changed) and their exact bytes."""
        docs = []
        slack = 0
        texts: dict[int, str] = {}
        for entry in self._ordered():
            doc = entry.cut_doc
            if doc is None:
                doc = entry.cut_doc = self._document(entry, texts)
            if entry.rssi is not None:
                slack += _RSSI_SLACK[entry.rssi + 128]
            docs.append(doc)
        return tuple(docs), self._bytes - slack

    def cut(self, now_ms: int, *, final: bool = False) -> Revision | None:
        """Cut a revision if the content changed and the interval allows (`final` skips the interval)."""
        if self._erased:
            return None
        self._expire(now_ms)
        if self._dirty_since_ms is None or self._revisions_exhausted:
            return None
        latest = self._latest
        if latest is not None and not final and now_ms - latest.cut_at_ms < self._interval_ms:
            return None
        candidates, exact_bytes = self._current_documents()
        self._dirty_since_ms = None
        if candidates == (latest.candidates if latest is not None else ()):
            return None
        number = 1 if latest is None else latest.revision + 1
        revision = Revision(number, self._generation, candidates, exact_bytes, now_ms)
        self._latest = revision
        if number >= self._max_revisions:
            self._revisions_exhausted = True
            self._limit_reason = LIMIT_REACHED
        return revision

    def erase(self) -> None:
        """Forget everything (retention end, revocation, provider restart); the table accepts nothing more."""
        self._erased = True
        self._match = self._present = _never
        self._entries.clear()
        self._by_ref.clear()
        self._departed.clear()
        self._order = []
        self._bytes = EMPTY_SNAPSHOT_BYTES
        self._latest = None
        self._dirty_since_ms = None
        self._next_expiry_ms = None


def transport_address(observation: Observation) -> str:
    """The address a binding reveals: BLE address, serial by-id link (else node), or mDNS `ip:port`."""
    if isinstance(observation, BleObservation):
        return observation.address
    if isinstance(observation, UsbObservation):
        return observation.stable_path or observation.device
    host = observation.addresses[0] if observation.addresses else observation.server or observation.name
    if observation.port is None:
        return host
    return f"[{host}]:{observation.port}" if ":" in host else f"{host}:{observation.port}"
