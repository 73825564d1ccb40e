"""The Bus face of the connector (CONTRACT §10): `<svc>.op.start|get|cancel` on NATS, and `<svc>.op.done`.

Rules of this file:
- every request is authenticated once, from its `Authorization: Bearer <token>` header, and the principal
  re-checked against its current grant (CONTRACT §8); an operation this principal may not see answers exactly
  like one that never existed (`{op, state: "unknown"}`);
- the Bus talks to the host only (and reads the registry through `storage`);
- `op.start` goes through HOST admission, so the operation is in the durable registry before the reply;
  a caller-chosen `op` is the handle and the idempotency key: a retry joins the same work; the directive's
  schema, catalog and keyed id are checked once, by the host's `identify`, whose answer admission reuses;
- replies and announcements are built from the registry's durable record only (never a status with a
  snapshot), by `connector.bus.messages`;
- `op.done` goes out once per operation: the registry's terminal rows are the outbox, `AnnouncementStore`
  records what the broker acknowledged; operations that ended while the Bus was away (a broker outage, a
  restart: `lost`) are announced once it is connected again;
- logs carry counts and error types, never a handle, an id or a payload.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointConfig, Service, ServiceConfig

from connector.bus.messages import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_SERVICE,
    DurableRecord,
    StartRequest,
    Subjects,
    bearer_token,
    cancel_reply,
    done_message,
    encode,
    envelope,
    is_retained,
    parse_op,
    parse_start,
    peek_op,
    record_state,
    refusal,
    refusal_reply,
    state_reply,
    status_state,
    unknown_reply,
)
from connector.bus.node import (
    MICRO_NAME,
    BrokerAccess,
    NodeSubjects,
    admin_refusal,
    connect_options,
    micro_version,
    parse_cancel,
    parse_list,
)
from connector.core import authority
from connector.core.admission import Identified
from connector.core.clock import wall_clock
from connector.core.lifecycle import TERMINAL_STATUSES, BusState, Status, is_terminal
from connector.errors import AdmissionError, Code, SensoriumError
from connector.host.service import Cancelled
from connector.service.answers import Accepted, Done, public_refusal
from connector.storage.announcements import AnnouncementStore
from connector.storage.registry import DeferredRegistry, OperationRecord
from connector.storage.registry_reader import RegistryReader

_log = logging.getLogger("sensorium.bus")
SWEEP_LIMIT = 100_000
REPLY_CACHE_SIZE = 1024
Handler = Callable[[str | None, bytes], Awaitable[dict[str, Any] | bytes]]
Refuse = Callable[[bytes, SensoriumError], dict[str, Any]]
_Row = TypeVar("_Row", bound=DurableRecord)


class Incoming(Protocol):
    """A request as a plain subscription or a micro endpoint hands it over."""

    @property
    def headers(self) -> dict[str, str] | None: ...
    @property
    def data(self) -> bytes: ...
    async def respond(self, data: bytes) -> Any: ...


class HostFace(Protocol):
    """What the Bus needs of the reference host (`connector.host.service.HostService`)."""

    def authenticate(self, token: str | None) -> authority.Principal: ...

    def identify(
        self, principal: authority.Principal, directive: Any, *, bus_op: str | None
    ) -> Identified: ...

    async def admit(
        self,
        principal: authority.Principal,
        directive: Any,
        *,
        bus_op: str | None = None,
        identified: Identified | None = None,
    ) -> Accepted | Done: ...

    async def cancel_visible(self, record: OperationRecord) -> Cancelled: ...

    async def operator_list(
        self,
        operator: authority.Principal,
        status: str | None = None,
        *,
        after: str | None = None,
        limit: int = ...,
    ) -> Done: ...

    async def operator_cancel(self, operator: authority.Principal, op_id: str) -> Done: ...


@dataclass(frozen=True, slots=True)
class BusSettings:
    """How the connector meets the broker; everything but `url` has a default."""

    url: str
    service: str = DEFAULT_SERVICE
    retention_seconds: int = DEFAULT_RETENTION_SECONDS
    reconnect_time_wait: float = 1.0
    connect_timeout: float = 2.0
    flush_timeout: float = 2.0
    retry_seconds: float = 1.0
    max_concurrent_requests: int = 32
    # CONTRACT §15: a node of a lab registers the micro service under `<svc>.<node>.*`.
    node: str | None = None
    version: str = "0.0.0"
    metadata: Mapping[str, str] | None = None
    access: BrokerAccess = field(default_factory=BrokerAccess)

    @property
    def servers(self) -> list[str]:
        """The URLs of one NATS system (`--nats URL[,URL...]`)."""
        return [url.strip() for url in self.url.split(",")]

    @property
    def retention(self) -> timedelta:
        """How long `op.get` answers a terminal outcome."""
        return timedelta(seconds=self.retention_seconds)


class BusAdapter:
    """Connects (and reconnects) to NATS, answers the operation subjects, announces terminal states."""

    def __init__(
        self,
        settings: BusSettings,
        *,
        host: HostFace,
        registry: DeferredRegistry,
        data_dir: Path,
        on_subscribed: Callable[[], None] | None = None,
        clock: Callable[[], datetime] = wall_clock,
    ) -> None:
        self.settings = settings
        self.node_subjects = (
            None if settings.node is None else NodeSubjects.of(settings.service, settings.node)
        )
        self.subjects = (
            Subjects.for_service(settings.service) if self.node_subjects is None else self.node_subjects.ops
        )
        self.micro: Service | None = None
        self._host = host
        self._registry = registry
        self._data_dir = data_dir
        self._on_subscribed = on_subscribed
        self._clock = clock
        self.nc = NATS()
        self._store: AnnouncementStore | None = None
        self._reader: RegistryReader | None = None
        self._replies: dict[tuple[str, str], _CachedReply] = {}
        self._stack: AsyncExitStack | None = None
        self._task_group: TaskGroup | None = None
        self._requests = anyio.CapacityLimiter(settings.max_concurrent_requests)
        self._pending: dict[str, OperationRecord] = {}
        self._wakeup = anyio.Event()
        self._locks: dict[tuple[str, str], anyio.Lock] = {}
        self._subscriptions: list[Subscription] = []
        self._closing = False
        self.subscribed = anyio.Event()

    # ---- lifetime ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> BusAdapter:
        stack = AsyncExitStack()
        try:
            self._store = await stack.enter_async_context(await AnnouncementStore.open(self._data_dir))
            self._reader = self._registry.open_reader()
            if self._reader is not None:
                stack.callback(self._reader.close)
            stack.push_async_callback(self._close_connection)
            self._task_group = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._registry.add_terminal_listener(self._on_terminal))
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._task_group.start_soon(self._run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        self._closing = True
        await self._finish_requests()
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()
        if stack is not None:
            await stack.aclose()

    async def _finish_requests(self) -> None:
        """Stop taking requests, then give the ones in flight a bounded time to answer."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.settings.flush_timeout):
            for subscription in self._subscriptions:
                with contextlib.suppress(NatsError):  # not connected: nothing reaches us anyway
                    await subscription.unsubscribe()
            if self.micro is not None:
                with contextlib.suppress(NatsError, AssertionError):  # not connected or never started
                    await self.micro.stop()
            while self._requests.borrowed_tokens:
                await anyio.sleep(0.01)

    async def _close_connection(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.settings.flush_timeout):
            await self.nc.close()

    async def _run(self) -> None:
        """Connect (retrying forever), subscribe, then announce whatever is owed, for as long as we run."""
        await self.nc.connect(
            servers=self.settings.servers,
            name=f"{self.settings.service}-connector",
            reconnected_cb=self._on_reconnected,
            disconnected_cb=self._on_disconnected,
            error_cb=self._on_error,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=self.settings.reconnect_time_wait,  # type: ignore[arg-type]  # floats work
            connect_timeout=self.settings.connect_timeout,  # type: ignore[arg-type]
            **connect_options(self.settings.access),
        )
        if self.node_subjects is None:
            for subject, handler, inline in self._operation_handlers():
                callback = self._dispatcher(handler, inline=inline)
                self._subscriptions.append(await self.nc.subscribe(subject, cb=callback))
        else:
            await self._register_node(self.node_subjects)
        await self.nc.flush(timeout=self.settings.flush_timeout)  # type: ignore[arg-type]
        if self._on_subscribed is not None:
            self._on_subscribed()
        self.subscribed.set()
        _log.info("bus subscribed (service %s)", self.settings.service)
        await self._sweep()
        await self._announcer()

    def _operation_handlers(self) -> list[tuple[str, Handler, bool]]:
        """(subject, handler, answered inline) of the three §10 request subjects."""
        return [
            (self.subjects.start, self._start, False),
            (self.subjects.get, self._get, True),
            (self.subjects.cancel, self._cancel, False),
        ]

    async def _register_node(self, subjects: NodeSubjects) -> None:
        """The `sensorium-os` micro service: one endpoint per request subject, with the node's metadata."""
        config = ServiceConfig(
            name=MICRO_NAME,
            version=micro_version(self.settings.version),
            description="sensorium-os connector node",
            metadata=dict(self.settings.metadata or {}),
        )
        self.micro = await add_service(self.nc, config)
        ops = self._operation_handlers()
        handlers = [
            *((subject, handler, inline, _op_refusal) for subject, handler, inline in ops),
            (subjects.admin_list, self._admin_list, False, _admin_refusal),
            (subjects.admin_cancel, self._admin_cancel, False, _admin_refusal),
        ]
        for subject, handler, inline, refuse in handlers:
            name = subject.rsplit(".", 2)[-2] + "-" + subject.rsplit(".", 1)[-1]
            endpoint = EndpointConfig(
                name=name, subject=subject, handler=self._endpoint(handler, refuse, inline=inline)
            )
            await self.micro.add_endpoint(endpoint)

    def _endpoint(
        self, handler: Handler, refuse: Refuse, *, inline: bool
    ) -> Callable[[Request], Awaitable[None]]:
        async def on_request(request: Request) -> None:
            if self._task_group is None:
                return
            if inline:
                await self._answer(handler, request, refuse)
            else:
                self._task_group.start_soon(self._answer_limited, handler, request, refuse)

        return on_request

    async def _on_reconnected(self) -> None:
        _log.info("bus reconnected")
        self._wake()

    async def _on_disconnected(self) -> None:
        if not self._closing:
            _log.info("bus disconnected; reconnecting")

    async def _on_error(self, error: Exception) -> None:
        _log.debug("bus connection error: %s", type(error).__name__)

    # ---- requests ------------------------------------------------------------------------------------------

    def _dispatcher(self, handler: Handler, *, inline: bool) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            if not msg.reply or self._task_group is None:
                return
            if inline:
                # op.get never waits on work: answered in order on the subscription's own task.
                await self._answer(handler, msg, _op_refusal)
            else:
                # One task per request: a cancel that waits for a process must not hold up the others.
                self._task_group.start_soon(self._answer_limited, handler, msg, _op_refusal)

        return on_message

    async def _answer_limited(self, handler: Handler, msg: Incoming, refuse: Refuse) -> None:
        async with self._requests:
            await self._answer(handler, msg, refuse)

    async def _answer(self, handler: Handler, msg: Incoming, refuse: Refuse) -> None:
        try:
            reply = await handler(bearer_token(msg.headers), msg.data)
        except SensoriumError as error:
            reply = refuse(msg.data, error)
        except Exception as error:  # never let one request take the adapter down; never log data
            _log.error("bus request failed with %s", type(error).__name__)
            reply = refuse(msg.data, SensoriumError("internal error", code=Code.INTERNAL))
        with contextlib.suppress(NatsError):  # the broker went away: the caller retries or catches up
            await msg.respond(reply if isinstance(reply, bytes) else encode(reply))

    async def _get(self, token: str | None, data: bytes) -> dict[str, Any] | bytes:
        """`op.get {op}` -> `{op, state, ...durable metadata}`; `unknown` when not visible."""
        principal = self._host.authenticate(token)  # the request's one authentication, as on every subject
        op = parse_op(data)
        if self._reader is not None:
            try:
                return self._read_reply(principal, op)
            except sqlite3.Error as error:
                _log.warning("bus registry read failed with %s; using the registry", type(error).__name__)
        record = await self._visible(principal, op)
        return unknown_reply(op) if record is None else envelope(op, record, full=True)

    def _read_reply(self, principal: authority.Principal, op: str) -> dict[str, Any] | bytes:
        """The fast path: the row's version decides whether the encoded answer from last time still holds."""
        assert self._reader is not None
        key = (principal.principal_id, op)
        stamp = self._reader.stamp(*key)
        if stamp is None:
            return unknown_reply(op)
        cached = self._replies.pop(key, None)
        if cached is None or cached.stamp != stamp:
            record = self._reader.fetch(stamp[0])
            if record is None:
                return unknown_reply(op)
            cached = _CachedReply(stamp, record, encode(envelope(op, record, full=True)))
        self._replies[key] = cached  # most recently used last
        if len(self._replies) > REPLY_CACHE_SIZE:
            del self._replies[next(iter(self._replies))]
        # Authority and retention are decided afresh on every request, never cached.
        visible = self._may_see(principal, cached.record)
        if not visible or not is_retained(
            cached.record, now=self._clock(), retention=self.settings.retention
        ):
            return unknown_reply(op)
        return cached.body

    async def _start(self, token: str | None, data: bytes) -> dict[str, Any]:
        """`op.start {op?, directive}` -> `{op, state}` once the operation is in the registry."""
        principal = self._host.authenticate(token)
        request = parse_start(data)
        # Admission steps 2-3, the Bus's operations-only rule and the keyed id: once, for admission too.
        identified = self._host.identify(principal, request.directive, bus_op=request.op)
        if identified.key is None:
            return await self._admit(principal, request, identified)
        async with self._lock(principal.principal_id, identified.key):
            existing = await self._existing(principal, request, identified)
            if existing is None:
                return await self._admit(principal, request, identified)
            return await self._join(principal, request, existing, identified)

    async def _existing(
        self, principal: authority.Principal, request: StartRequest, identified: Identified
    ) -> OperationRecord | None:
        """The operation a keyed start names: by the caller's handle, else by the id its key derives."""
        if request.op is not None:
            found = await self._registry.find_by_bus_op(principal.principal_id, request.op)
            if found is not None:
                return found
        assert identified.keyed_id is not None  # a keyed start
        return await self._registry.get(identified.keyed_id)

    async def _join(
        self,
        principal: authority.Principal,
        request: StartRequest,
        existing: OperationRecord,
        identified: Identified,
    ) -> dict[str, Any]:
        """A retry with a known handle or key: the same work, never a second one."""
        op = request.op or existing.operation_id
        state, _ = record_state(existing)
        # A handle names one operation: not one of another action, nor one started without this handle
        # (an HTTP idempotency key equal to it derives the same id).
        another_action = existing.capability_id != identified.action.action_id
        if another_action or (request.op is not None and existing.bus_op != request.op):
            error = AdmissionError("this op handle names another operation", code=Code.IDEMPOTENCY_CONFLICT)
            return refusal(op, error, state=state)
        if is_terminal(Status(existing.status)) and self._may_see(principal, existing):
            # A finished operation is not admitted again (a restart forgot its scan fingerprint).
            return state_reply(op, state)
        return await self._admit(principal, request, identified, known_state=state)

    async def _admit(
        self,
        principal: authority.Principal,
        request: StartRequest,
        identified: Identified,
        *,
        known_state: BusState | None = None,
    ) -> dict[str, Any]:
        """Host admission; the reply's state is read back from the durable record."""
        try:
            answer = await self._host.admit(
                principal, request.directive, bus_op=request.op, identified=identified
            )
        except SensoriumError as error:
            return refusal(request.op, public_refusal(error), state=known_state or BusState.UNKNOWN)
        body = answer.handle if isinstance(answer, Accepted) else answer.document
        operation_id = body.get("operation/id")
        record = await self._registry.get(operation_id) if isinstance(operation_id, str) else None
        if record is None:
            # Only a deferred operation belongs on the Bus; a sync answer here would be a host bug.
            _log.error("bus start admitted without a durable record")
            raise SensoriumError("internal error", code=Code.INTERNAL)
        op = request.op or record.operation_id
        return state_reply(op, record_state(record)[0])

    async def _admin_list(self, token: str | None, data: bytes) -> dict[str, Any]:
        """`admin.list`: the page of the host's operator list the HTTP admin route answers (one builder)."""
        request = parse_list(data)
        operator = self._host.authenticate(token)  # after the request parsed, as on the HTTP admin routes
        options = {} if request.limit is None else {"limit": request.limit}
        listing = await self._host.operator_list(operator, request.status, after=request.after, **options)
        return dict(listing.document)

    async def _admin_cancel(self, token: str | None, data: bytes) -> dict[str, Any]:
        """`admin.cancel {operation/id}`: the HTTP admin cancel's document."""
        op_id = parse_cancel(data)
        operator = self._host.authenticate(token)
        return dict((await self._host.operator_cancel(operator, op_id)).document)

    async def _cancel(self, token: str | None, data: bytes) -> dict[str, Any]:
        """`op.cancel {op}` -> `{op, cancelled, state}`; `cancelled`: did this request change anything.

        One authority check and one registry read (under the handle's lock): the host cancels the row found.
        """
        principal = self._host.authenticate(token)
        op = parse_op(data)
        async with self._lock(principal.principal_id, op):
            record = await self._visible_row(principal, op)
            if record is None:
                return unknown_reply(op)
            try:
                cancelled = await self._host.cancel_visible(record)
            except SensoriumError as error:
                return refusal_reply(op, public_refusal(error), state=record_state(record)[0])
        return cancel_reply(op, cancelled=cancelled.changed, state=status_state(cancelled.answer.document))

    async def _visible(self, principal: authority.Principal, op: str) -> DurableRecord | None:
        """The principal's own retained operation under this handle (or operation id), if its grant holds."""
        return self._retained_for(principal, await self._lookup(principal.principal_id, op))

    async def _visible_row(self, principal: authority.Principal, op: str) -> OperationRecord | None:
        """As `_visible`, the whole registry row (what the host's cancel is handed)."""
        return self._retained_for(principal, await self._registry.find_for(principal.principal_id, op))

    def _retained_for(self, principal: authority.Principal, record: _Row | None) -> _Row | None:
        """The record if the principal may see it and it is still retained, else None."""
        if record is None or not self._may_see(principal, record):
            return None
        if not is_retained(record, now=self._clock(), retention=self.settings.retention):
            return None
        return record

    async def _lookup(self, owner: str, op: str) -> DurableRecord | None:
        """By Bus handle first, then by operation id: the fast read-only path, else the registry's API."""
        if self._reader is not None:
            try:
                return self._reader.find(owner, op)
            except sqlite3.Error as error:
                _log.warning("bus registry read failed with %s; using the registry", type(error).__name__)
        return await self._registry.find_for(owner, op)

    def _may_see(self, principal: authority.Principal, record: DurableRecord) -> bool:
        scope = record.metadata.get("scope")
        transport = scope.get("transport") if isinstance(scope, Mapping) else None
        return authority.may_see(
            principal, record.owner, record.capability_id, transport if isinstance(transport, str) else None
        )

    def _lock(self, principal_id: str, key: str) -> _KeyLock:
        return _KeyLock(self._locks, (principal_id, key))

    # ---- announcements -------------------------------------------------------------------------------------

    def _on_terminal(self, record: OperationRecord) -> None:
        """Registry terminal listener: queue the announcement (sent once connected)."""
        self._pending[record.operation_id] = record
        self._wake()

    def _wake(self) -> None:
        self._wakeup.set()

    async def _sweep(self) -> None:
        """Queue every retained terminal operation never announced (ended while the Bus was away)."""
        assert self._store is not None
        now = self._clock()
        await self._store.purge_before(now - self.settings.retention - timedelta(days=1))
        owed: list[OperationRecord] = []
        for status in sorted(TERMINAL_STATUSES):
            for record in await self._registry.list(status=status.value, limit=SWEEP_LIMIT):
                if is_retained(record, now=now, retention=self.settings.retention):
                    owed.append(record)
        announced = await self._store.published([r.operation_id for r in owed])
        for record in sorted(owed, key=lambda r: r.updated_at):
            if record.operation_id not in announced:
                self._pending.setdefault(record.operation_id, record)
        if self._pending:
            _log.info("bus owes %d op.done announcements", len(self._pending))
        self._wake()

    async def _announcer(self) -> None:
        """Send owed announcements while connected; retry after a pause or at the next reconnect."""
        while True:
            wait = self.settings.retry_seconds if self._pending else float("inf")
            with anyio.move_on_after(wait):
                await self._wakeup.wait()
            self._wakeup = anyio.Event()
            await self._announce_pending()

    async def _announce_pending(self) -> None:
        assert self._store is not None
        while self._pending and self.nc.is_connected:
            operation_id, record = next(iter(self._pending.items()))
            if not await self._store.is_published(operation_id):
                try:
                    await self.nc.publish(self.subjects.done, encode(done_message(record)))
                    await self.nc.flush(timeout=self.settings.flush_timeout)  # type: ignore[arg-type]
                except (NatsError, TimeoutError) as error:
                    _log.info("bus announcement deferred (%s)", type(error).__name__)
                    return
                await self._store.mark_published(operation_id, self._clock())
            self._pending.pop(operation_id, None)


def _op_refusal(data: bytes, error: SensoriumError) -> dict[str, Any]:
    """A refused operation request: `{op, state, error}` (CONTRACT §10)."""
    return refusal(peek_op(data), error)


def _admin_refusal(data: bytes, error: SensoriumError) -> dict[str, Any]:
    """A refused operator request: `{"error"}` only (CONTRACT §15)."""
    return admin_refusal(public_refusal(error))


@dataclass(frozen=True, slots=True)
class _CachedReply:
    """An encoded `op.get` answer and the row version it was built from (durable metadata only)."""

    stamp: tuple[str, int]
    record: DurableRecord
    body: bytes


class _KeyLock:
    """One `anyio.Lock` per key, dropped when nobody holds or waits for it."""

    def __init__(self, locks: dict[tuple[str, str], anyio.Lock], key: tuple[str, str]) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        lock = self._locks.setdefault(self._key, anyio.Lock())
        await lock.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lock = self._locks[self._key]
        lock.release()
        if not lock.locked() and lock.statistics().tasks_waiting == 0:
            del self._locks[self._key]
