"""The mDNS provider against real python-zeroconf: a second engine on 127.0.0.1 plays the devices."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from mdns_peer import LOOPBACK, RecordingSink, Responder, run_instance, run_service_type
from zeroconf.asyncio import AsyncServiceBrowser

from connector.core.observations import MdnsObservation
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.errors import ProviderError, StopUnconfirmed
from providers import mdns as mdns_module
from providers.mdns import MdnsProvider

PRINTERS = run_service_type("prn")
SENSORS = run_service_type("sns")


def mdns_scope(
    *types: str,
    instance_prefix: str | None = None,
    exclude_prefix: str | None = None,
    cleanup_timeout_ms: int = 2000,
) -> DiscoveryScope:
    """An admitted mDNS scope for the given service types."""
    exclusions = None if exclude_prefix is None else ScopeFilter(instance_prefix=exclude_prefix)
    return DiscoveryScope(
        transport="mdns",
        window_seconds=10,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(service_types=types, instance_prefix=instance_prefix),
        exclusions=exclusions,
        cleanup_timeout_ms=cleanup_timeout_ms,
    )


def named(name: str, event: str | None = None) -> Callable[[MdnsObservation], bool]:
    """Predicate: an observation of instance `name` (and `event`, when given)."""

    def check(o: MdnsObservation) -> bool:
        return o.name.startswith(f"{name}.") and (event is None or o.event == event)

    return check


def pending_resolutions() -> list[asyncio.Task[object]]:
    """Resolution tasks of any mDNS session that have not finished."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and "MdnsSession._resolve" in getattr(t.get_coro(), "__qualname__", "")
    ]


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[MdnsProvider]:
    """A provider pinned to loopback; its shared engine is closed after the test."""
    mdns = MdnsProvider(interfaces=[LOOPBACK])
    try:
        yield mdns
    finally:
        await mdns.aclose()


@pytest_asyncio.fixture
async def responder() -> AsyncIterator[Responder]:
    """The device side: a second engine on loopback."""
    async with Responder() as peer:
        yield peer


def test_capabilities_declare_service_type_filtering_and_concurrency() -> None:
    caps = MdnsProvider(interfaces=[LOOPBACK]).capabilities
    assert caps.transport == "mdns"
    assert caps.backend_filters == frozenset({"service_types"})
    assert caps.concurrent_sessions is True


@pytest.mark.parametrize("interfaces", [["not-an-address"], ["::1"], []])
def test_interfaces_must_be_ipv4_addresses_and_are_not_echoed(interfaces: list[str]) -> None:
    with pytest.raises(ValueError) as refused:
        MdnsProvider(interfaces=interfaces)
    assert "not-an-address" not in str(refused.value)
    assert "::1" not in str(refused.value)


@pytest.mark.asyncio
async def test_start_refuses_a_scope_of_another_transport_or_without_service_types(
    provider: MdnsProvider,
) -> None:
    usb = DiscoveryScope("usb-serial", 5, 64, 65536, ScopeFilter(vid_pid=((0x0403, 0x6001),)))
    with pytest.raises(ProviderError):
        await provider.start(usb, RecordingSink())
    with pytest.raises(ProviderError):
        await provider.start(mdns_scope(), RecordingSink())


@pytest.mark.asyncio
async def test_discovers_a_registered_service_with_its_resolved_details(
    provider: MdnsProvider, responder: Responder
) -> None:
    instance = run_instance("hall-printer")
    await responder.register(PRINTERS, instance, {"model": "lab", "fw": "1.2.3"}, port=8631)
    sink = RecordingSink()
    session = await provider.start(mdns_scope(PRINTERS), sink)
    try:
        seen = await sink.wait_for(named(instance))
    finally:
        await session.stop()
    assert seen.event == "add"
    assert seen.service_type == PRINTERS
    assert seen.name == f"{instance}.{PRINTERS}"
    assert seen.server == f"{instance}.local."
    assert seen.addresses == (LOOPBACK,)
    assert seen.port == 8631
    assert dict(seen.txt) == {"model": "lab", "fw": "1.2.3"}
    assert seen.ttl is not None and seen.ttl > 0
    assert sink.failures == []


@pytest.mark.asyncio
async def test_reports_a_service_registered_during_the_window(
    provider: MdnsProvider, responder: Responder
) -> None:
    sink = RecordingSink()
    session = await provider.start(mdns_scope(SENSORS), sink)
    try:
        await asyncio.sleep(0.2)
        instance = run_instance("late-sensor")
        await responder.register(SENSORS, instance, {"kind": "co2"})
        seen = await sink.wait_for(named(instance))
    finally:
        await session.stop()
    assert seen.event == "add"
    assert dict(seen.txt) == {"kind": "co2"}


@pytest.mark.asyncio
async def test_txt_change_during_the_window_is_an_update(
    provider: MdnsProvider, responder: Responder
) -> None:
    instance = run_instance("thermo")
    info = await responder.register(SENSORS, instance, {"fw": "1.0"})
    sink = RecordingSink()
    session = await provider.start(mdns_scope(SENSORS), sink)
    try:
        await sink.wait_for(named(instance, "add"))
        await responder.update(info, {"fw": "2.0", "state": "ok"})
        updated = await sink.wait_for(named(instance, "update"))
    finally:
        await session.stop()
    assert dict(updated.txt) == {"fw": "2.0", "state": "ok"}
    assert updated.addresses == (LOOPBACK,)
    events = [o.event for o in sink.mdns if named(instance)(o)]
    assert events[0] == "add"
    assert events.count("add") == 1


@pytest.mark.asyncio
async def test_withdrawn_service_is_a_remove(provider: MdnsProvider, responder: Responder) -> None:
    instance = run_instance("leaving")
    info = await responder.register(SENSORS, instance, {"fw": "1.0"})
    sink = RecordingSink()
    session = await provider.start(mdns_scope(SENSORS), sink)
    try:
        await sink.wait_for(named(instance, "add"))
        await responder.unregister(info)
        removed = await sink.wait_for(named(instance, "remove"))
    finally:
        await session.stop()
    assert removed.service_type == SENSORS
    assert removed.ttl is None


@pytest.mark.asyncio
async def test_another_service_type_never_reaches_the_sink(
    provider: MdnsProvider, responder: Responder
) -> None:
    printer, sensor = run_instance("scoped-printer"), run_instance("scoped-sensor")
    await responder.register(PRINTERS, printer, {"k": "v"})
    await responder.register(SENSORS, sensor, {"k": "v"})
    printers, sensors = RecordingSink(), RecordingSink()
    printer_session = await provider.start(mdns_scope(PRINTERS), printers)
    sensor_session = await provider.start(mdns_scope(SENSORS), sensors)
    try:
        # The sensor session proves the sensor was on the wire while the printer session was browsing.
        await sensors.wait_for(named(sensor))
        await printers.wait_for(named(printer))
        await asyncio.sleep(0.5)
    finally:
        await printer_session.stop()
        await sensor_session.stop()
    assert {o.service_type for o in printers.mdns} == {PRINTERS}
    assert {o.service_type for o in sensors.mdns} == {SENSORS}


@pytest.mark.asyncio
async def test_instance_prefix_filter_and_exclusion(provider: MdnsProvider, responder: Responder) -> None:
    alpha, beta = run_instance("alpha"), run_instance("beta")
    await responder.register(SENSORS, alpha, {"k": "a"})
    await responder.register(SENSORS, beta, {"k": "b"})
    everything, only_alpha, not_alpha = RecordingSink(), RecordingSink(), RecordingSink()
    sessions = [
        await provider.start(mdns_scope(SENSORS), everything),
        await provider.start(mdns_scope(SENSORS, instance_prefix=alpha), only_alpha),
        await provider.start(mdns_scope(SENSORS, exclude_prefix=alpha), not_alpha),
    ]
    try:
        await everything.wait_for(named(alpha))
        await everything.wait_for(named(beta))
        await only_alpha.wait_for(named(alpha))
        await not_alpha.wait_for(named(beta))
        await asyncio.sleep(0.5)
    finally:
        for session in sessions:
            await session.stop()
    ours = (alpha, beta)
    assert {o.name for o in only_alpha.mdns} == {f"{alpha}.{SENSORS}"}
    assert not any(named(alpha)(o) for o in not_alpha.mdns)
    assert {o.name for o in everything.mdns if o.name.split(".")[0] in ours} == {
        f"{alpha}.{SENSORS}",
        f"{beta}.{SENSORS}",
    }


@pytest.mark.asyncio
async def test_reports_the_shortest_record_ttl(provider: MdnsProvider, responder: Responder) -> None:
    short, default = run_instance("short-ttl"), run_instance("default-ttl")
    await responder.register(SENSORS, short, {"k": "v"}, ttl=4)
    await responder.register(SENSORS, default, {"k": "v"})
    sink = RecordingSink()
    session = await provider.start(mdns_scope(SENSORS), sink)
    try:
        short_seen = await sink.wait_for(named(short))
        default_seen = await sink.wait_for(named(default))
    finally:
        await session.stop()
    assert short_seen.ttl is not None and 1 <= short_seen.ttl <= 4
    # zeroconf's default TTLs: 120 s for host records (SRV, A), 4500 s for PTR and TXT.
    assert default_seen.ttl is not None and 100 < default_seen.ttl <= 120


@pytest.mark.asyncio
async def test_instance_that_does_not_resolve_in_time_is_reported_with_what_is_known(
    responder: Responder,
) -> None:
    provider = MdnsProvider(interfaces=[LOOPBACK], resolve_timeout_ms=300)
    try:
        instance = run_instance("half-known")
        await responder.register(PRINTERS, instance, {"fw": "9"}, port=9100, with_address=False)
        sink = RecordingSink()
        session = await provider.start(mdns_scope(PRINTERS), sink)
        seen = await sink.wait_for(named(instance))
        await session.stop()
    finally:
        await provider.aclose()
    assert seen.event == "add"
    assert seen.addresses == ()
    assert (seen.port, dict(seen.txt)) == (9100, {"fw": "9"})
    assert sink.failures == []


@pytest.mark.asyncio
async def test_stop_waits_for_pending_resolutions_and_silences_the_session(responder: Responder) -> None:
    provider = MdnsProvider(interfaces=[LOOPBACK], resolve_timeout_ms=10_000)
    try:
        # Without an address record the instance never resolves, so its resolution stays pending.
        unresolvable = run_instance("no-address")
        await responder.register(PRINTERS, unresolvable, {"k": "v"}, with_address=False)
        sink = RecordingSink()
        session = await provider.start(mdns_scope(PRINTERS), sink)
        async with asyncio.timeout(5):
            while not pending_resolutions():
                await asyncio.sleep(0.02)
        started = time.monotonic()
        await session.stop()
        assert time.monotonic() - started < 1.0
        assert pending_resolutions() == []
        await session.stop()  # idempotent
        await responder.register(PRINTERS, run_instance("after-stop"), {"k": "v"})
        await asyncio.sleep(0.5)
        assert sink.observations == []
        assert sink.failures == []
    finally:
        await provider.aclose()


@pytest.mark.asyncio
async def test_stop_unconfirmed_when_the_browser_does_not_acknowledge(
    provider: MdnsProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await provider.start(mdns_scope(SENSORS, cleanup_timeout_ms=200), RecordingSink())
    real_cancel = AsyncServiceBrowser.async_cancel

    async def stalled_cancel(self: AsyncServiceBrowser) -> None:
        await asyncio.sleep(5)

    monkeypatch.setattr(AsyncServiceBrowser, "async_cancel", stalled_cancel)
    started = time.monotonic()
    with pytest.raises(StopUnconfirmed) as unconfirmed:
        await session.stop()
    assert time.monotonic() - started < 1.0
    assert unconfirmed.value.code == "cleanup-unconfirmed"
    monkeypatch.setattr(AsyncServiceBrowser, "async_cancel", real_cancel)
    await session.stop()  # a later retry is acknowledged
    await session.stop()


@pytest.mark.asyncio
async def test_sessions_of_separate_providers_share_one_engine_until_aclose(responder: Responder) -> None:
    first, second = MdnsProvider(interfaces=[LOOPBACK]), MdnsProvider(interfaces=[LOOPBACK])
    instance = run_instance("shared")
    await responder.register(SENSORS, instance, {"k": "v"})
    try:
        sink_a, sink_b = RecordingSink(), RecordingSink()
        session_a = await first.start(mdns_scope(SENSORS), sink_a)
        await sink_a.wait_for(named(instance))
        session_b = await second.start(mdns_scope(SENSORS), sink_b)
        await sink_b.wait_for(named(instance))
        assert len(mdns_module._ENGINES) == 1  # one engine behind both providers
        await session_a.stop()
        await session_b.stop()
    finally:
        await first.aclose()
        await second.aclose()
    assert mdns_module._ENGINES == {}
    # After aclose a new session gets a fresh engine.
    again = MdnsProvider(interfaces=[LOOPBACK])
    try:
        sink = RecordingSink()
        session = await again.start(mdns_scope(SENSORS), sink)
        await sink.wait_for(named(instance))
        await session.stop()
    finally:
        await again.aclose()


@pytest.mark.asyncio
async def test_aclose_stops_open_sessions(responder: Responder) -> None:
    provider = MdnsProvider(interfaces=[LOOPBACK])
    sink = RecordingSink()
    await provider.start(mdns_scope(SENSORS), sink)
    await provider.aclose()
    await provider.aclose()
    await responder.register(SENSORS, run_instance("after-close"), {"k": "v"})
    await asyncio.sleep(0.3)
    assert sink.observations == []
    assert pending_resolutions() == []
