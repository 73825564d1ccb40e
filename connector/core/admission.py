"""Admission (CONTRACT §2) as one pure plan: steps 2 to 8 in order, from a directive to what it starts.

Rules of this file:
- `plan_admission` runs the steps in CONTRACT order and refuses at the first failure with an `AdmissionError`
  (or the `SensoriumError` of the grant check) carrying its CONTRACT §14 code; step 1 (authentication) comes
  before it, step 9 (concurrency, claim) after it, both at the edges that hold the state;
- `directive["timing"]` is read here only; the plan's `now` is the one instant every derived time counts
  from (window end, deadline cut, timeout, expiry, `fail_after_seconds`);
- a keyed directive's operation id comes from (principal, action, key) only (`core.ids`); an unkeyed one
  from fresh entropy, drawn only then;
- messages are generic and never echo the directive (not even the action id).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, Protocol, TypeVar

from connector.contract.canonical import canonical_bytes
from connector.contract.catalog_models import CatalogAction
from connector.contract.validate import validate
from connector.core import authority
from connector.core.clock import parse_time, to_ms
from connector.core.commands import CommandAction, check_command_input
from connector.core.ids import OPERATION_KIND, keyed_operation_id, random_operation_id
from connector.core.policy import DeferredHostPolicy, discovery_window_end, retry_after
from connector.core.projections import deferred_handle
from connector.core.scope import DiscoveryProfile, DiscoveryScope, normalised_input, parse_discovery_input
from connector.errors import AdmissionError, Code

T = TypeVar("T")

SYNC_ONLY: Final = "sync-only"
ASYNC_ONLY: Final = "async-only"
EITHER: Final = "either"
DEFAULT_EXECUTION_MODE_SUPPORT: Final = SYNC_ONLY
DEFAULT_STATUS_VERSIONS: Final = (1,)

# CONTRACT §2 step 8: the directive parts an idempotent replay must repeat; the rest may differ.
FINGERPRINT_FIELDS: Final = ("action_id", "timing", "input")

DIRECTIVE_SCHEMA: Final = "sensorium-directive.v1"
MAX_DIAGNOSTICS: Final = 16
ENTROPY_BYTES: Final = 16

Mode = Literal["sync", "async"]

_MODES_ALLOWED: Final[Mapping[str, frozenset[str]]] = {
    SYNC_ONLY: frozenset({"sync"}),
    ASYNC_ONLY: frozenset({"async"}),
    EITHER: frozenset({"sync", "async"}),
}


def find_action(actions_by_id: Mapping[str, T], action_id: str) -> T:
    """The catalog entry for `action_id` (step 3); 404 `unknown-action` when the catalog lacks it."""
    if action_id not in actions_by_id:
        raise AdmissionError("action is not in the verified catalog", code=Code.UNKNOWN_ACTION)
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
            code=Code.INVALID_DIRECTIVE,
            diagnostics=[{"code": "enum", "message": "/timing/mode"}],
        )
    if requested_mode not in _MODES_ALLOWED[support]:
        raise AdmissionError(
            "the action does not support the requested execution mode", code=Code.EXECUTION_MODE_NOT_SUPPORTED
        )


def require_status_v2(status_versions: Sequence[int] | None) -> None:
    """Refuse a discovery directive that cannot read v2 statuses (step 7); absent means `[1]`."""
    versions = DEFAULT_STATUS_VERSIONS if status_versions is None else status_versions
    if not any(v == 2 and not isinstance(v, bool) for v in versions):
        raise AdmissionError(
            "discovery needs 2 in timing.status_versions",
            code=Code.STATUS_V2_REQUIRED,
            diagnostics=[{"code": Code.STATUS_V2_REQUIRED, "message": "/timing/status_versions"}],
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
        code=Code.INVALID_DIRECTIVE,
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
            "the idempotency key was used with a different directive", code=Code.IDEMPOTENCY_CONFLICT
        )


class CatalogView(Protocol):
    """What admission reads of the verified catalog (`connector.catalog.signing.VerifiedCatalog`)."""

    @property
    def actions(self) -> Mapping[str, CatalogAction]:
        """The catalog's actions by id."""
        ...

    def discovery_profile(self, action_id: str) -> DiscoveryProfile:
        """The core's profile of a discovery action."""
        ...


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What admission decided for one scan; fixed for the life of the session."""

    operation_id: str
    owner: str
    action_id: str
    scope: DiscoveryScope
    profile: DiscoveryProfile
    created_at_ms: int
    window_end_ms: int
    cut_by_deadline: bool
    timeout_at_ms: int | None
    expires_at_ms: int | None
    causal_context: Mapping[str, Any] | None
    retry_after_seconds: int
    # The adapter the claim is keyed by: the provider starts on this one resolution, not a second one.
    adapter: str | None = None


@dataclass(frozen=True, slots=True)
class AdmittedScan:
    """A scan through step 8: the session it starts and the handle its 202 carries."""

    session: SessionSpec
    handle: Mapping[str, Any]
    fingerprint: bytes
    keyed: bool

    @property
    def operation_id(self) -> str:
        """The scan's operation id."""
        return self.session.operation_id


@dataclass(frozen=True, slots=True)
class AdmittedCommand:
    """A command directive through step 8: what the runner is given."""

    operation_id: str
    owner: str
    command: CommandAction
    input: Mapping[str, Any]
    mode: Mode
    created_at: datetime
    timeout_ms: int | None
    expires_at: datetime
    causal_context: Mapping[str, Any] | None
    fingerprint: bytes
    keyed: bool


Admitted = AdmittedScan | AdmittedCommand


def check_directive(directive: Any) -> Mapping[str, Any]:
    """Step 2: the directive's schema; the failing paths only, never values."""
    # A JSON array is not a directive (and the validator reads a list as a series of polls).
    messages = ["/: type"] if not isinstance(directive, dict) else _directive_violations(directive)
    if messages:
        diagnostics = [{"code": Code.INVALID_DIRECTIVE, "message": m} for m in messages[:MAX_DIAGNOSTICS]]
        raise AdmissionError(
            "the directive does not match its schema", code=Code.INVALID_DIRECTIVE, diagnostics=diagnostics
        )
    checked: Mapping[str, Any] = directive
    return checked


def _directive_violations(directive: Mapping[str, Any]) -> list[str]:
    """The schema path's findings; the model path first, as it accepts a valid directive 20x sooner."""
    # The model states the schema's shape (tests/contract/test_model_schemas.py: the directive's is not
    # looser) and both paths run the same semantic rules, so a directive the model path accepts has no
    # finding on the schema path either; any other is answered by the schema path, word for word.
    if not validate(DIRECTIVE_SCHEMA, directive, via="model"):
        return []
    return [str(v) for v in validate(DIRECTIVE_SCHEMA, directive, via="schema")]


@dataclass(frozen=True, slots=True)
class Identified:
    """A directive through steps 2 and 3: checked, its catalog action, its key and the id that key derives."""

    directive: Mapping[str, Any]
    action: CatalogAction
    key: str | None
    keyed_id: str | None  # None: an unkeyed directive (its id is drawn from entropy when it is planned)


def identify(
    directive: Any,
    *,
    principal: authority.Principal,
    catalog: CatalogView,
    op_key: str | None = None,
    operations_only: bool = False,
) -> Identified:
    """Steps 2 (schema) and 3 (catalog), then, for a surface that starts operations only (the Bus), the
    refusal of a sync directive; and the keyed id. `op_key` (a Bus `op`) overrides the directive's key."""
    checked = check_directive(directive)
    action = find_action(catalog.actions, checked["action_id"])
    if operations_only and checked["timing"].get("mode") == "sync":
        raise AdmissionError(
            "the Bus starts operations: send timing.mode async", code=Code.EXECUTION_MODE_NOT_SUPPORTED
        )
    key = op_key if op_key is not None else checked.get("idempotency_key")
    keyed_id = None if key is None else keyed_operation_id(principal.principal_id, action.action_id, key)
    return Identified(checked, action, key, keyed_id)


def plan_admission(
    directive: Any,
    *,
    principal: authority.Principal,
    catalog: CatalogView,
    policy: DeferredHostPolicy,
    now: datetime,
    entropy: Callable[[int], bytes],
    op_key: str | None = None,
    check_grant: bool = True,
    identified: Identified | None = None,
) -> Admitted:
    """Steps 2-8 of CONTRACT §2 for an authenticated principal; `op_key` (a Bus `op`) overrides the key.

    `identified` is this directive's `identify` for this principal and key, when an edge ran steps 2-3
    already (they are not run twice). `check_grant=False` is for the operator at the terminal (`scan`),
    who holds no caller grants.
    """
    known = identified or identify(directive, principal=principal, catalog=catalog, op_key=op_key)
    checked, action = known.directive, known.action
    timing: Mapping[str, Any] = checked["timing"]
    check_execution_mode(action.execution_mode_support, timing["mode"])
    if check_grant:
        authority.require_grant(principal, action.action_id, _requested_transport(action, checked))
    steps = _Steps(checked, timing, principal, action, now, known.keyed_id, entropy)
    if action.action_class == "discovery":
        return steps.scan(catalog.discovery_profile(action.action_id), policy)
    return steps.command(policy)


def caller_deadline(directive: Mapping[str, Any]) -> datetime | None:
    """The caller's `timing.deadline_at` of a checked directive (the host clamps its expiry by it too)."""
    timing: Mapping[str, Any] = directive["timing"]
    return parse_time(timing["deadline_at"]) if "deadline_at" in timing else None


def _requested_transport(action: CatalogAction, directive: Mapping[str, Any]) -> str | None:
    """The transport a grant must cover (step 5 runs before the input is checked: only a string counts)."""
    transport = directive["input"].get("transport") if action.action_class == "discovery" else None
    return transport if isinstance(transport, str) else None


@dataclass(frozen=True, slots=True)
class _Steps:
    """Steps 6-8 and the derived times of one directive, by action class."""

    directive: Mapping[str, Any]
    timing: Mapping[str, Any]
    principal: authority.Principal
    action: CatalogAction
    now: datetime
    keyed_id: str | None
    entropy: Callable[[int], bytes]

    def scan(self, profile: DiscoveryProfile, policy: DeferredHostPolicy) -> AdmittedScan:
        """Steps 6 (scope), 7 (status v2), 8 (fingerprint), then the session's window and expiry."""
        timeout_ms = self.timing.get("timeout_ms")
        scope = parse_discovery_input(self.directive["input"], profile, timeout_ms=timeout_ms)
        require_status_v2(self.timing.get("status_versions"))
        # CONTRACT §6.1: `180d` and its 128-bit form are one scope, so they are one fingerprint.
        normal = normalised_input(self.directive["input"], scope)
        fingerprint = directive_fingerprint({**self.directive, "input": normal})
        op_id = self._operation_id()
        deadline = caller_deadline(self.directive)
        window_end, cut = discovery_window_end(
            self.now, scope.window_seconds, deadline, profile.cleanup_timeout_ms
        )
        expires_at = self._expires_at(policy, self._preferred_ttl(), deadline)
        retry = retry_after(self.action.deferred_profile)
        now_ms = to_ms(self.now)
        session = SessionSpec(
            operation_id=op_id,
            owner=self.principal.principal_id,
            action_id=self.action.action_id,
            scope=scope,
            profile=profile,
            created_at_ms=now_ms,
            window_end_ms=to_ms(window_end),
            cut_by_deadline=cut,
            timeout_at_ms=None if timeout_ms is None else now_ms + timeout_ms,
            expires_at_ms=to_ms(expires_at),
            causal_context=self.directive.get("causal/context"),
            retry_after_seconds=retry,
        )
        handle = deferred_handle(
            op_id,
            self.action.action_id,
            retry_after_seconds=retry,
            fail_after=expires_at - self.now,
            rounding="down",
        )
        return AdmittedScan(session, handle, fingerprint, keyed=self.keyed_id is not None)

    def command(self, policy: DeferredHostPolicy) -> AdmittedCommand:
        """Steps 6 (the command's input rule) and 8 (fingerprint), then the operation's expiry."""
        command = CommandAction.from_catalog(self.action)
        check_command_input(command, self.directive["input"])
        fingerprint = directive_fingerprint(self.directive)
        op_id = self._operation_id()
        deadline = caller_deadline(self.directive)
        expires_at = self._expires_at(policy, command.preferred_max_ttl_seconds, deadline)
        return AdmittedCommand(
            operation_id=op_id,
            owner=self.principal.principal_id,
            command=command,
            input=self.directive["input"],
            mode=self.timing["mode"],
            created_at=self.now,
            timeout_ms=self.timing.get("timeout_ms"),
            expires_at=expires_at,
            causal_context=self.directive.get("causal/context"),
            fingerprint=fingerprint,
            keyed=self.keyed_id is not None,
        )

    def _operation_id(self) -> str:
        if self.keyed_id is None:
            return random_operation_id(OPERATION_KIND, self.entropy(ENTROPY_BYTES))
        return self.keyed_id

    def _preferred_ttl(self) -> int | None:
        deferred = self.action.deferred_profile
        return deferred.preferred_max_ttl_seconds if deferred else None

    def _expires_at(
        self, policy: DeferredHostPolicy, preferred_ttl: int | None, deadline: datetime | None
    ) -> datetime:
        return policy.effective_expires_at(
            self.now, connector_fail_after=None, preferred_max_ttl=preferred_ttl, caller_deadline=deadline
        )
