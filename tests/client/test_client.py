"""`connector.client`: typed documents, typed errors, long-poll watch, settled cancel, retries that join."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from connector import client as api
from connector.contract.models import (
    ConnectorDeferred,
    DeferredOperation,
    DeferredOperationStatusV2,
    DeviceBinding,
    DiscoveryProgress,
)
from providers.faults import ACK, Fault, StopStep
from tests.api.support import Harness, RecordingFactory, harness, straps
from tests.host import support as host_support
from tests.support.directives import scan_directive

# The client long-polls as a caller does, so the connector's windows run on the wall clock.
pytestmark = pytest.mark.realtime

BASE = "http://connector.test"


@asynccontextmanager
async def connected(
    h: Harness, who: str = "alice", transport: httpx.AsyncBaseTransport | None = None, **kw: object
) -> AsyncIterator[api.ConnectorClient]:
    """A client of the harness's app as `who`."""
    wire = transport or httpx.ASGITransport(app=h.assembled.app)
    async with api.ConnectorClient(BASE, h.tokens.get(who, who), transport=wire, **kw) as client:  # type: ignore[arg-type]
        yield client


def _progress(status: api.Status) -> DiscoveryProgress | None:
    return status.progress if isinstance(status, DeferredOperationStatusV2) else None


@pytest.mark.asyncio
async def test_a_scan_start_watch_bind_list_forget(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(3)), wall=True) as h, connected(h) as client:
        handle = await client.start(scan_directive(1))
        assert isinstance(handle.document, ConnectorDeferred)
        assert handle.status_path == f"/v1/operations/{handle.operation_id}"
        seen = [status async for status in client.watch(handle, wait_seconds=5)]
        assert all(isinstance(s, DeferredOperationStatusV2) for s in seen)
        assert [s.status for s in seen][-1] == "completed"
        assert all(s.status not in api.TERMINAL for s in seen[:-1])
        revisions = [
            s.progress.revision for s in seen if isinstance(s, DeferredOperationStatusV2) and s.progress
        ]
        assert revisions == sorted(revisions)
        final = seen[-1]
        assert isinstance(final, DeferredOperationStatusV2) and final.result is not None
        ref = final.result.candidates[0].candidate_ref
        binding = await client.bind(handle, ref, idempotency_key="bind-1")
        assert isinstance(binding, DeviceBinding) and binding.candidate_ref == ref
        assert await client.bind(handle, ref, idempotency_key="bind-1") == binding  # the same answer again
        listed = await client.bindings()
        assert [(b.binding_id, b.address, b.owner) for b in listed] == [
            (binding.binding_id, binding.address, None)
        ]
        await client.forget(binding.binding_id)
        assert await client.bindings() == []
        with pytest.raises(api.UnknownBindingError) as gone:
            await client.forget(binding.binding_id)
        assert gone.value.status_code == 404 and gone.value.code == "unknown-binding"


@pytest.mark.asyncio
async def test_select_a_running_candidate(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2)), wall=True) as h, connected(h) as client:
        handle = await client.start(scan_directive(20))
        async for status in client.watch(handle, wait_seconds=5):
            if (
                isinstance(status, DeferredOperationStatusV2)
                and status.progress
                and status.progress.snapshot.candidates
            ):
                await client.select(handle, status.progress.snapshot.candidates[0].candidate_ref)
                break
        with pytest.raises(api.UnknownCandidateError):
            await client.select(handle, "no-such-candidate")
        await client.cancel(handle)


@pytest.mark.asyncio
async def test_cancel_returns_only_once_settled(tmp_path: Path) -> None:
    slow_stop = Fault(stop_plan=(StopStep("ack", delay_ms=700), ACK))
    factory = RecordingFactory(straps(2), fault=slow_stop)
    async with harness(tmp_path, factory=factory, wall=True) as h, connected(h) as client:
        handle = await client.start(scan_directive(20))
        first = await h.post("alice", handle.status_path + "/cancel")  # what a bare POST answers
        assert first.json()["cancellation"]["state"] == "requested"
        settled = await client.cancel(handle, wait_seconds=5)
        assert isinstance(settled, DeferredOperationStatusV2) and settled.cancellation is not None
        assert settled.cancellation.state == "confirmed" and settled.status == "cancelled"


@pytest.mark.asyncio
async def test_refusals_are_typed_and_carry_no_input(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(1)), wall=True) as h, connected(h) as client:
        bogus = api.Handle(
            "deferred:sensorium.directive.invoke:" + "A" * 26,
            "/v1/operations/nope",
            None,
            1,
            ConnectorDeferred.model_construct(),  # type: ignore[call-arg]  # a handle no connector gave
        )
        with pytest.raises(api.UnknownOperationError):
            await client.status(bogus)
        with pytest.raises(api.InvalidDirectiveError) as invalid:
            await client.start({"schema": "sensorium-directive.v1", "action_id": "x"})
        assert invalid.value.diagnostics and all("message" in d for d in invalid.value.diagnostics)
        with pytest.raises(api.StatusV2RequiredError):
            await client.start(scan_directive(1, timing={"status_versions": [1]}))
        async with connected(h, "wrong-token") as stranger:
            with pytest.raises(api.UnauthenticatedError) as unauthenticated:
                await stranger.bindings()
        assert isinstance(unauthenticated.value, api.ConnectorError)
        assert set(api.ERRORS) >= {"transport-claimed", "too-many-operations", "not-cancelable", "internal"}


class _LosesFirstReply(httpx.AsyncBaseTransport):
    """Delivers the first `method` request to the app, then drops its reply as a broken connection would."""

    def __init__(self, inner: httpx.AsyncBaseTransport, method: str = "POST") -> None:
        self.inner = inner
        self.method = method
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == self.method:
            self.bodies.append(request.content)
            if len(self.bodies) == 1:
                raise httpx.ReadError("connection lost", request=request)
        return response


@pytest.mark.asyncio
async def test_a_lost_reply_is_retried_with_the_same_key_and_joins_the_work(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(2))
    async with harness(tmp_path, factory=factory, wall=True) as h:
        lossy = _LosesFirstReply(httpx.ASGITransport(app=h.assembled.app))
        sleeps: list[float] = []

        async def record(seconds: float) -> None:
            sleeps.append(seconds)

        async with connected(h, transport=lossy, sleep=record) as client:
            handle = await client.start(scan_directive(1))
            assert len(lossy.bodies) == 2 and lossy.bodies[0] == lossy.bodies[1]  # same key both times
            assert sleeps == [1]
            assert sum(p.start_calls for p in factory.built) == 1  # one session, joined by the retry
            async for _ in client.watch(handle, wait_seconds=5):
                pass


@pytest.mark.asyncio
async def test_forget_whose_reply_was_lost_succeeds_although_the_repeat_finds_nothing(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(1)), wall=True) as h, connected(h) as client:
        handle = await client.start(scan_directive(1))
        final = [status async for status in client.watch(handle, wait_seconds=5)][-1]
        assert isinstance(final, DeferredOperationStatusV2) and final.result is not None
        binding = await client.bind(handle, final.result.candidates[0].candidate_ref)
        lossy = _LosesFirstReply(httpx.ASGITransport(app=h.assembled.app), method="DELETE")

        async def no_wait(seconds: float) -> None:
            pass

        async with connected(h, transport=lossy, sleep=no_wait) as retrying:
            await retrying.forget(binding.binding_id)  # erased by the first DELETE, 404 to the repeat
            assert len(lossy.bodies) == 2
            assert await retrying.bindings() == []
            with pytest.raises(api.UnknownBindingError):  # no reply lost: still an error
                await retrying.forget(binding.binding_id)


def test_the_client_terminal_set_is_the_lifecycle_one() -> None:
    assert {"completed", "failed", "timed-out", "cancelled", "expired", "unknown"} == api.TERMINAL


class _BusyFirst(httpx.AsyncBaseTransport):
    """Answers the first `busy` requests 429 `too-many-operations` with Retry-After, as the server would."""

    def __init__(self, inner: httpx.AsyncBaseTransport, busy: int) -> None:
        self.inner, self.busy, self.calls = inner, busy, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.busy:
            body = {"schema": "sensorium-error.v1", "code": "too-many-operations", "message": "busy"}
            return httpx.Response(429, json=body, headers={"Retry-After": "7"})
        return await self.inner.handle_async_request(request)


@pytest.mark.asyncio
async def test_retry_after_is_honoured_then_surfaced(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(1)), wall=True) as h:
        sleeps: list[float] = []

        async def record(seconds: float) -> None:
            sleeps.append(seconds)

        inner = httpx.ASGITransport(app=h.assembled.app)
        async with connected(h, transport=_BusyFirst(inner, 2), sleep=record, max_attempts=3) as client:
            handle = await client.start(scan_directive(1))
            assert sleeps == [7, 7] and handle.operation_id
        sleeps.clear()
        async with connected(h, transport=_BusyFirst(inner, 5), sleep=record, max_attempts=2) as client:
            with pytest.raises(api.TooManyOperationsError) as busy:
                await client.start(scan_directive(1))
        assert busy.value.retry_after_seconds == 7 and sleeps == [7]


@pytest.mark.asyncio
async def test_through_the_reference_host(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = host_support.add_principals(data)
    async with host_support.host_app(data) as (assembled, _):
        wire = httpx.ASGITransport(app=assembled.app)
        async with api.ConnectorClient(
            BASE, tokens.alice, transport=wire, directives_path="/v1/host/directives"
        ) as client:
            handle = await client.start(scan_directive(1))
            assert isinstance(handle.document, DeferredOperation)
            assert handle.status_path == f"/v1/host/operations/{handle.operation_id}"
            final = [status async for status in client.watch(handle, wait_seconds=5)][-1]
            assert isinstance(final, DeferredOperationStatusV2) and final.status == "completed"
