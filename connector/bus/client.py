"""A small Bus client for sensorium-core-style callers: start, get, cancel, and watch one operation.

`watch` follows the Bus decision (seed 003): subscribe to `op.done` first, then `op.get` to catch up, and
`op.get` again after every reconnect (op.done is not retained and can be missed). A periodic `op.get`
also reports non-terminal changes (queued -> running), which `op.done` never carries.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import ConnectionReconnectingError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from connector.bus.messages import DEFAULT_SERVICE, Subjects, decode_reply, encode, is_bus_terminal
from connector.errors import Code, SensoriumError

DEFAULT_URL = "nats://127.0.0.1:4222"
RECONNECTED = "reconnected"
# Transport trouble that a later reconnect or retry can cure.
TRANSIENT = (NatsTimeout, NoRespondersError, ConnectionReconnectingError)

_Event = tuple[str, dict[str, Any] | None]


class BusRefused(SensoriumError):
    """The service refused a Bus request; `reply` is its `{op, state, error}` answer."""

    def __init__(self, reply: Mapping[str, Any]) -> None:
        error = reply.get("error")
        error = error if isinstance(error, Mapping) else {}
        super().__init__(str(error.get("message", "refused")), code=str(error.get("code", Code.INTERNAL)))
        self.reply = dict(reply)


class BusClient:
    """Requests with `Authorization: Bearer <token>` on `<service>.op.*` over one NATS connection."""

    def __init__(
        self,
        nc: NATS,
        *,
        token: str | None,
        service: str = DEFAULT_SERVICE,
        timeout: float = 5.0,
        retry_interval: float = 1.0,
    ) -> None:
        self.nc = nc
        self.subjects = Subjects.for_service(service)
        self._headers = {"Authorization": f"Bearer {token}"} if token else None
        self._timeout = timeout
        self._retry_interval = retry_interval
        self._watchers: set[MemoryObjectSendStream[_Event]] = set()

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        url: str = DEFAULT_URL,
        *,
        token: str | None,
        service: str = DEFAULT_SERVICE,
        timeout: float = 5.0,
        reconnect_time_wait: float = 0.5,
        connect_timeout: float = 2.0,
        max_reconnect_attempts: int = -1,
    ) -> AsyncIterator[BusClient]:
        """A client on its own connection, which reconnects on its own (forever by default)."""
        client = cls(NATS(), token=token, service=service, timeout=timeout)
        try:
            await client.nc.connect(
                url,
                reconnected_cb=client._on_reconnected,
                error_cb=_ignore_error,
                reconnect_time_wait=reconnect_time_wait,  # type: ignore[arg-type]  # nats-py accepts floats
                connect_timeout=connect_timeout,  # type: ignore[arg-type]
                max_reconnect_attempts=max_reconnect_attempts,
                allow_reconnect=True,
            )
            yield client
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(timeout):
                await client.nc.close()

    async def _on_reconnected(self) -> None:
        for watcher in list(self._watchers):
            # A full queue already holds events that lead to an op.get.
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                watcher.send_nowait((RECONNECTED, None))

    # ---- requests ------------------------------------------------------------------------------------------

    async def _request(self, subject: str, body: Mapping[str, Any]) -> dict[str, Any]:
        msg = await self.nc.request(subject, encode(body), timeout=self._timeout, headers=self._headers)
        reply = decode_reply(msg.data)
        if "error" in reply:
            raise BusRefused(reply)
        return reply

    async def start(self, directive: Mapping[str, Any], *, op: str | None = None) -> dict[str, Any]:
        """`op.start`: `{op, state}` at once; a given `op` makes a retry join the same work."""
        body: dict[str, Any] = {"directive": dict(directive)}
        if op is not None:
            body["op"] = op
        return await self._request(self.subjects.start, body)

    async def get(self, op: str) -> dict[str, Any]:
        """`op.get`: `{op, state, ...}` (durable metadata, never candidates)."""
        return await self._request(self.subjects.get, {"op": op})

    async def cancel(self, op: str) -> dict[str, Any]:
        """`op.cancel`: `{op, cancelled, state}`."""
        return await self._request(self.subjects.cancel, {"op": op})

    # ---- watching ------------------------------------------------------------------------------------------

    async def watch(self, op: str, *, poll_interval: float | None = 30.0) -> AsyncIterator[dict[str, Any]]:
        """Yield the envelope at each state change of `op` until a terminal one (the last yielded)."""
        send, receive = anyio.create_memory_object_stream[_Event](64)

        async def on_done(msg: Msg) -> None:
            body = _json_object(msg.data)
            if body is not None and body.get("op") == op:
                with contextlib.suppress(anyio.WouldBlock):  # 64 unread ones: the next op.get settles it
                    send.send_nowait(("done", body))

        subscription = await self.nc.subscribe(self.subjects.done, cb=on_done)
        self._watchers.add(send)
        try:
            await self.nc.flush(timeout=self._timeout)  # type: ignore[arg-type]  # the subscription is live before we catch up
            async for envelope in self._follow(op, receive, poll_interval):
                yield envelope
        finally:
            self._watchers.discard(send)
            send.close()
            receive.close()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                await subscription.unsubscribe()

    async def _follow(
        self, op: str, events: MemoryObjectReceiveStream[_Event], poll_interval: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        last_state: str | None = None
        operation_id: str | None = None
        event: _Event = (RECONNECTED, None)  # the first step is the catch-up op.get
        while True:
            envelope = await self._settle(op, event, operation_id)
            if envelope is not None:
                operation_id = envelope.get("operation/id", operation_id)
                if envelope["state"] != last_state:
                    last_state = envelope["state"]
                    yield envelope
                if is_bus_terminal(envelope["state"]):
                    return
            wait = poll_interval if envelope is not None else self._retry_interval
            event = await _next_event(events, wait)

    async def _settle(self, op: str, event: _Event, operation_id: str | None) -> dict[str, Any] | None:
        """What an event stands for: a trusted `op.done`, else a fresh `op.get` (None: unreachable)."""
        kind, body = event
        # Another principal may use the same handle: only an announcement of OUR operation is taken as is.
        if kind == "done" and body is not None and operation_id and body.get("operation/id") == operation_id:
            return body
        try:
            return await self.get(op)
        except TRANSIENT:
            return None


async def _next_event(events: MemoryObjectReceiveStream[_Event], wait: float | None) -> _Event:
    """The next announcement or reconnect; a poll tick (a plain op.get) when `wait` runs out."""
    with anyio.move_on_after(wait if wait is not None else float("inf")):
        return await events.receive()
    return ("poll", None)


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def _ignore_error(error: Exception) -> None:
    """nats-py reports each failed (re)connect attempt here; reconnecting is the answer, not a log line."""
