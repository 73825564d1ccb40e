"""The connector service: admission in SPEC 2 order, then discovery sessions or command actions.

HTTP and the Bus are thin faces over this class. Every method authenticates first and re-checks the
principal's current grant; an operation that is not the principal's answers `unknown-operation`.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from connector.catalog.signing import VerifiedCatalog
from connector.contract.catalog_models import CatalogAction
from connector.contract.validate import validate
from connector.core import authority
from connector.core.admission import (
    check_execution_mode,
    check_idempotent_replay,
    directive_fingerprint,
    find_action,
    require_status_v2,
)
from connector.core.ids import OPERATION_KIND, operation_id, random_operation_id
from connector.core.lifecycle import Status
from connector.core.policy import DeferredHostPolicy, discovery_window_end
from connector.core.projections import status_from_durable
from connector.core.scope import DiscoveryScope, parse_discovery_input
from connector.errors import AdmissionError, SensoriumError, unknown_operation
from connector.runtime.commands import CommandAction, CommandRunner, check_command_input
from connector.runtime.kinds import Kind, operation_runtimes
from connector.runtime.manager import DiscoveryManager
from connector.service.answers import Accepted, Created, Done, Gone
from connector.service.bindings import Bindings, bind_request, refuse_erased
from connector.storage.principals import PrincipalDirectory
from connector.storage.state import CommandOperation, ConnectorState, DiscoveryRecord
from providers.base import Provider

ProviderFactory = Callable[[str, str | None], Provider]
MAX_WAIT_SECONDS = 30
PRINCIPALS_WATCH_INTERVAL_SECONDS = 1.0
METADATA_SWEEP_SECONDS = 600.0


def wall_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


def to_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch."""
    return int(moment.timestamp() * 1000)


def parse_time(text: str) -> datetime:
    """An RFC 3339 UTC time with `Z` (already schema-checked)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(slots=True)
class _Admitted:
    """A keyed discovery admission kept in memory for idempotent repeats (fingerprint never stored).

    Kept while the runtime holds the session; `recorded` is set once the durable record was written (or
    the admission failed, `failed`), so that a concurrent repeat never answers before the first does.
    """

    fingerprint: bytes
    answer: Accepted
    recorded: anyio.Event = field(default_factory=anyio.Event)
    failed: bool = False
    refusal: SensoriumError | None = None


@dataclass(frozen=True, slots=True)
class OperationRef:
    """Where an operation lives and whose it is."""

    operation_id: str
    kind: Kind
    owner: str
    action_id: str
    transport: str | None
    record: DiscoveryRecord | None = None  # a scan the runtime no longer holds: its durable record


class ConnectorService:
    """Admits directives and serves operations; selections and bindings are delegated to `Bindings`."""

    def __init__(
        self,
        *,
        catalog: VerifiedCatalog,
        principals: PrincipalDirectory,
        discovery: DiscoveryManager,
        commands: CommandRunner,
        state: ConnectorState,
        providers: ProviderFactory,
        policy: DeferredHostPolicy | None = None,
        clock: Callable[[], datetime] = wall_clock,
        entropy: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.catalog = catalog
        self.principals = principals
        self.discovery = discovery
        self.commands = commands
        self.runtimes = operation_runtimes(discovery, commands)
        self.state = state
        self._providers = providers
        self.policy = policy or DeferredHostPolicy()
        self._clock = clock
        self._entropy = entropy
        # A command's step 8 (stored row, or a reservation) is decided under one lock.
        self._admission = anyio.Lock()
        self._starting: dict[str, anyio.Event] = {}
        # Step 9's ledger: every admitted operation that has not ended, kept (never scanned). Counting and
        # reserving are one synchronous step, so concurrent admissions can never overrun the limit.
        self._live_owner: dict[str, str] = {}
        self._live_count: Counter[str] = Counter()
        self._admitted: dict[str, _Admitted] = {}
        self.bindings = Bindings(state=state, discovery=discovery, clock=clock, entropy=entropy)
        self._undo_revoked = principals.on_revoked(self._on_revoked)
        discovery.add_ended_listener(lambda op_id, _owner: self._end_live(op_id))
        discovery.add_forget_listener(self._forget_books)
        commands.add_ended_listener(self._end_live)

    # ---- authority -----------------------------------------------------------------------------------------

    def authenticate(self, token: str | None) -> authority.Principal:
        """The principal behind a bearer token, after picking up any change of the principals file."""
        self.principals.reload_if_changed()
        return self.principals.authenticate(token)

    async def watch_principals(self, interval_s: float = PRINCIPALS_WATCH_INTERVAL_SECONDS) -> None:
        """Pick up edits of the principals file (`principals revoke`) without waiting for a request."""
        while True:
            await anyio.sleep(interval_s)
            self.principals.reload_if_changed()

    def _on_revoked(self, principal_id: str, action_ids: frozenset[str]) -> None:
        """A lost grant invalidates that principal's candidates at once; host-owned cleanup follows.

        The runtime ends the live sessions and erases retained results; the selections and the bind
        answers (which hold addresses) of every such operation go too.
        """
        for action_id in action_ids:
            self.discovery.revoke_owner(principal_id, action_id=action_id)
            for op_id in self.discovery.operation_ids():
                handle = self.discovery.handle(op_id)
                if handle.owner == principal_id and handle.action_id == action_id:
                    self.bindings.drop(op_id)

    async def sweep_metadata(
        self, retention_seconds: int, interval_s: float = METADATA_SWEEP_SECONDS
    ) -> None:
        """Metadata retention of the connector's own records (SPEC 6.8: 7 days, then `unknown`)."""
        while True:
            now = self._clock()
            cutoff = now - timedelta(seconds=retention_seconds)
            await self.state.delete_discoveries_ended_before(to_ms(cutoff))
            await self.commands.purge(now, timedelta(seconds=retention_seconds))
            await anyio.sleep(interval_s)

    async def locate(self, principal: authority.Principal, op_id: str) -> OperationRef:
        """The principal's own operation, still covered by a current grant, else `unknown-operation`."""
        ref = await self._find(op_id)
        if ref is None or not authority.may_see(principal, ref.owner, ref.action_id, ref.transport):
            raise unknown_operation()
        return ref

    async def _find(self, op_id: str) -> OperationRef | None:
        """The same two lookups for every id, known or not, so that existence does not show in timing."""
        located = await self.state.locate(op_id)
        handle = self.discovery.find(op_id)
        if handle is not None:
            return OperationRef(op_id, "discovery", handle.owner, handle.action_id, handle.scope.transport)
        if located is None:
            return None
        return OperationRef(
            op_id, located.kind, located.owner, located.action_id, located.transport, located.discovery
        )

    # ---- directives ----------------------------------------------------------------------------------------

    async def invoke(self, token: str | None, directive: Any) -> Accepted | Done:
        """POST /v1/directives: admission in SPEC 2 order, then start or run the work."""
        principal = self.authenticate(token)
        return await self._admit(principal, directive, idempotency_key=None)

    async def invoke_as(
        self, principal: authority.Principal, directive: Any, *, op_key: str | None
    ) -> Accepted | Done:
        """Admission for an already authenticated principal; `op_key` overrides the idempotency key (Bus)."""
        return await self._admit(principal, directive, idempotency_key=op_key)

    async def _admit(
        self, principal: authority.Principal, directive: Any, *, idempotency_key: str | None
    ) -> Accepted | Done:
        _check_directive(directive)
        action = find_action(self.catalog.actions, directive["action_id"])
        timing = directive["timing"]
        check_execution_mode(action.execution_mode_support, timing["mode"])
        raw_input = directive["input"]
        transport = raw_input.get("transport") if action.action_class == "discovery" else None
        authority.require_grant(
            principal, action.action_id, transport if isinstance(transport, str) else None
        )
        key = idempotency_key if idempotency_key is not None else directive.get("idempotency_key")
        if action.action_class == "discovery":
            return await self._admit_discovery(principal, action, directive, key)
        return await self._admit_command(principal, action, directive, key)

    def _new_operation_id(self, principal: authority.Principal, action_id: str, key: str | None) -> str:
        if key is None:
            return random_operation_id(OPERATION_KIND, self._entropy(16))
        return operation_id(
            OPERATION_KIND, principal_id=principal.principal_id, action_id=action_id, idempotency_key=key
        )

    async def _admit_discovery(
        self,
        principal: authority.Principal,
        action: CatalogAction,
        directive: Mapping[str, Any],
        key: str | None,
    ) -> Accepted:
        timing = directive["timing"]
        profile = self.catalog.discovery_profile(action.action_id)
        scope = parse_discovery_input(directive["input"], profile, timeout_ms=timing.get("timeout_ms"))
        require_status_v2(timing.get("status_versions"))
        fingerprint = directive_fingerprint(directive)
        op_id = self._new_operation_id(principal, action.action_id, key)
        admitted = self._admitted.get(op_id)
        if admitted is None and key is not None:
            record = await self.state.get_discovery(op_id)
            admitted = self._admitted.get(op_id)  # a first admission may have begun meanwhile
            if admitted is None and record is not None:
                # The runtime no longer holds it (erased, or a restart): the recorded first answer, and
                # nothing starts (SPEC 4: the fingerprint is gone, directives are not compared).
                return _accepted(record.reply)
        if admitted is not None:
            check_idempotent_replay(admitted.fingerprint, fingerprint)
            with anyio.CancelScope(shield=True):  # bounded: the first admission's claim and one write
                await admitted.recorded.wait()
            if admitted.refusal is not None:
                raise admitted.refusal  # the first admission was refused: so is its repeat
            if admitted.failed:
                raise SensoriumError("the first admission with this key failed", code="internal")
            return admitted.answer
        return await self._start_scan(principal, action, directive, scope, op_id, fingerprint, key)

    def _reserve_live(self, owner: str, op_id: str) -> None:
        """Step 9, per-principal part: count and reserve in one synchronous step (no await in between)."""
        if not self.policy.admits_another_operation(self._live_count[owner]):
            raise AdmissionError(
                "too many operations for this principal", code="too-many-operations", retry_after_seconds=1
            )
        self._live_owner[op_id] = owner
        self._live_count[owner] += 1

    def _end_live(self, op_id: str) -> None:
        """An operation ended (or its admission failed): it no longer counts (idempotent)."""
        owner = self._live_owner.pop(op_id, None)
        if owner is None:
            return
        self._live_count[owner] -= 1
        if self._live_count[owner] <= 0:
            del self._live_count[owner]

    def _forget_books(self, op_id: str) -> None:
        """The runtime let a session go: its in-memory books go with it."""
        self._admitted.pop(op_id, None)
        self.bindings.drop(op_id)

    async def _start_scan(
        self,
        principal: authority.Principal,
        action: CatalogAction,
        directive: Mapping[str, Any],
        scope: DiscoveryScope,
        op_id: str,
        fingerprint: bytes,
        key: str | None,
    ) -> Accepted:
        """Reserve, take the claim, record durably, then launch: the 202 leaves only after the record."""
        timing = directive["timing"]
        profile = self.catalog.discovery_profile(action.action_id)
        now = self._clock()
        deadline = parse_time(timing["deadline_at"]) if "deadline_at" in timing else None
        window_end, cut = discovery_window_end(
            now, scope.window_seconds, deadline, profile.cleanup_timeout_ms
        )
        preferred = action.deferred_profile.preferred_max_ttl_seconds if action.deferred_profile else None
        expires_at = self.policy.effective_expires_at(
            now, connector_fail_after=None, preferred_max_ttl=preferred, caller_deadline=deadline
        )
        retry_after = _retry_after(action)
        self._reserve_live(principal.principal_id, op_id)
        handle = _deferred_handle(op_id, action.action_id, retry_after, expires_at - now, cancelable=True)
        answer = _accepted(handle)
        admitted = _Admitted(fingerprint, answer)
        if key is not None:
            self._admitted[op_id] = admitted  # before any await: a concurrent repeat waits for this one
        try:
            await self.discovery.prepare_scan(
                operation_id=op_id,
                owner=principal.principal_id,
                action_id=action.action_id,
                scope=scope,
                profile=profile,
                provider=self._providers(scope.transport, scope.adapter),
                now_ms=to_ms(now),
                window_end_ms=to_ms(window_end),
                cut_by_deadline=cut,
                timeout_ms=timing.get("timeout_ms"),
                expires_at_ms=to_ms(expires_at),
                causal_context=directive.get("causal/context"),
                retry_after_seconds=retry_after,
            )
            await self.state.insert_discovery(
                DiscoveryRecord(
                    operation_id=op_id,
                    owner=principal.principal_id,
                    action_id=action.action_id,
                    transport=scope.transport,
                    status=Status.PENDING.value,
                    metadata=self.discovery.metadata(op_id),
                    reply=handle,
                    causal_context=directive.get("causal/context"),
                )
            )
        except BaseException as error:
            # Refused (claim) or no durable record: no work; the prepared session never runs.
            admitted.failed = True
            admitted.refusal = error if isinstance(error, SensoriumError) else None
            self._admitted.pop(op_id, None)
            self.discovery.abandon(op_id)
            self._end_live(op_id)
            raise
        finally:
            admitted.recorded.set()
        self.discovery.launch(op_id)
        return answer

    async def _admit_command(
        self,
        principal: authority.Principal,
        action: CatalogAction,
        directive: Mapping[str, Any],
        key: str | None,
    ) -> Accepted | Done:
        command = CommandAction.from_catalog(action)
        check_command_input(command, directive["input"])
        fingerprint = directive_fingerprint(directive).hex()
        op_id = self._new_operation_id(principal, action.action_id, key)
        existing = await self._reserve(principal, op_id)
        if existing is not None:
            check_idempotent_replay(bytes.fromhex(existing.idempotency_fp or ""), bytes.fromhex(fingerprint))
            return _command_answer(await self.commands.replay(op_id, command))
        try:
            return await self._submit(principal, command, directive, op_id, fingerprint)
        except BaseException:
            self._end_live(op_id)  # refused or broken before (or while) running: it no longer counts
            raise
        finally:
            self._starting.pop(op_id).set()

    async def _reserve(self, principal: authority.Principal, op_id: str) -> CommandOperation | None:
        """Steps 8 and 9 of a command: the stored operation of a repeated key, else a reservation (None)."""
        while True:
            async with self._admission:
                existing = await self.commands.operation(op_id)
                starting = self._starting.get(op_id)
                if existing is not None:
                    return existing
                if starting is None:
                    self._reserve_live(principal.principal_id, op_id)
                    self._starting[op_id] = anyio.Event()
                    return None
            await starting.wait()  # the first request with this key is still being admitted

    async def _submit(
        self,
        principal: authority.Principal,
        command: CommandAction,
        directive: Mapping[str, Any],
        op_id: str,
        fingerprint: str,
    ) -> Accepted | Done:
        timing = directive["timing"]
        now = self._clock()
        deadline = parse_time(timing["deadline_at"]) if "deadline_at" in timing else None
        expires_at = self.policy.effective_expires_at(
            now,
            connector_fail_after=None,
            preferred_max_ttl=command.preferred_max_ttl_seconds,
            caller_deadline=deadline,
        )
        answer = await self.commands.submit(
            op_id,
            principal.principal_id,
            command,
            directive["input"],
            timing["mode"],
            now,
            timeout_ms=timing.get("timeout_ms"),
            expires_at=expires_at,
            idempotency_fp=fingerprint,
            causal_context=directive.get("causal/context"),
        )
        return _command_answer(answer)

    # ---- operations ----------------------------------------------------------------------------------------

    async def status(
        self,
        token: str | None,
        op_id: str,
        *,
        wait_seconds: float | None = None,
        after_revision: int | None = None,
    ) -> Done:
        """GET /v1/operations/{id}, with the optional long poll."""
        ref = await self.locate(self.authenticate(token), op_id)
        wait = None if wait_seconds is None else max(0.0, min(float(wait_seconds), MAX_WAIT_SECONDS))
        if not wait:
            return self._deliver(op_id, await self._current_status(ref))
        waited = None
        if ref.record is None:  # an ended scan (its record) will not change any more
            waited = await self.runtimes[ref.kind].wait(op_id, after_revision, wait)
        document = waited if waited is not None else await self._current_status(ref)
        delivered = self._deliver(op_id, document)
        # Authority is checked again after the wait: a revocation meanwhile answers as for anyone else.
        await self.locate(self.authenticate(token), op_id)
        return delivered

    def _deliver(self, op_id: str, document: dict[str, Any]) -> Done:
        """A status leaves for its caller: the candidates in it count as disclosed from now on."""
        self.discovery.mark_disclosed(op_id, document)
        return Done(document)

    async def _current_status(self, ref: OperationRef) -> dict[str, Any]:
        """From the runtime while it holds the operation, else from a scan's durable record (SPEC 7 only)."""
        document = await self.runtimes[ref.kind].status(ref.operation_id)
        if document is not None:
            return document
        record = ref.record if ref.record is not None else await self.state.get_discovery(ref.operation_id)
        if record is None:
            raise unknown_operation()
        return status_from_durable(
            record.metadata, final_revision=record.final_revision, causal_context=record.causal_context
        )

    async def cancel(self, token: str | None, op_id: str) -> Done:
        """POST /v1/operations/{id}/cancel: the status after the request."""
        ref = await self.locate(self.authenticate(token), op_id)
        document = await self.runtimes[ref.kind].cancel(op_id)
        if document is None:  # ended: the unchanged status
            document = await self._current_status(ref)
        return self._deliver(op_id, document)

    async def select(self, token: str | None, op_id: str, body: Any) -> Done:
        """POST /v1/operations/{id}/selection: remember a candidate of a running snapshot (memory only)."""
        principal = self.authenticate(token)
        ref = await self.locate(principal, op_id)
        authority.require_grant(principal, ref.action_id, ref.transport)
        return self.bindings.select(op_id, body)

    async def bind(self, token: str | None, op_id: str, body: Any) -> Created:
        """POST /v1/operations/{id}/bindings: consume a candidate exactly once and reveal its address."""
        principal = self.authenticate(token)
        ref = await self.locate(principal, op_id)
        authority.require_grant(principal, ref.action_id, ref.transport)
        candidate_ref, key = bind_request(body)
        if not self.runtimes[ref.kind].bindable:
            raise SensoriumError("this operation has no candidates to bind", code="not-bindable")
        if self.discovery.find(op_id) is None:
            refuse_erased(Status((await self._current_status(ref))["status"]))
        return await self.bindings.bind(principal, op_id, candidate_ref, key)

    async def forget(self, token: str | None, binding_id: str) -> Gone:
        """DELETE /v1/bindings/{id}: erase a binding (the owner's own, or any for an operator)."""
        return await self.bindings.forget(self.authenticate(token), binding_id)

    async def list_bindings(self, token: str | None) -> Done:
        """GET /v1/bindings: the caller's own bindings with addresses, or every one for an operator."""
        return await self.bindings.listing(self.authenticate(token))

    def catalog_summary(self) -> dict[str, Any]:
        """GET /v1/catalog."""
        return self.catalog.summary()

    def revoke(self, token: str | None, principal_id: str, action_id: str | None) -> Done:
        """POST /v1/admin/principals/{id}/revoke (operators only)."""
        authority.require_operator(self.authenticate(token))
        lost = self._revoke_now(principal_id, action_id)
        return Done(revocation_answer(principal_id, action_id, lost))

    def _revoke_now(self, principal_id: str, action_id: str | None) -> frozenset[str]:
        try:
            return self.principals.revoke_now(principal_id, action_id)
        except SensoriumError as error:
            if error.code in ("unknown-principal", "unknown-grant"):
                raise SensoriumError("no such principal or grant", code="not-found") from None
            raise


def revocation_answer(principal_id: str, action_id: str | None, lost: frozenset[str]) -> dict[str, Any]:
    """What a revocation did: the whole principal (its token stops working) or one grant; actions lost.

    An operator holds no grants: `revoked_actions` alone would read `[]` for a principal that was revoked.
    """
    answer: dict[str, Any] = {
        "principal/id": principal_id,
        "revoked": "grant" if action_id is not None else "principal",
        "revoked_actions": sorted(lost),
    }
    if action_id is not None:
        answer["action_id"] = action_id
    return answer


def _check_directive(directive: Any) -> None:
    """Step 2: the directive's schema; failing paths only, never values."""
    # A JSON array is not a directive (and the validator reads a list as a series of polls).
    messages = (
        ["/: type"]
        if not isinstance(directive, dict)
        else [str(v) for v in validate("sensorium-directive.v1", directive, via="schema")]
    )
    if messages:
        diagnostics = [{"code": "invalid-directive", "message": message} for message in messages[:16]]
        raise AdmissionError(
            "the directive does not match its schema", code="invalid-directive", diagnostics=diagnostics
        )


def _retry_after(action: CatalogAction) -> int:
    profile = action.deferred_profile
    return profile.retry_after_seconds if profile and profile.retry_after_seconds is not None else 1


def _deferred_handle(
    op_id: str, action_id: str, retry_after: int, ttl: timedelta, *, cancelable: bool
) -> dict[str, Any]:
    """A `sensorium-connector-deferred.v1` for a discovery operation."""
    handle: dict[str, Any] = {
        "schema": "sensorium-connector-deferred.v1",
        "connector_operation/id": op_id,
        "action_id": action_id,
        "retry_after_seconds": retry_after,
        "status_path": f"/v1/operations/{op_id}",
        "fail_after_seconds": max(0, int(ttl.total_seconds())),
        "diagnostics": [],
    }
    if cancelable:
        handle["cancel_path"] = f"/v1/operations/{op_id}/cancel"
    return handle


def _accepted(handle: Mapping[str, Any]) -> Accepted:
    """A `sensorium-connector-deferred.v1` handle, read at its `status_path`."""
    return Accepted(handle, handle["status_path"])


def _command_answer(answer: Mapping[str, Any]) -> Accepted | Done:
    """A command's answer: a deferred handle, or a sync result."""
    if answer.get("schema") == "sensorium-connector-deferred.v1":
        return _accepted(answer)
    return Done(answer)
