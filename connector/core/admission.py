"""Pure admission steps of SPEC 2: 3 (action), 4 (execution mode), 7 (status v2), 8 (fingerprint).

Each refusal is an `AdmissionError` with its SPEC 14 code; messages are generic and never echo the
directive (not even the action id).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from connector.contract.canonical import canonical_bytes
from connector.errors import AdmissionError

T = TypeVar("T")

SYNC_ONLY: Final = "sync-only"
ASYNC_ONLY: Final = "async-only"
EITHER: Final = "either"
EXECUTION_MODE_SUPPORT: Final = frozenset({SYNC_ONLY, ASYNC_ONLY, EITHER})
DEFAULT_EXECUTION_MODE_SUPPORT: Final = SYNC_ONLY
DEFAULT_STATUS_VERSIONS: Final = (1,)

# SPEC 2 step 8: the directive parts an idempotent replay must repeat; the rest may differ.
FINGERPRINT_FIELDS: Final = ("action_id", "timing", "input")

_MODES_ALLOWED: Final[Mapping[str, frozenset[str]]] = {
    SYNC_ONLY: frozenset({"sync"}),
    ASYNC_ONLY: frozenset({"async"}),
    EITHER: frozenset({"sync", "async"}),
}


def find_action(actions_by_id: Mapping[str, T], action_id: str) -> T:
    """The catalog entry for `action_id` (step 3); 404 `unknown-action` when the catalog lacks it."""
    if action_id not in actions_by_id:
        raise AdmissionError("action is not in the verified catalog", code="unknown-action")
    return actions_by_id[action_id]


def check_execution_mode(execution_mode_support: str | None, requested_mode: str) -> None:
    """Refuse a mode the action does not support (step 4); None means `sync-only`."""
    support = DEFAULT_EXECUTION_MODE_SUPPORT if execution_mode_support is None else execution_mode_support
    if support not in _MODES_ALLOWED:
        # A verified catalog never holds this: it is a bug on our side (500), not the caller's refusal.
        raise ValueError("catalog execution_mode_support is not a known value")
    if requested_mode not in ("sync", "async"):
        raise AdmissionError(
            "timing.mode is not a known mode",
            code="invalid-directive",
            diagnostics=[{"code": "enum", "message": "/timing/mode"}],
        )
    if requested_mode not in _MODES_ALLOWED[support]:
        raise AdmissionError(
            "the action does not support the requested execution mode", code="execution-mode-not-supported"
        )


def require_status_v2(status_versions: Sequence[int] | None) -> None:
    """Refuse a discovery directive that cannot read v2 statuses (step 7); absent means `[1]`."""
    versions = DEFAULT_STATUS_VERSIONS if status_versions is None else status_versions
    if not any(v == 2 and not isinstance(v, bool) for v in versions):
        raise AdmissionError(
            "discovery needs 2 in timing.status_versions",
            code="status-v2-required",
            diagnostics=[{"code": "status-v2-required", "message": "/timing/status_versions"}],
        )


def directive_fingerprint(directive: Mapping[str, Any]) -> bytes:
    """SHA-256 over the canonical bytes of the directive's `action_id`, `timing` and `input`."""
    # Absent and null stay distinct: only present keys enter the fingerprint.
    covered = {name: directive[name] for name in FINGERPRINT_FIELDS if name in directive}
    try:
        return hashlib.sha256(canonical_bytes(covered)).digest()
    except ValueError:
        # RFC 8785 refuses integers beyond 2**53, NaN and non-string keys; its message echoes the value.
        raise _not_canonical(covered) from None


def _not_canonical(covered: Mapping[str, Any]) -> AdmissionError:
    paths = [f"/{name}" for name, value in covered.items() if not _canonicalizes(value)]
    return AdmissionError(
        "the directive holds a value outside the interoperable JSON range",
        code="invalid-directive",
        diagnostics=[{"code": "not-canonicalizable", "message": path} for path in paths],
    )


def _canonicalizes(value: Any) -> bool:
    try:
        canonical_bytes(value)
    except ValueError:
        return False
    return True


def check_idempotent_replay(stored_fingerprint: bytes, new_fingerprint: bytes) -> None:
    """Refuse a reused idempotency key whose directive differs (409 `idempotency-conflict`)."""
    if not hmac.compare_digest(stored_fingerprint, new_fingerprint):
        raise AdmissionError(
            "the idempotency key was used with a different directive", code="idempotency-conflict"
        )
