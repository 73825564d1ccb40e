"""The Bus client against a scripted responder on a real broker: watch order, catch-up, reconnects."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from connector.bus.client import BusClient, BusRefused
from connector.bus.messages import Subjects, encode
from tests.bus.broker import NatsServer

SUBJECTS = Subjects.for_service("svc-test")
TOKEN = "test-token"


class ScriptedService:
    """Answers `op.get` from `self.envelope`; records the order of what it saw."""

    def __init__(self) -> None:
        self.envelope: dict[str, Any] = {"op": "job-1", "state": "unknown"}
        self.events: list[str] = []
        self.tokens: list[str | None] = []
        self.nc: NATS | None = None

    async def on_get(self, msg: Msg) -> None:
        self.tokens.append((msg.headers or {}).get("Authorization"))
        self.events.append(f"get:{self.envelope['state']}")
        await msg.respond(encode(self.envelope))

    async def announce(self, message: dict[str, Any]) -> None:
        assert self.nc is not None
        await self.nc.publish(SUBJECTS.done, encode(message))
        await self.nc.flush()


@asynccontextmanager
async def scripted(url: str) -> AsyncIterator[ScriptedService]:
    service = ScriptedService()
    nc = await nats.connect(url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
    service.nc = nc
    await nc.subscribe(SUBJECTS.get, cb=service.on_get)
    await nc.flush()
    try:
        yield service
    finally:
        await nc.close()


def _client(url: str, token: str | None = TOKEN) -> Any:
    return BusClient.connect(url, token=token, service="svc-test", timeout=1.0, reconnect_time_wait=0.1)


async def _collect(client: BusClient, op: str, sink: list[dict[str, Any]], **kw: Any) -> None:
    async for change in client.watch(op, **kw):
        sink.append(change)


@pytest.mark.asyncio
async def test_watch_subscribes_first_then_catches_up(broker: NatsServer) -> None:
    seen: list[dict[str, Any]] = []
    async with scripted(broker.url) as service, _client(broker.url) as client:
        service.envelope = {"op": "job-1", "state": "running", "operation/id": "op-A"}
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_collect, client, "job-1", seen)
                while not service.events:
                    await anyio.sleep(0.01)  # real peer: the scripted service answers over the nats-server
                # The catch-up op.get came after the subscription: an op.done sent now is not missed.
                await service.announce({"op": "job-1", "state": "done", "operation/id": "op-A"})
    assert [c["state"] for c in seen] == ["running", "done"]
    assert service.events == ["get:running"]  # our own op.done was taken as is, no second op.get
    assert service.tokens == [f"Bearer {TOKEN}"]


@pytest.mark.asyncio
async def test_an_announcement_of_another_operation_with_the_same_handle_is_checked(
    broker: NatsServer,
) -> None:
    seen: list[dict[str, Any]] = []
    async with scripted(broker.url) as service, _client(broker.url) as client:
        service.envelope = {"op": "job-1", "state": "queued", "operation/id": "op-A"}
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_collect, client, "job-1", seen)
                while len(service.events) < 1:
                    await anyio.sleep(0.01)  # real peer: the scripted service answers over the nats-server
                # Someone else's "job-1" ended: the watcher asks op.get and keeps waiting.
                await service.announce({"op": "job-1", "state": "failed", "operation/id": "op-OTHER"})
                while len(service.events) < 2:
                    await anyio.sleep(0.01)  # real peer: the scripted service answers over the nats-server
                service.envelope = {"op": "job-1", "state": "cancelled", "operation/id": "op-A"}
                await service.announce(service.envelope)
                await service.announce({"op": "job-2", "state": "done", "operation/id": "op-B"})
    assert [c["state"] for c in seen] == ["queued", "cancelled"]
    assert service.events == ["get:queued", "get:queued"]


@pytest.mark.asyncio
async def test_watch_polls_for_non_terminal_changes(broker: NatsServer) -> None:
    seen: list[dict[str, Any]] = []
    async with scripted(broker.url) as service, _client(broker.url) as client:
        service.envelope = {"op": "job-1", "state": "unknown"}
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _collect(client, "job-1", seen, poll_interval=0.05))
                for state in ("queued", "running", "done"):
                    while not seen or seen[-1]["state"] != service.envelope["state"]:
                        await anyio.sleep(0.01)  # real peer: the watcher hears the scripted service
                    service.envelope = {"op": "job-1", "state": state}
    assert [c["state"] for c in seen] == ["unknown", "queued", "running", "done"]


@pytest.mark.asyncio
async def test_watch_catches_up_after_a_broker_restart(broker: NatsServer) -> None:
    seen: list[dict[str, Any]] = []
    async with scripted(broker.url) as service, _client(broker.url) as client:
        service.envelope = {"op": "job-1", "state": "running", "operation/id": "op-A"}
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _collect(client, "job-1", seen, poll_interval=None))
                while not seen:
                    await anyio.sleep(0.01)  # real peer: the watcher hears the scripted service
                broker.kill()
                # The outcome arrives while the broker is gone: its op.done could never be delivered.
                service.envelope = {"op": "job-1", "state": "done", "operation/id": "op-A"}
                await anyio.to_thread.run_sync(broker.start)
    assert [c["state"] for c in seen] == ["running", "done"]
    assert service.events[-1] == "get:done"  # the reconnect led to an op.get, polling was off


@pytest.mark.asyncio
async def test_refusals_raise_with_the_code(broker: NatsServer) -> None:
    error = {"schema": "sensorium-error.v1", "code": "unauthenticated", "message": "no"}
    refused_reply = {"op": "job-1", "state": "unknown", "error": error}

    async def refuse(msg: Msg) -> None:
        await msg.respond(encode(refused_reply))

    async with scripted(broker.url) as service, _client(broker.url, token=None) as client:
        assert service.nc is not None
        service.envelope = refused_reply
        await service.nc.subscribe(SUBJECTS.cancel, cb=refuse)
        await service.nc.flush()
        await client.nc.flush()  # a later subscription is seen by an older connection after its round trip
        with pytest.raises(BusRefused) as refused:
            await client.cancel("job-1")
        assert refused.value.code == "unauthenticated" and refused.value.reply["state"] == "unknown"
        with anyio.fail_after(10), pytest.raises(BusRefused):
            async for _ in client.watch("job-1"):
                pass
    assert service.tokens == [None]


@pytest.mark.asyncio
async def test_start_sends_the_handle_and_the_directive(broker: NatsServer) -> None:
    received: list[Any] = []

    async def on_start(msg: Msg) -> None:
        received.append(json.loads(msg.data))
        await msg.respond(encode({"op": "job-7", "state": "queued"}))

    async with scripted(broker.url) as service, _client(broker.url) as client:
        assert service.nc is not None
        await service.nc.subscribe(SUBJECTS.start, cb=on_start)
        await service.nc.flush()
        await client.nc.flush()  # a later subscription is seen by an older connection after its round trip
        assert await client.start({"action_id": "a"}, op="job-7") == {"op": "job-7", "state": "queued"}
        await client.start({"action_id": "a"})
    assert received == [{"directive": {"action_id": "a"}, "op": "job-7"}, {"directive": {"action_id": "a"}}]
