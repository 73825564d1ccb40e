"""Selections and bindings (CONTRACT §6.8, 9): what a caller picked from a snapshot, and what it consumed.

Rules of this file:
- a selection and a bind answer live in memory only; the durable binding row (`ConnectorState`) is the only
  place an address is stored, and a forgotten binding takes its in-memory answer with it;
- a candidate is bound at most once, decided before any await, so concurrent binds see it at once;
- a bind idempotency key answers its first binding again (for the same candidate, while the binding exists),
  also once the session left memory: the binding row is found by a keyed digest of the retry;
- when the runtime lets a session go (or its owner loses the grant), its books go with it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn

import anyio

from connector.core import authority
from connector.core.clock import to_ms
from connector.core.endings import CleanupState
from connector.core.ids import bind_replay_digest, opaque_id
from connector.core.lifecycle import Status, is_terminal
from connector.errors import AdmissionError, Code, SensoriumError, unknown_operation
from connector.runtime.manager import DiscoveryManager
from connector.service.answers import Created, Done, Gone
from connector.storage.state import Binding, ConnectorState

BIND_RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True, slots=True)
class _Bound:
    """The first answer to one bind idempotency key (memory only; dropped when the binding is forgotten)."""

    candidate_ref: str
    binding_id: str
    answer: Created


@dataclass(slots=True)
class _Book:
    """Per-operation consumption and idempotent bind answers (memory only)."""

    consumed: set[str] = field(default_factory=set)
    by_key: dict[str, _Bound] = field(default_factory=dict)
    # Keys whose first bind is being stored right now: a concurrent retry waits for its answer.
    pending: dict[str, anyio.Event] = field(default_factory=dict)


class Bindings:
    """Selections and bindings of discovery candidates, for principals the service already authorised."""

    def __init__(
        self,
        *,
        state: ConnectorState,
        discovery: DiscoveryManager,
        clock: Callable[[], datetime],
        entropy: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self._state = state
        self._discovery = discovery
        self._clock = clock
        self._entropy = entropy
        self._selections: dict[str, set[str]] = {}
        self._books: dict[str, _Book] = {}
        self._bound_keys: dict[str, tuple[str, str]] = {}
        self._secret: bytes | None = None

    def select(self, op_id: str, body: Any) -> Done:
        """Remember a candidate of a running snapshot."""
        candidate_ref = _body_string(body, "candidate/ref", allowed={"candidate/ref"})
        session = self._discovery.session(op_id)
        if session is None or session.table.candidate_document(candidate_ref) is None:
            raise SensoriumError("unknown candidate", code=Code.UNKNOWN_CANDIDATE)
        self._selections.setdefault(op_id, set()).add(candidate_ref)
        return Done({"operation/id": op_id, "candidate/ref": candidate_ref, "selected": True})

    async def bind(self, principal: authority.Principal, op_id: str, candidate_ref: str, key: str) -> Created:
        """Consume a candidate of a session the runtime holds, exactly once, and reveal its address."""
        digest = await self._replay_digest(principal, op_id, key)  # before the book's checks
        book = self._books.setdefault(op_id, _Book())
        while (pending := book.pending.get(key)) is not None:
            await pending.wait()
        earlier = book.by_key.get(key)
        if earlier is not None:
            return await self._replay(earlier, candidate_ref)
        now = self._clock()
        document, target = self._bindable(op_id, candidate_ref, book, now)
        book.consumed.add(candidate_ref)  # before any await: concurrent binds see it at once
        stored = anyio.Event()
        book.pending[key] = stored
        binding = Binding(opaque_id(self._entropy(16)), principal.principal_id, target[0], target[1], now)
        try:
            await self._state.insert_binding(binding, digest)
            answer = Created(_binding_document(binding, op_id, candidate_ref, document))
            book.by_key[key] = _Bound(candidate_ref, binding.binding_id, answer)
            self._bound_keys[binding.binding_id] = (op_id, key)
        except BaseException:
            book.consumed.discard(candidate_ref)
            raise
        finally:
            del book.pending[key]
            stored.set()
        return answer

    def _bindable(
        self, op_id: str, candidate_ref: str, book: _Book, now: datetime
    ) -> tuple[dict[str, Any], tuple[str, str]]:
        """The candidate's document and (transport, address), once every CONTRACT §6.8 check passed."""
        session = self._discovery.session(op_id)
        if session is None:
            raise unknown_operation()
        confirmed = session.is_terminal and session.cleanup_state is CleanupState.CONFIRMED
        check_bindable(session.status, confirmed)
        document = session.table.candidate_document(candidate_ref)
        target = session.table.binding_target(candidate_ref)
        if document is None or target is None:
            raise SensoriumError("unknown candidate", code=Code.UNKNOWN_CANDIDATE)
        expires_ms = session.table.candidate_expires_at_ms(candidate_ref)
        if expires_ms is not None and expires_ms <= to_ms(now):
            raise SensoriumError("the candidate expired", code=Code.CANDIDATE_EXPIRED)
        if candidate_ref in book.consumed:
            raise SensoriumError("the candidate was already bound", code=Code.CANDIDATE_CONSUMED)
        return document, target

    async def recorded(
        self, principal: authority.Principal, op_id: str, candidate_ref: str, key: str
    ) -> Created | None:
        """A keyed retry of a bind whose session is gone (a restart, retention): its stored binding again.

        Only what the binding row keeps is answered (no label or details: those were candidate data).
        """
        digest = await self._replay_digest(principal, op_id, key)
        binding = await self._state.replayed_binding(digest)
        if binding is None or binding.owner != principal.principal_id:
            return None
        return Created(_binding_document(binding, op_id, candidate_ref, {}))

    async def _replay_digest(self, principal: authority.Principal, op_id: str, key: str) -> str:
        if self._secret is None:
            self._secret = await self._state.replay_secret()
        return bind_replay_digest(
            self._secret,
            principal_id=principal.principal_id,
            operation_id=op_id,
            idempotency_key=key,
        )

    async def _replay(self, earlier: _Bound, candidate_ref: str) -> Created:
        """The first answer again, unless the key was used for another candidate or the binding is gone."""
        if earlier.candidate_ref != candidate_ref:
            raise SensoriumError(
                "idempotency key reused for another candidate", code=Code.IDEMPOTENCY_CONFLICT
            )
        if await self._state.get_binding(earlier.binding_id) is None:
            raise SensoriumError("the candidate was already bound", code=Code.CANDIDATE_CONSUMED)
        return earlier.answer

    async def forget(self, principal: authority.Principal, binding_id: str) -> Gone:
        """Erase a binding (the owner's own, or any for an operator) and its in-memory answer."""
        binding = await self._state.get_binding(binding_id)
        if binding is None or not authority.may_forget_binding(principal, binding.owner):
            raise SensoriumError("unknown binding", code=Code.UNKNOWN_BINDING)
        if not await self._state.delete_binding(binding_id):
            raise SensoriumError("unknown binding", code=Code.UNKNOWN_BINDING)  # a concurrent forget won
        located = self._bound_keys.pop(binding_id, None)
        book = None if located is None else self._books.get(located[0])
        if located is not None and book is not None:
            book.by_key.pop(located[1], None)
        return Gone()

    async def listing(self, principal: authority.Principal) -> Done:
        """Its own bindings with `address` for a caller; every binding with `owner` for an operator."""
        if principal.role == "operator":
            every = await self._state.list_bindings(None)
            return Done({"bindings": [_operator_entry(b) for b in every]})
        own = await self._state.list_bindings(principal.principal_id)
        return Done({"bindings": [_caller_entry(b) for b in own]})

    def drop(self, op_id: str) -> None:
        """The operation's selections and bind answers (which hold addresses) go."""
        self._selections.pop(op_id, None)
        book = self._books.pop(op_id, None)
        for bound in () if book is None else book.by_key.values():
            self._bound_keys.pop(bound.binding_id, None)


def check_bindable(status: Status, termination_confirmed: bool) -> None:
    """Binding needs a completed session whose provider stop was acknowledged."""
    if is_terminal(status) and status is not Status.COMPLETED:
        raise SensoriumError("this session is not bindable", code=Code.NOT_BINDABLE)
    if not termination_confirmed:
        raise SensoriumError(
            "the session has not terminated yet",
            code=Code.SESSION_NOT_TERMINATED,
            retry_after_seconds=BIND_RETRY_AFTER_SECONDS,
        )


def refuse_erased(status: Status) -> NoReturn:
    """A session the runtime let go: not bindable unless it completed, and its candidates are gone."""
    check_bindable(status, True)
    raise SensoriumError("unknown candidate", code=Code.UNKNOWN_CANDIDATE)


def bind_request(body: Any) -> tuple[str, str]:
    """The `candidate/ref` and `idempotency_key` of a bind request body."""
    allowed = {"candidate/ref", "idempotency_key"}
    return _body_string(body, "candidate/ref", allowed=allowed), _body_string(
        body, "idempotency_key", allowed=allowed
    )


def _body_string(body: Any, name: str, *, allowed: set[str]) -> str:
    """A required string field of a small closed request body."""
    if not isinstance(body, dict) or set(body) - allowed:
        raise AdmissionError(
            "the request body has unknown fields",
            code=Code.INVALID_INPUT,
            diagnostics=[{"code": Code.INVALID_INPUT, "message": "/: closed-object"}],
        )
    value = body.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise AdmissionError(
            "a required field is missing or malformed",
            code=Code.INVALID_INPUT,
            diagnostics=[{"code": Code.INVALID_INPUT, "message": f"/{name}: required-string"}],
        )
    return value


def _binding_document(
    binding: Binding, op_id: str, candidate_ref: str, candidate: Mapping[str, Any]
) -> dict[str, Any]:
    """The `sensorium-device-binding.v1`: the only document that reveals the address."""
    document: dict[str, Any] = {
        "schema": "sensorium-device-binding.v1",
        "binding/id": binding.binding_id,
        "operation/id": op_id,
        "candidate/ref": candidate_ref,
        "transport": binding.transport,
        "bound_at": binding.bound_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "address": binding.address,
    }
    for key in ("label", "ble", "usb", "mdns"):
        if key in candidate:
            document[key] = candidate[key]
    return document


def _common(binding: Binding) -> dict[str, Any]:
    return {
        "binding/id": binding.binding_id,
        "transport": binding.transport,
        "bound_at": binding.bound_at.strftime("%Y-%m-%dT%H:%M:%SZ"),  # as on the binding itself
    }


def _caller_entry(binding: Binding) -> dict[str, Any]:
    return {**_common(binding), "address": binding.address}


def _operator_entry(binding: Binding) -> dict[str, Any]:
    # An operator manages bindings (and may forget any) but never learns a device's address.
    return {**_common(binding), "owner": binding.owner}
