"""The fault and simulated providers' own behaviour, the provider registry, and transport claims."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path

import anyio
import pytest

from connector.core.scope import DiscoveryScope
from connector.errors import AdmissionError, ProviderRestarted, ProviderUnavailable, StopUnconfirmed
from connector.runtime.claims import ClaimRegistry, claim_key
from connector.timer import VirtualTimer, fail_at, sleep_ms
from providers.base import BaseSession, ObservationSink, StopOutcome, finish_cleanup
from providers.faults import ACK, HANG, RAISE, Fault, FaultProvider, FaultSession, StopStep
from providers.registry import build_provider
from providers.replay import FixtureError, ReplayProvider
from providers.simulated import SimulatedAdapter, SimulatedProvider
from tests.runtime.sessions import fast_manager, poll_to_end, start
from tests.runtime.support import RecordingSink, ble_scope, on_virtual_time, other_tasks, stranger, strap

# ---- fault provider --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_fault_provider_plays_filtered_and_records_calls() -> None:
    timer = VirtualTimer()
    provider = FaultProvider([(0, strap(1)), (10, stranger(2)), (20, strap(3))], timer=timer)
    sink = RecordingSink(timer)
    session = await provider.start(ble_scope(), sink)
    await timer.advance(60)
    await session.stop()
    await session.stop()
    assert sink.observed == [(0.0, strap(1)), (0.02, strap(3))]
    assert provider.calls == ["start", "stop", "stop-ack", "stop"]
    assert (provider.start_calls, provider.stop_calls, provider.acknowledged_stops) == (1, 2, 1)


@pytest.mark.asyncio
async def test_fault_provider_start_failure_and_mid_session_failure() -> None:
    refusing = FaultProvider(fault=Fault(start_error=ProviderUnavailable("no adapter")))
    with pytest.raises(ProviderUnavailable):
        await refusing.start(ble_scope(), RecordingSink())
    assert refusing.calls == ["start"]
    timer = VirtualTimer()
    failing = FaultProvider([(0, strap(1)), (100, strap(2))], fault=Fault(fail_at_ms=30), timer=timer)
    sink = RecordingSink(timer)
    session = await failing.start(ble_scope(), sink)
    await timer.advance(150)
    assert [obs for _, obs in sink.observed] == [strap(1)]
    assert len(sink.failures) == 1 and isinstance(sink.failures[0], ProviderRestarted)
    await session.stop()


@pytest.mark.asyncio
async def test_fault_provider_stop_plan_raise_hang_then_late_ack() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(fault=Fault(stop_plan=(RAISE, HANG, StopStep("ack", delay_ms=30))), timer=timer)
    session = await provider.start(ble_scope(), RecordingSink())
    with pytest.raises(StopUnconfirmed):
        await session.stop()

    async def give_up_after_50_ms() -> None:
        with fail_at(timer, timer.now_ms() + 50):
            await session.stop()

    hung_at = timer.now_ms()
    with pytest.raises(TimeoutError):
        await on_virtual_time(timer, give_up_after_50_ms)
    assert timer.now_ms() - hung_at == 50, "the hanging stop was cut by the caller, not by its own bound"
    started = timer.now_ms()
    assert await on_virtual_time(timer, session.stop) is StopOutcome.ACKNOWLEDGED
    assert timer.now_ms() - started == 30
    assert provider.acknowledged_stops == 1 and provider.stop_calls == 3
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_fault_provider_flood_skips_the_provider_filter() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(fault=Fault(flood=stranger, flood_count=600, stop_plan=(ACK,)), timer=timer)
    sink = RecordingSink()
    session = await provider.start(ble_scope(), sink)
    await timer.advance(50)
    await session.stop()
    assert len(sink.observed) == 600


# ---- registry --------------------------------------------------------------------------------------------


def test_registry_prefers_the_replay_fixture(fixtures_dir: Path) -> None:
    provider = build_provider("ble", replay=fixtures_dir / "ble-mixed-bench.jsonl", replay_speed=5.0)
    assert isinstance(provider, ReplayProvider)
    assert provider.capabilities.transport == "ble"


def test_registry_refuses_a_fixture_of_another_transport(fixtures_dir: Path) -> None:
    with pytest.raises(FixtureError, match="transport"):
        build_provider("usb-serial", replay=fixtures_dir / "ble-mixed-bench.jsonl")


@pytest.mark.parametrize(
    ("transport", "module_name", "class_name", "expected"),
    [
        ("ble", "providers.ble", "BleProvider", {"adapter": "hci1", "every_report": False}),
        ("usb-serial", "providers.serial", "SerialProvider", {}),
        ("mdns", "providers.mdns", "MdnsProvider", {"interfaces": ["127.0.0.1"]}),
    ],
)
def test_registry_builds_the_real_backend_with_its_options(
    monkeypatch: pytest.MonkeyPatch,
    transport: str,
    module_name: str,
    class_name: str,
    expected: dict[str, object],
) -> None:
    made: list[dict[str, object]] = []

    class Backend:
        def __init__(self, **options: object) -> None:
            made.append(options)

    fake = types.ModuleType(module_name)
    setattr(fake, class_name, Backend)
    monkeypatch.setitem(sys.modules, module_name, fake)
    provider = build_provider(transport, ble_adapter="hci1", mdns_interfaces=("127.0.0.1",))  # type: ignore[arg-type]
    assert isinstance(provider, Backend)
    assert made == [expected]


def test_registry_reports_a_missing_backend_as_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "providers.ble", None)
    with pytest.raises(ProviderUnavailable, match="provider not available") as refused:
        build_provider("ble")
    assert refused.value.code == "provider-unavailable"


# ---- claims ----------------------------------------------------------------------------------------------


def test_an_exclusive_claim_refuses_a_second_scan_with_retry_after() -> None:
    claims = ClaimRegistry()
    key = claim_key("ble", None)
    first = claims.acquire(key, operation_id="op-1", concurrent=False, now_ms=0, expected_release_ms=4_500)
    with pytest.raises(AdmissionError) as refused:
        claims.acquire(key, operation_id="op-2", concurrent=False, now_ms=1_000, expected_release_ms=9_000)
    assert refused.value.code == "transport-claimed"
    assert refused.value.retry_after_seconds == 4
    assert refused.value.http_status == 409
    other_adapter = claims.acquire(
        claim_key("ble", "hci1"), operation_id="op-3", concurrent=False, now_ms=0, expected_release_ms=1
    )
    assert other_adapter.exclusive
    claims.release(first)
    assert claims.holder(key) is None
    claims.acquire(key, operation_id="op-2", concurrent=False, now_ms=1_000, expected_release_ms=9_000)
    assert claims.holder(key) == "op-2"


def test_concurrent_backends_skip_the_claim_and_release_never_frees_another_holder() -> None:
    claims = ClaimRegistry()
    key = claim_key("mdns", None)
    shared = claims.acquire(key, operation_id="op-1", concurrent=True, now_ms=0, expected_release_ms=0)
    claims.acquire(key, operation_id="op-2", concurrent=True, now_ms=0, expected_release_ms=0)
    assert not shared.exclusive and claims.holder(key) is None
    claims.acquire(key, operation_id="op-3", concurrent=False, now_ms=0, expected_release_ms=0)
    claims.release(shared)
    assert claims.holder(key) == "op-3"
    assert claims.retry_after_seconds(key, now_ms=10) == 1


class _RaisingThenAcking(BaseSession):
    """A backend whose first stop attempt raises (a bug) and whose second acknowledges."""

    def __init__(self) -> None:
        super().__init__(ble_scope(), RecordingSink())
        self.attempts = 0

    async def _stop_backend(self) -> str | None:
        self.attempts += 1
        if self.attempts == 1:
            raise RuntimeError("backend bug")
        return None


@pytest.mark.asyncio
async def test_a_stop_attempt_that_raised_counts_as_a_refusal_and_a_new_one_starts() -> None:
    session = _RaisingThenAcking()
    with pytest.raises(StopUnconfirmed) as unconfirmed:
        await session.stop()
    assert list(unconfirmed.value.diagnostics) == [{"code": "provider-stop", "message": "backend-error"}]
    assert await session.stop() is StopOutcome.ACKNOWLEDGED
    assert session.attempts == 2


class _SlowToAnswer(BaseSession):
    """A backend whose stop attempt answers only after 300 ms (past the 200 ms cleanup bound)."""

    def __init__(self, timer: VirtualTimer, *, rejoin: bool) -> None:
        super().__init__(ble_scope(), RecordingSink(), timer)
        self.rejoin_stalled_attempt = rejoin
        self.attempts: list[int] = []

    async def _stop_backend(self) -> str | None:
        self.attempts.append(self._timer.now_ms())
        await sleep_ms(self._timer, 300)
        return None


@pytest.mark.asyncio
async def test_a_stop_after_a_stalled_attempt_joins_it_when_the_backend_may_still_answer() -> None:
    timer = VirtualTimer(start_ms=0)
    session = _SlowToAnswer(timer, rejoin=True)
    with pytest.raises(StopUnconfirmed) as unconfirmed:
        await on_virtual_time(timer, session.stop)
    assert timer.now_ms() == 200, "cut at the cleanup bound (no proof to wait for)"
    assert list(unconfirmed.value.diagnostics) == [{"code": "provider-stop", "message": "stop-timeout"}]
    assert await on_virtual_time(timer, session.stop) is StopOutcome.ACKNOWLEDGED
    assert timer.now_ms() == 300 and session.attempts == [0], "the first attempt's answer confirmed it"


@pytest.mark.asyncio
async def test_a_stop_after_a_stalled_attempt_starts_afresh_when_told_not_to_join() -> None:
    timer = VirtualTimer(start_ms=0)
    session = _SlowToAnswer(timer, rejoin=False)
    with pytest.raises(StopUnconfirmed):
        await on_virtual_time(timer, session.stop)
    with pytest.raises(StopUnconfirmed):
        await on_virtual_time(timer, session.stop)
    assert session.attempts == [0, 200] and timer.now_ms() == 400
    assert len(other_tasks()) == 1, "the dropped attempt was cancelled; only the second still runs"
    await timer.advance(100)  # the second attempt answers at 500, with nobody waiting for it
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_finish_cleanup_runs_to_its_end_through_a_cancel_and_raises_that_cancel_after() -> None:
    timer = VirtualTimer(start_ms=0)
    ended: list[str] = []

    async def cleanup() -> str:
        await sleep_ms(timer, 100)
        ended.append(f"cleanup at {timer.now_ms()}")
        return "closed"

    async def caller() -> None:
        try:
            await finish_cleanup(cleanup())
        finally:
            ended.append(f"caller left at {timer.now_ms()}")

    # A native cancel (asyncio.timeout, Task.cancel) reaches the caller at 10 ms.
    task = asyncio.ensure_future(caller())
    await timer.advance(10)
    task.cancel()
    await timer.advance(200)
    assert task.cancelled(), "the cancel was raised, not swallowed"
    assert ended == ["cleanup at 100", "caller left at 100"]
    # anyio's cancellation: the scope is cut at 10 ms; the cleanup still ends, and the cut takes effect at
    # the caller's next checkpoint (anyio's cancellation stays pending until then: it is not swallowed).
    ended.clear()
    cuts: list[anyio.CancelScope] = []

    async def cut_caller() -> None:
        with anyio.CancelScope() as cut:
            cuts.append(cut)
            await caller()
            await anyio.lowlevel.checkpoint()
            ended.append("not cut")

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(cut_caller)
        await timer.advance(10)
        cuts[0].cancel()
        await timer.advance(200)
    assert ended == ["cleanup at 310", "caller left at 310"] and cuts[0].cancelled_caught
    assert await on_virtual_time(timer, lambda: finish_cleanup(cleanup())) == "closed"


class _ResolvingProvider(FaultProvider):
    """A provider whose default adapter changes between lookups (as a hot-plugged one can)."""

    def __init__(self, timer: VirtualTimer) -> None:
        super().__init__(fault=Fault(stop_plan=(ACK,)), timer=timer)
        self.defaults = iter(["hci1", "hci0"])
        self.started_on: list[str | None] = []

    async def resolve_adapter(self, scope: DiscoveryScope) -> str | None:
        return scope.adapter or next(self.defaults)

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> FaultSession:
        self.started_on.append(scope.adapter)
        return await super().start(scope, sink)


@pytest.mark.asyncio
async def test_the_session_starts_on_the_adapter_its_claim_is_keyed_by() -> None:
    timer = VirtualTimer()
    provider = _ResolvingProvider(timer)
    async with fast_manager(timer) as manager:
        handle = await start(manager, provider, window_ms=50, timer=timer)
        assert manager.claims.holder(claim_key("ble", "hci1")) == handle.operation_id
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
    assert provider.started_on == ["hci1"]
    assert polls[-1]["status"] == "completed"
    assert handle.scope.adapter is None  # the session's metadata keeps the scope as it was asked


# ---- simulated provider ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_simulated_adapter_repeats_each_device_at_its_interval_on_the_timer() -> None:
    timer = VirtualTimer()
    adapter = SimulatedAdapter("ble", lambda: "sim-1", timer)
    adapter.put(strap(1), interval_ms=1_000)
    sink = RecordingSink(timer)
    session = await SimulatedProvider(adapter).start(ble_scope(), sink)
    await timer.advance(3_500)
    assert sink.observed == [(0.0, strap(1)), (1.0, strap(1)), (2.0, strap(1)), (3.0, strap(1))]
    adapter.put(strap(1, rssi=-70), interval_ms=1_000)  # an update is seen at once, then at the interval
    await timer.advance(1_000)
    assert sink.observed[4:] == [(3.5, strap(1, rssi=-70)), (4.5, strap(1, rssi=-70))]
    assert await session.stop() is StopOutcome.ACKNOWLEDGED
    assert adapter.session_count == 0
    await timer.advance(5_000)
    assert len(sink.observed) == 6
