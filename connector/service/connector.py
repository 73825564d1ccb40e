"""The connector service: admission in CONTRACT §2 order, then discovery sessions or command actions.

HTTP and the Bus are thin faces over this class. Each edge authenticates once (`authenticate`) and hands
the `Principal` down; every method re-checks its current grant, and an operation that is not the principal's
answers `unknown-operation`. The host's questions (`observe`, `poll`, `request_cancel`, `stop`) name a kind
instead: the host checks authority itself, against its own registry row. Each kind's work is its runtime's
`Operations`.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import anyio

from connector.catalog.signing import VerifiedCatalog
from connector.core import authority
from connector.core.admission import (
    AdmittedCommand,
    AdmittedScan,
    Identified,
    check_idempotent_replay,
    identify,
    plan_admission,
)
from connector.core.clock import to_ms, wall_clock
from connector.core.lifecycle import Status
from connector.core.policy import DeferredHostPolicy, clamp_wait
from connector.core.projections import status_from_durable
from connector.errors import AdmissionError, Code, SensoriumError, unknown_operation
from connector.runtime.commands import CommandRunner
from connector.runtime.manager import DiscoveryManager, ScanAdmission
from connector.runtime.operations import Kind, Observed, Operations
from connector.service.answers import Accepted, Created, Done, Gone
from connector.service.bindings import Bindings, bind_request, refuse_erased
from connector.storage.principals import PrincipalDirectory
from connector.storage.state import CommandOperation, ConnectorState, DiscoveryRecord
from providers.base import Provider

ProviderFactory = Callable[[str, str | None], Provider]
PRINCIPALS_WATCH_INTERVAL_SECONDS = 1.0
METADATA_SWEEP_SECONDS = 600.0


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
        self.runtimes: dict[Kind, Operations[Any, Any]] = {"discovery": discovery, "command": commands}
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
        self._live_transport: dict[str, str] = {}
        self._live_sessions: Counter[str] = Counter()
        self._admitted: dict[str, _Admitted] = {}
        self.authentications = 0
        self.bindings = Bindings(state=state, discovery=discovery, clock=clock, entropy=entropy)
        self._undo_revoked = principals.on_revoked(self._on_revoked)
        discovery.add_ended_listener(lambda op_id, _owner: self._end_live(op_id))
        discovery.add_forget_listener(self._forget_books)
        commands.add_ended_listener(self._end_live)

    # ---- authority -----------------------------------------------------------------------------------------

    def authenticate(self, token: str | None) -> authority.Principal:
        """The principal behind a bearer token, after picking up any change of the principals file.

        Each edge calls this once per request; `authentications` counts the calls (one per request).
        """
        self.authentications += 1
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
            mine = (principal_id, action_id)
            self.discovery.revoke_owner(principal_id, action_id=action_id)
            for op_id in self.discovery.operation_ids():
                session = self.discovery.session(op_id)
                if session is not None and (session.spec.owner, session.spec.action_id) == mine:
                    self.bindings.drop(op_id)

    async def sweep_metadata(
        self, retention_seconds: int, interval_s: float = METADATA_SWEEP_SECONDS
    ) -> None:
        """Metadata retention of the connector's own records (CONTRACT §6.8: 7 days, then `unknown`)."""
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
        session = self.discovery.session(op_id)
        if session is not None:
            spec = session.spec
            return OperationRef(op_id, "discovery", spec.owner, spec.action_id, spec.scope.transport)
        if located is None:
            return None
        return OperationRef(
            op_id, located.kind, located.owner, located.action_id, located.transport, located.discovery
        )

    # ---- directives ----------------------------------------------------------------------------------------

    def identify(
        self, principal: authority.Principal, directive: Any, *, op_key: str | None, operations_only: bool
    ) -> Identified:
        """Admission steps 2-3 and the keyed id, for an edge that looks the operation up before admitting."""
        return identify(
            directive,
            principal=principal,
            catalog=self.catalog,
            op_key=op_key,
            operations_only=operations_only,
        )

    async def invoke(
        self,
        principal: authority.Principal,
        directive: Any,
        *,
        op_key: str | None = None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        """Admission (CONTRACT §2 steps 2-9) for an authenticated principal, then start or run the work.

        `op_key` (a Bus `op`) overrides the directive's idempotency key; `identified` is this directive's
        `identify` when the edge ran steps 2-3 already.
        """
        plan = plan_admission(
            directive,
            principal=principal,
            catalog=self.catalog,
            policy=self.policy,
            now=self._clock(),
            entropy=self._entropy,
            op_key=op_key,
            identified=identified,
        )
        if isinstance(plan, AdmittedScan):
            return await self._admit_discovery(plan)
        return await self._admit_command(plan)

    async def _admit_discovery(self, plan: AdmittedScan) -> Accepted:
        """Step 8 for a scan: a keyed repeat answers the first admission (or its record); else it starts."""
        op_id = plan.operation_id
        admitted = self._admitted.get(op_id)
        if admitted is None and plan.keyed:
            record = await self.state.get_discovery(op_id)
            admitted = self._admitted.get(op_id)  # a first admission may have begun meanwhile
            if admitted is None and record is not None:
                # The runtime no longer holds it (erased, or a restart): the recorded first answer, and
                # nothing starts (CONTRACT §4: the fingerprint is gone, directives are not compared).
                return _accepted(record.reply)
        if admitted is not None:
            check_idempotent_replay(admitted.fingerprint, plan.fingerprint)
            with anyio.CancelScope(shield=True):  # bounded: the first admission's claim and one write
                await admitted.recorded.wait()
            if admitted.refusal is not None:
                raise admitted.refusal  # the first admission was refused: so is its repeat
            if admitted.failed:
                raise SensoriumError("the first admission with this key failed", code=Code.INTERNAL)
            return admitted.answer
        return await self._start_scan(plan)

    def _reserve_live(self, owner: str, op_id: str, transport: str | None = None) -> None:
        """Step 9, the counted part: the principal's operations and, for a scan, the transport's live
        sessions (`max_live_sessions`), counted and reserved in one synchronous step (no await between)."""
        if not self.policy.admits_another_operation(self._live_count[owner]):
            raise AdmissionError(
                "too many operations for this principal", code=Code.TOO_MANY_OPERATIONS, retry_after_seconds=1
            )
        if transport is not None and not self.policy.admits_another_session(self._live_sessions[transport]):
            raise AdmissionError(
                "too many live sessions on this transport",
                code=Code.TOO_MANY_OPERATIONS,
                retry_after_seconds=1,
            )
        self._live_owner[op_id] = owner
        self._live_count[owner] += 1
        if transport is not None:
            self._live_transport[op_id] = transport
            self._live_sessions[transport] += 1

    def _end_live(self, op_id: str) -> None:
        """An operation ended (or its admission failed): it no longer counts (idempotent)."""
        owner = self._live_owner.pop(op_id, None)
        if owner is None:
            return
        _uncount(self._live_count, owner)
        transport = self._live_transport.pop(op_id, None)
        if transport is not None:
            _uncount(self._live_sessions, transport)

    def _forget_books(self, op_id: str) -> None:
        """The runtime let a session go: its in-memory books go with it."""
        self._admitted.pop(op_id, None)
        self.bindings.drop(op_id)

    async def _start_scan(self, plan: AdmittedScan) -> Accepted:
        """Reserve, then the runtime's admission (claim, durable record, start): the 202 leaves only after
        the record."""
        spec, op_id = plan.session, plan.operation_id
        self._reserve_live(spec.owner, op_id, spec.scope.transport)
        answer = _accepted(plan.handle)
        admitted = _Admitted(plan.fingerprint, answer)
        if plan.keyed:
            self._admitted[op_id] = admitted  # before any await: a concurrent repeat waits for this one
        try:
            provider = self._providers(spec.scope.transport, spec.scope.adapter)
            await self.discovery.admit(ScanAdmission(spec, provider, plan.handle))
        except BaseException as error:
            # Refused (claim) or no durable record: no work, nothing runs.
            admitted.failed = True
            admitted.refusal = error if isinstance(error, SensoriumError) else None
            self._admitted.pop(op_id, None)
            self._end_live(op_id)
            raise
        finally:
            admitted.recorded.set()
        return answer

    async def _admit_command(self, plan: AdmittedCommand) -> Accepted | Done:
        """Step 8 for a command: the stored operation of a repeated key, else a reservation and the run."""
        op_id = plan.operation_id
        existing = await self._reserve(plan.owner, op_id)
        if existing is not None:
            check_idempotent_replay(bytes.fromhex(existing.idempotency_fp or ""), plan.fingerprint)
            return _command_answer(await self.commands.replay(op_id, plan.command))
        try:
            return await self._submit(plan)
        except BaseException:
            self._end_live(op_id)  # refused or broken before (or while) running: it no longer counts
            raise
        finally:
            self._starting.pop(op_id).set()

    async def _reserve(self, owner: str, op_id: str) -> CommandOperation | None:
        """Steps 8 and 9 of a command: the stored operation of a repeated key, else a reservation (None)."""
        while True:
            async with self._admission:
                existing = await self.commands.operation(op_id)
                starting = self._starting.get(op_id)
                if existing is not None:
                    return existing
                if starting is None:
                    self._reserve_live(owner, op_id)
                    self._starting[op_id] = anyio.Event()
                    return None
            await starting.wait()  # the first request with this key is still being admitted

    async def _submit(self, plan: AdmittedCommand) -> Accepted | Done:
        return _command_answer(await self.commands.admit(plan))

    # ---- operations ----------------------------------------------------------------------------------------

    async def status(
        self,
        principal: authority.Principal,
        op_id: str,
        *,
        wait_seconds: float | None = None,
        after_revision: int | None = None,
    ) -> Done:
        """GET /v1/operations/{id}, with the optional long poll."""
        ref = await self.locate(principal, op_id)
        wait_s = clamp_wait(wait_seconds)
        delivered = self._deliver(op_id, await self._current_status(ref, after=after_revision, wait_s=wait_s))
        if wait_s:
            # Authority is checked again after the wait: a revocation meanwhile answers as for anyone else.
            await self.locate(self.principals.current(principal), op_id)
        return delivered

    def _deliver(self, op_id: str, document: dict[str, Any]) -> Done:
        """A status leaves for its caller: the candidates in it count as disclosed from now on."""
        self.discovery.mark_disclosed(op_id)
        return Done(document)

    async def _current_status(
        self, ref: OperationRef, *, after: int | None = None, wait_s: float = 0.0
    ) -> dict[str, Any]:
        """From the runtime while it holds the operation (after the long poll), else from a scan's durable
        record (CONTRACT §7 only), which will not change any more."""
        if ref.record is None:
            document = await self.runtimes[ref.kind].status(ref.operation_id, after=after, wait_s=wait_s)
            if document is not None:
                return document
        record = ref.record if ref.record is not None else await self.state.get_discovery(ref.operation_id)
        if record is None:
            raise unknown_operation()
        return status_from_durable(
            record.metadata, final_revision=record.final_revision, causal_context=record.causal_context
        )

    async def cancel(self, principal: authority.Principal, op_id: str) -> Done:
        """POST /v1/operations/{id}/cancel: the status after the request."""
        ref = await self.locate(principal, op_id)
        cancelled = await self.runtimes[ref.kind].cancel(op_id)
        # Ended and gone from the runtime: the unchanged status of its record.
        document = cancelled[1] if cancelled is not None else await self._current_status(ref)
        return self._deliver(op_id, document)

    # ---- the host's questions (it checks authority itself, against its own registry row) -------------------

    async def observe(self, op_id: str, kind: Kind) -> Observed | None:
        """Status and durable metadata, never candidates; None when the runtime does not hold the id."""
        return await self.runtimes[kind].observe(op_id)

    async def poll(
        self, op_id: str, kind: Kind, *, wait_seconds: float | None, after_revision: int | None
    ) -> dict[str, Any] | None:
        """The caller-private status, delivered (its candidates count as disclosed); None when unknown."""
        document = await self.runtimes[kind].status(
            op_id, after=after_revision, wait_s=clamp_wait(wait_seconds)
        )
        if document is not None:
            self._deliver(op_id, document)
        return document

    async def request_cancel(self, op_id: str, kind: Kind) -> tuple[bool, dict[str, Any]] | None:
        """Whether the cancel changed anything, and the delivered status after it; None when unknown."""
        cancelled = await self.runtimes[kind].cancel(op_id)
        if cancelled is not None:
            self._deliver(op_id, cancelled[1])
        return cancelled

    async def stop(self, op_id: str, kind: Kind, error_code: str) -> None:
        """End the work because its host ended the operation (expiry, response too large)."""
        await self.runtimes[kind].stop(op_id, error_code)

    async def select(self, principal: authority.Principal, op_id: str, body: Any) -> Done:
        """POST /v1/operations/{id}/selection: remember a candidate of a running snapshot (memory only)."""
        ref = await self.locate(principal, op_id)
        authority.require_grant(principal, ref.action_id, ref.transport)
        return self.bindings.select(op_id, body)

    async def bind(self, principal: authority.Principal, op_id: str, body: Any) -> Created:
        """POST /v1/operations/{id}/bindings: consume a candidate exactly once and reveal its address."""
        ref = await self.locate(principal, op_id)
        authority.require_grant(principal, ref.action_id, ref.transport)
        candidate_ref, key = bind_request(body)
        if not self.runtimes[ref.kind].bindable:
            raise SensoriumError("this operation has no candidates to bind", code=Code.NOT_BINDABLE)
        if self.discovery.session(op_id) is None:
            recorded = await self.bindings.recorded(principal, op_id, candidate_ref, key)
            if recorded is not None:
                return recorded  # CONTRACT §6.8: a keyed retry answers the same binding, after a restart too
            refuse_erased(Status((await self._current_status(ref))["status"]))
        return await self.bindings.bind(principal, op_id, candidate_ref, key)

    async def forget(self, principal: authority.Principal, binding_id: str) -> Gone:
        """DELETE /v1/bindings/{id}: erase a binding (the owner's own, or any for an operator)."""
        return await self.bindings.forget(principal, binding_id)

    async def list_bindings(self, principal: authority.Principal) -> Done:
        """GET /v1/bindings: the caller's own bindings with addresses, or every one for an operator."""
        return await self.bindings.listing(principal)

    def catalog_summary(self) -> dict[str, Any]:
        """GET /v1/catalog."""
        return self.catalog.summary()

    def revoke(self, operator: authority.Principal, principal_id: str, action_id: str | None) -> Done:
        """POST /v1/admin/principals/{id}/revoke (operators only)."""
        authority.require_operator(operator)
        lost = self._revoke_now(principal_id, action_id)
        return Done(revocation_answer(principal_id, action_id, lost))

    def _revoke_now(self, principal_id: str, action_id: str | None) -> frozenset[str]:
        try:
            return self.principals.revoke_now(principal_id, action_id)
        except SensoriumError as error:
            if error.code in (Code.UNKNOWN_PRINCIPAL, Code.UNKNOWN_GRANT):
                raise SensoriumError("no such principal or grant", code=Code.NOT_FOUND) from None
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


def _accepted(handle: Mapping[str, Any]) -> Accepted:
    """A `sensorium-connector-deferred.v1` handle, read at its `status_path`."""
    return Accepted(handle, handle["status_path"])


def _command_answer(answer: Mapping[str, Any]) -> Accepted | Done:
    """A command's answer: a deferred handle, or a sync result."""
    if answer.get("schema") == "sensorium-connector-deferred.v1":
        return _accepted(answer)
    return Done(answer)


def _uncount(counter: Counter[str], key: str) -> None:
    """One fewer under `key`; a key that reaches zero leaves the counter."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
