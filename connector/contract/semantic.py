"""Semantic rules of the wire documents (CONTRACT §1): what a JSON Schema cannot say, as pure functions over
JSON.

Where a schema can express a rule it does, marked with the same `x-rule` name; this module is the authority
either way, so the model path (which checks shapes only) finds exactly what the schema path finds.
A rule that meets a malformed part stays silent: shapes are the schema's or the model's to report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, get_args

from connector.contract.canonical import canonical_bytes
from connector.contract.models import Status as WireStatus
from connector.contract.models import TerminalStatus
from connector.contract.patterns import OPERATION_ID_PATTERN, TIME_PATTERN, ecma
from connector.contract.transports import CONTENT_KEYS
from connector.contract.violations import Violation, ordered, pointer

__all__ = [
    "SEMANTIC_RULES",
    "STATUS_SCHEMAS",
    "TERMINAL_STATUSES",
    "Violation",
    "document_violations",
    "sequence_violations",
]

Document = Mapping[str, Any]
Check = Callable[[Document], Iterator[Violation]]

STATUS_V1 = "deferred-operation-status.v1"
STATUS_V2 = "deferred-operation-status.v2"
STATUS_SCHEMAS = frozenset({STATUS_V1, STATUS_V2})
# The wire literals of `models`; a test holds the core's lifecycle table to them (contract sits below core).
TERMINAL_STATUSES: frozenset[str] = frozenset(get_args(TerminalStatus))
STATUSES: frozenset[str] = frozenset(get_args(WireStatus))
NON_TERMINAL_STATUSES = STATUSES - TERMINAL_STATUSES
_WITHOUT_ERROR = frozenset({"pending", "running", "completed", "cancelled"})
_PARTIAL_BY_REASON = {"window-complete": False, "limit-reached": True, "deadline-reached": True}
_CANCEL_REASON = "cancel/unavailable-reason"
# CONTRACT §1: `causal/context` is echoed on every status and stored, so its canonical JSON is bounded.
MAX_CAUSAL_CONTEXT_BYTES = 4096
_PROFILE_BY_CLASS = {"discovery": "discovery", "command": "command"}


def document_violations(name: str, doc: Any) -> list[Violation]:
    """Every semantic rule of schema `name` that `doc` breaks (none for a schema without such rules)."""
    if not isinstance(doc, Mapping):
        return []
    return ordered(v for check in _RULES.get(name, ()) for v in check(doc))


def sequence_violations(name: str, docs: Sequence[Any]) -> list[Violation]:
    """The rules of each poll (paths prefixed by its index) plus the cross-poll rules of one operation."""
    if name not in STATUS_SCHEMAS:
        raise ValueError("cross-poll rules exist for status schemas only")
    found = [v.under(pointer(i)) for i, doc in enumerate(docs) for v in document_violations(name, doc)]
    polls = [(i, doc) for i, doc in enumerate(docs) if isinstance(doc, Mapping)]
    found += _shared_operation_id(polls)
    found += _terminal_is_final(polls)
    found += _causal_context_unchanged(polls)
    if name == STATUS_V2:
        found += _revisions(polls)
    return ordered(found)


# --- reading parts of a document that may be malformed -------------------------------------------------


def _dict(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _list(value: object) -> list[Any] | None:
    return value if isinstance(value, list) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not ecma(TIME_PATTERN).search(value):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:  # a well-formed but impossible date such as February 30
        return None


def _sorted_json(value: object) -> str:
    # Equality of open JSON that RFC 8785 may refuse (a huge integer): sorted keys, exact numbers.
    return json.dumps(value, sort_keys=True, default=repr)  # never "", which stands for "absent"


def _canonical(value: object) -> bytes | None:
    try:
        return canonical_bytes(value)
    except (ValueError, TypeError):  # not encodable (huge integer, NaN): the shape layer reports it
        return None


# --- handles -------------------------------------------------------------------------------------------


def _one_cancel_surface(link: str) -> Check:
    def check(doc: Document) -> Iterator[Violation]:
        if (link in doc) == (_CANCEL_REASON in doc):
            yield Violation("", "one-cancel-surface")

    return check


def _operation_id_kind(doc: Document) -> Iterator[Violation]:
    op_id, kind = _str(doc.get("operation/id")), _str(doc.get("operation/kind"))
    if op_id is None or kind is None or not ecma(OPERATION_ID_PATTERN).search(op_id):
        return
    if op_id.split(":")[1] != kind:
        yield Violation(pointer("operation/id"), "operation-id-kind")


# --- statuses ------------------------------------------------------------------------------------------


def _status_fields(doc: Document) -> Iterator[Violation]:
    status = _str(doc.get("status"))
    if status in TERMINAL_STATUSES and "retry_after_seconds" in doc:
        yield Violation(pointer("retry_after_seconds"), "retry-after-only-non-terminal")
    if status in STATUSES and status != "completed" and "result" in doc:
        yield Violation(pointer("result"), "result-only-on-completed")
    if status in _WITHOUT_ERROR and "error" in doc:
        yield Violation(pointer("error"), "error-only-on-failure")


def _directive_result(doc: Document) -> Iterator[Violation]:
    status = _str(doc.get("status"))
    if status == "completed" and "result" not in doc:
        yield Violation(pointer("result"), "completed-carries-result")
    if status == "completed" and "error" in doc:
        yield Violation(pointer("error"), "error-only-on-failure")
    if status == "failed" and "result" in doc:
        yield Violation(pointer("result"), "result-only-on-completed")


def _v2_lifecycle(doc: Document) -> Iterator[Violation]:
    status = _str(doc.get("status"))
    if status == "completed":
        if "result" not in doc:
            yield Violation(pointer("result"), "completed-carries-result")
        yield from _confirmed(doc, "cleanup", "completed-cleanup-confirmed")
    if status == "cancelled":
        yield from _confirmed(doc, "cancellation", "cancelled-requires-confirmed")
        yield from _confirmed(doc, "cleanup", "cancelled-requires-confirmed")


def _confirmed(doc: Document, key: str, rule: str) -> Iterator[Violation]:
    if key not in doc:
        yield Violation(pointer(key), rule)
        return
    part = _dict(doc[key])
    if part is not None and "state" in part and part["state"] != "confirmed":
        yield Violation(pointer(key, "state"), rule)


def _v2_progress_gates(doc: Document) -> Iterator[Violation]:
    cancellation, result = _dict(doc.get("cancellation")), _dict(doc.get("result"))
    if cancellation is not None and cancellation.get("state") == "requested" and "progress" in doc:
        yield Violation(pointer("progress"), "no-progress-while-cancel-requested")
    if result is not None and "erased_at" in result and "progress" in doc:
        yield Violation(pointer("progress"), "erased-result-shape")


def _v2_cancellation_and_cleanup(doc: Document) -> Iterator[Violation]:
    cancellation, cleanup = _dict(doc.get("cancellation")), _dict(doc.get("cleanup"))
    if cancellation is not None and "confirmed_at" in cancellation and _unconfirmed(cancellation):
        yield Violation(pointer("cancellation", "confirmed_at"), "confirmed-at-only-when-confirmed")
    if cleanup is not None and cleanup.get("claim") == "released" and _unconfirmed(cleanup):
        yield Violation(pointer("cleanup", "state"), "claim-released-requires-confirmed-cleanup")


def _unconfirmed(part: Mapping[str, Any]) -> bool:
    return "state" in part and part["state"] != "confirmed"


def _v2_snapshot(doc: Document) -> Iterator[Violation]:
    progress = _dict(doc.get("progress")) or {}
    snapshot, bounds = _dict(progress.get("snapshot")), _dict(progress.get("bounds")) or {}
    candidates = _list(snapshot.get("candidates")) if snapshot is not None else None
    if snapshot is None or candidates is None:
        return
    at = pointer("progress", "snapshot")
    max_candidates, max_bytes = _int(bounds.get("max_candidates")), _int(bounds.get("max_snapshot_bytes"))
    if max_candidates is not None and len(candidates) > max_candidates:
        yield Violation(at + pointer("candidates"), "snapshot-max-candidates")
    size = len(_canonical(snapshot) or b"")
    if max_bytes is not None and size > max_bytes:
        yield Violation(at, "snapshot-max-bytes")
    yield from _same_generation(candidates, progress.get("generation"), at + pointer("candidates"))
    yield from _candidate_list(candidates, at + pointer("candidates"))


def _same_generation(candidates: list[Any], generation: object, at: str) -> Iterator[Violation]:
    if not isinstance(generation, str):
        return
    for i, candidate in enumerate(candidates):
        found = (_dict(candidate) or {}).get("generation", generation)
        if found != generation:
            yield Violation(at + pointer(i, "generation"), "snapshot-generation")


def _v2_final_result(doc: Document) -> Iterator[Violation]:
    result = _dict(doc.get("result"))
    if _str(doc.get("status")) != "completed" or result is None or "erased_at" in result:
        return
    final, candidates = _int(result.get("final_revision")), _list(result.get("candidates"))
    if "progress" not in doc:  # no revision was ever cut
        if final is not None and final != 0:
            yield Violation(pointer("result", "final_revision"), "final-revision-equality")
        if candidates:
            yield Violation(pointer("result", "candidates"), "final-snapshot-equality")
        return
    progress = _dict(doc["progress"]) or {}
    revision, snapshot = _int(progress.get("revision")), _dict(progress.get("snapshot")) or {}
    if final is not None and revision is not None and final != revision:
        yield Violation(pointer("result", "final_revision"), "final-revision-equality")
    expected = _list(snapshot.get("candidates"))
    if candidates is not None and expected is not None and not _same_candidates(candidates, expected):
        yield Violation(pointer("result", "candidates"), "final-snapshot-equality")


def _same_candidates(found: list[Any], expected: list[Any]) -> bool:
    """Same refs, same content; the order of the list is not content."""
    left, right = [_canonical(c) for c in found], [_canonical(c) for c in expected]
    if None in left or None in right:
        return True
    return sorted(b for b in left if b is not None) == sorted(b for b in right if b is not None)


def _v2_nested_result(doc: Document) -> Iterator[Violation]:
    result = _dict(doc.get("result"))
    if result is not None:
        yield from (v.under(pointer("result")) for v in _result_document(result))


# --- discovery results, candidates, bindings -----------------------------------------------------------


def _result_document(doc: Document) -> Iterator[Violation]:
    expected = _PARTIAL_BY_REASON.get(_str(doc.get("reason")) or "")
    if expected is not None and "partial" in doc and doc["partial"] is not expected:
        yield Violation(pointer("partial"), "partial-matches-reason")
    candidates = _list(doc.get("candidates"))
    if "erased_at" in doc and candidates:
        yield Violation(pointer("candidates"), "erased-result-shape")
    if candidates is not None:
        yield from _candidate_list(candidates, pointer("candidates"))


def _candidate_list(candidates: list[Any], at: str) -> Iterator[Violation]:
    seen: set[str] = set()
    for i, item in enumerate(candidates):
        candidate = _dict(item)
        if candidate is None:
            continue
        yield from (v.under(at + pointer(i)) for check in _CANDIDATE_RULES for v in check(candidate))
        ref = _str(candidate.get("candidate/ref"))
        if ref is not None and ref in seen:
            yield Violation(at + pointer(i, "candidate/ref"), "unique-candidate-refs")
        seen.add(ref or "")


def _detail_matches_transport(doc: Document) -> Iterator[Violation]:
    transport = doc.get("transport")
    own = next((key for name, key in CONTENT_KEYS.items() if name == transport), None)
    if own is None:
        return
    for key in CONTENT_KEYS.values():
        if key != own and key in doc:
            yield Violation(pointer(key), "detail-matches-transport")


def _candidate_times(doc: Document) -> Iterator[Violation]:
    first, last = _time(doc.get("first_seen_at")), _time(doc.get("last_seen_at"))
    expires = _time(doc.get("expires_at"))
    if first is not None and last is not None and last < first:
        yield Violation(pointer("last_seen_at"), "candidate-times-ordered")
    if last is not None and expires is not None and expires < last:
        yield Violation(pointer("expires_at"), "candidate-times-ordered")


_CANDIDATE_RULES: tuple[Check, ...] = (_detail_matches_transport, _candidate_times)


# --- directives ----------------------------------------------------------------------------------------


def _causal_context_size(doc: Document) -> Iterator[Violation]:
    context = _dict(doc.get("causal/context"))
    encoded = None if context is None else _canonical(context)
    if encoded is not None and len(encoded) > MAX_CAUSAL_CONTEXT_BYTES:
        yield Violation(pointer("causal/context"), "causal-context-size")


# --- receipts and the action catalog -------------------------------------------------------------------


def _receipt(doc: Document) -> Iterator[Violation]:
    context = _dict(doc.get("causal/context"))
    causal_id = context.get("operation/id") if context is not None else None
    if causal_id is not None and "operation/id" in doc and causal_id != doc["operation/id"]:
        yield Violation(pointer("operation/id"), "receipt-causal-operation-id")


def _unique_action_ids(doc: Document) -> Iterator[Violation]:
    seen: set[str] = set()
    for i, action in enumerate(_list(doc.get("actions")) or []):
        action_id = _str((_dict(action) or {}).get("action_id"))
        if action_id is not None and action_id in seen:
            yield Violation(pointer("actions", i, "action_id"), "unique-action-ids")
        seen.add(action_id or "")


def _profile_matches_class(doc: Document) -> Iterator[Violation]:
    for i, item in enumerate(_list(doc.get("actions")) or []):
        action = _dict(item) or {}
        own = _PROFILE_BY_CLASS.get(_str(action.get("class")) or "")
        if own is None:
            continue
        other = "command" if own == "discovery" else "discovery"
        if own not in action:
            yield Violation(pointer("actions", i, own), "profile-matches-class")
        if other in action:
            yield Violation(pointer("actions", i), "profile-matches-class")


def _expires_after_issued(doc: Document) -> Iterator[Violation]:
    issued, expires = _time(doc.get("issued_at")), _time(doc.get("expires_at"))
    if issued is not None and expires is not None and expires <= issued:
        yield Violation(pointer("expires_at"), "expires-after-issued")


# --- across the polls of one operation -----------------------------------------------------------------

Polls = Iterable[tuple[int, Document]]


def _shared_operation_id(polls: Polls) -> list[Violation]:
    ids = [(i, doc["operation/id"]) for i, doc in polls if isinstance(doc.get("operation/id"), str)]
    return [Violation(pointer(i, "operation/id"), "shared-operation-id") for i, op in ids if op != ids[0][1]]


def _causal_context_unchanged(polls: Polls) -> list[Violation]:
    """`causal/context` is echoed unchanged on every status: all polls carry the same one, or none does."""
    at = "causal/context"
    seen = [(i, _sorted_json(doc[at]) if at in doc else "") for i, doc in polls]
    return [Violation(pointer(i, at), "causal-context-unchanged") for i, found in seen if found != seen[0][1]]


def _terminal_is_final(polls: Polls) -> list[Violation]:
    found: list[Violation] = []
    terminal: str | None = None
    for i, doc in polls:
        status = _str(doc.get("status"))
        if terminal is not None and status != terminal:
            found.append(Violation(pointer(i, "status"), "terminal-is-final"))
        elif terminal is None and status in TERMINAL_STATUSES:
            terminal = status
    return found


def _revisions(polls: Polls) -> list[Violation]:
    found: list[Violation] = []
    previous: tuple[int, bytes | None] | None = None
    first_seen: dict[int, bytes] = {}
    for i, doc in polls:
        progress = _dict(doc.get("progress")) or {}
        revision = _int(progress.get("revision"))
        if revision is None:
            continue
        snapshot = _canonical(progress["snapshot"]) if isinstance(progress.get("snapshot"), Mapping) else None
        if previous is not None:
            found += _against_previous(i, revision, snapshot, previous)
        earlier = first_seen.setdefault(revision, snapshot) if snapshot is not None else None
        if earlier is not None and earlier != snapshot:
            found.append(Violation(pointer(i, "progress", "snapshot"), "same-revision-same-snapshot"))
        previous = (revision, snapshot)
    return found


def _against_previous(
    i: int, revision: int, snapshot: bytes | None, previous: tuple[int, bytes | None]
) -> Iterator[Violation]:
    last_revision, last_snapshot = previous
    if revision < last_revision:
        yield Violation(pointer(i, "progress", "revision"), "revision-monotonic")
    changed = snapshot is not None and last_snapshot is not None and snapshot != last_snapshot
    if changed and revision <= last_revision:
        yield Violation(pointer(i, "progress", "revision"), "changed-snapshot-higher-revision")


_RULES: Mapping[str, tuple[Check, ...]] = {
    "sensorium-directive.v1": (_causal_context_size,),
    "sensorium-directive-result.v1": (_directive_result,),
    "sensorium-connector-deferred.v1": (_one_cancel_surface("cancel_path"),),
    "deferred-operation.v1": (_one_cancel_surface("cancel_href"), _operation_id_kind),
    STATUS_V1: (_status_fields, _operation_id_kind),
    STATUS_V2: (
        _status_fields,
        _operation_id_kind,
        _v2_lifecycle,
        _v2_progress_gates,
        _v2_cancellation_and_cleanup,
        _v2_snapshot,
        _v2_final_result,
        _v2_nested_result,
    ),
    "sensorium-device-discovery-candidate.v1": _CANDIDATE_RULES,
    "sensorium-device-discovery-result.v1": (_result_document,),
    "sensorium-device-binding.v1": (_detail_matches_transport,),
    "execution-receipt.v1": (_receipt,),
    "sensorium-action-catalog.v1": (_unique_action_ids, _profile_matches_class, _expires_after_issued),
}

# Every rule name this module can report; the model path maps a model's own rule errors onto these names.
SEMANTIC_RULES = frozenset(
    {
        "one-cancel-surface",
        "operation-id-kind",
        "retry-after-only-non-terminal",
        "result-only-on-completed",
        "error-only-on-failure",
        "completed-carries-result",
        "completed-cleanup-confirmed",
        "cancelled-requires-confirmed",
        "no-progress-while-cancel-requested",
        "erased-result-shape",
        "confirmed-at-only-when-confirmed",
        "claim-released-requires-confirmed-cleanup",
        "snapshot-max-candidates",
        "snapshot-max-bytes",
        "snapshot-generation",
        "final-revision-equality",
        "final-snapshot-equality",
        "partial-matches-reason",
        "unique-candidate-refs",
        "detail-matches-transport",
        "candidate-times-ordered",
        "receipt-causal-operation-id",
        "causal-context-size",
        "unique-action-ids",
        "profile-matches-class",
        "expires-after-issued",
        "shared-operation-id",
        "terminal-is-final",
        "causal-context-unchanged",
        "revision-monotonic",
        "same-revision-same-snapshot",
        "changed-snapshot-higher-revision",
    }
)
