"""The mDNS provider against real python-zeroconf on 127.0.0.1: what avahi-daemon cannot play.

A second engine on loopback sends what a real responder never would (malformed names, colliding SRVs, a
PTR without SRV, a flood of 5,000 instances), and the tests look inside the provider where the wire shows
nothing (the observation's fields, the presence cadence, no `AsyncServiceInfo` ever built for an
out-of-scope name, sockets closed before `stop()` returns). The scenarios a real responder plays
(publish, goodbye, presence over a window, vanished, out of scope on the wire, IPv6-only) are in
`test_mdns_avahi.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import pytest_asyncio
from zeroconf import Zeroconf
from zeroconf._dns import DNSPointer
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf
from zeroconf.const import _CLASS_IN, _TYPE_PTR

from connector.core.observations import MdnsObservation
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.errors import ProviderError, ProviderUnavailable, StopUnconfirmed
from providers import mdns as mdns_module
from providers.mdns import MdnsProvider, MdnsSession
from tests.providers.mdns_peer import (
    LOOPBACK,
    RecordingSink,
    Responder,
    ptr,
    run_instance,
    run_service_type,
    srv,
)

PRINTERS = run_service_type("prn")
SENSORS = run_service_type("sns")
# A test that opens an engine is `realtime`: python-zeroconf sends and hears on real loopback sockets.
PROBES = run_service_type("prb")  # browsed by no session: a probe's PTR is only cached
_probes = itertools.count()


def mdns_scope(
    *types: str,
    instance_prefix: str | None = None,
    exclude_prefix: str | None = None,
    cleanup_timeout_ms: int = 2000,
    max_candidates: int = 64,
) -> DiscoveryScope:
    """An admitted mDNS scope for the given (normalised) service types."""
    exclusions = None if exclude_prefix is None else ScopeFilter(instance_prefix=exclude_prefix)
    return DiscoveryScope(
        transport="mdns",
        window_seconds=10,
        max_candidates=max_candidates,
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


async def announce_marker(responder: Responder, sink: RecordingSink) -> str:
    """Announce an in-scope instance after the records under test and wait for it: they were processed."""
    marker = f"{run_instance('marker')}.{SENSORS}"
    responder.announce([ptr(SENSORS, marker), srv(marker, 4242, "marker.local.")])
    await sink.wait_for(lambda o: o.name == marker, timeout_s=10)
    return marker


async def heard(responder: Responder, *sessions: MdnsSession) -> None:
    """Announce an out-of-scope probe until each session's engine has cached it.

    Then each engine hears the responder, and has processed everything the responder sent before.
    """
    probe = ptr(PROBES, f"{run_instance(f'probe{next(_probes)}')}.{PROBES}")
    engines = [session._zc for session in sessions]
    async with asyncio.timeout(10):
        while not all(_cached(engine, probe) for engine in engines):
            responder.announce([probe])
            await asyncio.sleep(0.05)  # real peer: the session's engine hears loopback multicast


def _cached(engine: Zeroconf, record: DNSPointer) -> bool:
    """True when `engine`'s cache holds the PTR `record`."""
    found = engine.cache.async_all_by_details(record.name, _TYPE_PTR, _CLASS_IN)
    return any(isinstance(r, DNSPointer) and r.alias == record.alias for r in found)


async def witnessed(responder: Responder, service_type: str, instance: str) -> None:
    """Register `instance` and wait until a fresh session reports it: its announcement is on the wire."""
    witness = RecordingSink()
    session = await provider().start(mdns_scope(service_type), witness)
    try:
        await responder.register(service_type, instance, {"k": "v"})
        await witness.wait_for(named(instance), timeout_s=10)
    finally:
        await session.stop()


async def resolutions_settled(session: MdnsSession) -> None:
    """Wait until no tracked instance has a resolution in flight."""
    async with asyncio.timeout(10):
        while any(i.task is not None for i in session._tracked.values()):
            await asyncio.sleep(0.02)  # real peer: the responder answers (or not) over loopback


async def failed(sink: RecordingSink) -> ProviderError:
    """The first failure the sink records."""
    async with asyncio.timeout(10):
        while not sink.failures:
            await asyncio.sleep(0.02)  # real peer: the session's engine on loopback
    return sink.failures[0]


def zeroconf_tasks() -> list[asyncio.Task[Any]]:
    """Unfinished tasks of any mDNS session or of python-zeroconf."""
    found = []
    for task in asyncio.all_tasks():
        qualname = getattr(task.get_coro(), "__qualname__", "")
        if not task.done() and ("MdnsSession" in qualname or "ServiceInfo" in qualname):
            found.append(task)
    return found


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every instance name the provider built an `AsyncServiceInfo` for (i.e. tried to resolve)."""
    names: list[str] = []

    class Recording(AsyncServiceInfo):
        def __init__(self, type_: str, name: str, *args: Any, **kwargs: Any) -> None:
            names.append(name)
            super().__init__(type_, name, *args, **kwargs)

    monkeypatch.setattr(mdns_module, "AsyncServiceInfo", Recording)
    return names


@pytest_asyncio.fixture
async def responder() -> AsyncIterator[Responder]:
    """The device side: a second engine on loopback."""
    async with Responder() as peer:
        yield peer


def provider(**options: Any) -> MdnsProvider:
    """A provider pinned to loopback."""
    return MdnsProvider(interfaces=[LOOPBACK], **options)


# -- configuration and refusals ------------------------------------------------------------------------------


def test_capabilities_declare_service_type_filtering_and_concurrency() -> None:
    caps = provider().capabilities
    assert caps.transport == "mdns"
    assert caps.backend_filters == frozenset({"service_types"})
    assert caps.concurrent_sessions is True


@pytest.mark.parametrize("interfaces", [["not-an-address"], [], "", "192.0.2.1,bogus"])
def test_interfaces_must_be_addresses_or_all_and_are_not_echoed(interfaces: Any) -> None:
    with pytest.raises(ValueError) as refused:
        MdnsProvider(interfaces=interfaces)
    assert "not-an-address" not in str(refused.value) and "bogus" not in str(refused.value)


@pytest.mark.parametrize("interfaces", [["127.0.0.1", "::1"], "all", "ALL", None, "127.0.0.1"])
def test_ipv6_addresses_all_and_the_default_are_accepted(interfaces: Any) -> None:
    MdnsProvider(interfaces=interfaces)


@pytest.mark.asyncio
async def test_start_refuses_a_scope_of_another_transport_or_without_service_types() -> None:
    usb = DiscoveryScope("usb-serial", 5, 64, 65536, ScopeFilter(vid_pid=((0x0403, 0x6001),)))
    with pytest.raises(ProviderError):
        await provider().start(usb, RecordingSink())
    with pytest.raises(ProviderError):
        await provider().start(mdns_scope(), RecordingSink())


@pytest.mark.asyncio
async def test_an_address_on_no_interface_is_provider_unavailable_with_a_one_line_reason() -> None:
    with pytest.raises(ProviderUnavailable) as refused:
        await MdnsProvider(interfaces=["192.0.2.99"]).start(mdns_scope(SENSORS), RecordingSink())
    assert refused.value.code == "provider-unavailable"
    assert "\n" not in refused.value.message and "192.0.2.99" not in refused.value.message


@pytest.mark.asyncio
async def test_no_multicast_capable_interface_is_provider_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("providers.mdns_interfaces.interface_flags", lambda name: 0x1)  # up, no MULTICAST
    for setting in ("all", None):
        with pytest.raises(ProviderUnavailable) as refused:
            await MdnsProvider(interfaces=setting).start(mdns_scope(SENSORS), RecordingSink())
        assert refused.value.message.startswith("no multicast-capable interface")


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_the_interfaces_are_chosen_again_at_every_session_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    choices: list[object] = []
    real_select = mdns_module.select_interfaces  # type: ignore[attr-defined]

    def recording_select(setting: Any) -> Any:
        choices.append(setting)
        return real_select(setting)

    monkeypatch.setattr(mdns_module, "select_interfaces", recording_select)
    mdns = provider()
    for _ in range(2):
        session = await mdns.start(mdns_scope(SENSORS), RecordingSink())
        await session.stop()
    assert choices == [("127.0.0.1",), ("127.0.0.1",)]


# -- what a session reports ----------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_resolved_instance_is_reported_without_its_txt_and_with_its_ptr_ttl(
    responder: Responder,
) -> None:
    instance = run_instance("hall-printer")
    await responder.register(PRINTERS, instance, {"model": "CANARY-txt"}, port=8631)
    sink = RecordingSink()
    session = await provider().start(mdns_scope(PRINTERS), sink)
    try:
        seen = await sink.wait_for(named(instance))
    finally:
        await session.stop()
    assert (seen.event, seen.service_type, seen.name) == ("add", PRINTERS, f"{instance}.{PRINTERS}")
    assert (seen.server, seen.addresses, seen.port) == (f"{instance}.local.", (LOOPBACK,), 8631)
    assert dict(seen.txt) == {}  # TXT values are never kept
    assert seen.ttl is not None and 4400 < seen.ttl <= 4500  # the PTR's TTL (zeroconf's default 4500 s)


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_present_instance_is_reported_again_at_every_presence_pass(responder: Responder) -> None:
    instance = run_instance("steady")
    await responder.register(SENSORS, instance, {"k": "v"})
    sink = RecordingSink()
    session = await provider(presence_interval_s=0.2).start(mdns_scope(SENSORS), sink)
    try:
        await sink.wait_for(named(instance))
        async with asyncio.timeout(10):  # four passes take 0.8 s; a loaded machine may take longer
            while len([o for o in sink.mdns if named(instance)(o)]) < 4:
                await asyncio.sleep(0.05)  # real peer: the presence passes read a real engine's cache
    finally:
        await session.stop()
    seen = [o for o in sink.mdns if named(instance)(o)]
    assert seen[0].event == "add" and {o.event for o in seen[1:]} == {"update"}
    assert len(seen) >= 4


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_out_of_scope_instances_are_never_resolved(responder: Responder, resolved: list[str]) -> None:
    alpha, beta, gamma = run_instance("alpha"), run_instance("beta"), run_instance("gamma")
    for name in (alpha, beta, gamma):
        await responder.register(SENSORS, name, {"k": "v"})
    sink = RecordingSink()
    session = await provider().start(mdns_scope(SENSORS, instance_prefix=alpha[:3]), sink)
    excluding = RecordingSink()
    other = await provider().start(mdns_scope(SENSORS, exclude_prefix=beta[:3]), excluding)
    try:
        await sink.wait_for(named(alpha))
        await excluding.wait_for(named(gamma))
        assert isinstance(session, MdnsSession) and isinstance(other, MdnsSession)
        await heard(responder, session, other)  # both engines have handled beta's records by now
        await resolutions_settled(session)
        await resolutions_settled(other)
    finally:
        await session.stop()
        await other.stop()
    ours = [n for n in resolved if n.split(".")[0] in (alpha, beta, gamma)]
    assert ours.count(f"{beta}.{SENSORS}") == 0  # excluded by one session, not prefixed for the other
    assert {o.name for o in sink.mdns} == {f"{alpha}.{SENSORS}"}


# -- what a real responder would never send ------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_ptr_without_an_srv_answer_is_never_reported(responder: Responder) -> None:
    ghost = f"{run_instance('ghost')}.{SENSORS}"
    sink = RecordingSink()
    session = await provider(resolve_timeout_ms=300).start(mdns_scope(SENSORS), sink)
    try:
        await heard(responder, session)
        responder.announce([ptr(SENSORS, ghost)])
        marker = await announce_marker(responder, sink)
        assert isinstance(session, MdnsSession) and session.tracked_count == 2
        await resolutions_settled(session)  # the ghost's request timed out
    finally:
        await session.stop()
    assert {o.name for o in sink.mdns} == {marker} and sink.failures == []


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_record_update_after_the_goodbye_does_not_bring_the_instance_back(
    responder: Responder,
) -> None:
    # python-zeroconf#1048: the browser reports Updated after Removed when an SRV arrives after the goodbye.
    name = f"{run_instance('late-srv')}.{SENSORS}"
    sink = RecordingSink()
    session = await provider(presence_interval_s=0.2).start(mdns_scope(SENSORS), sink)
    try:
        await heard(responder, session)
        responder.announce([ptr(SENSORS, name), srv(name, 1111, "late.local.")])
        await sink.wait_for(lambda o: o.name == name and o.event == "add")
        responder.announce([ptr(SENSORS, name, ttl=0)])  # goodbye
        await sink.wait_for(lambda o: o.name == name and o.event == "remove")
        removed_at = len(sink.mdns)
        responder.announce([srv(name, 2222, "late.local.")])
        await announce_marker(responder, sink)
        assert isinstance(session, MdnsSession)
        await resolutions_settled(session)
    finally:
        await session.stop()
    assert [o for o in sink.mdns[removed_at:] if o.name == name] == []


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_malformed_names_and_colliding_srvs_are_skipped_without_a_crash(responder: Responder) -> None:
    good = run_instance("good")
    await responder.register(SENSORS, good, {"k": "v"})
    collided = f"{run_instance('twice')}.{SENSORS}"
    sink = RecordingSink()
    session = await provider(presence_interval_s=0.2).start(mdns_scope(SENSORS), sink)
    try:
        await heard(responder, session)
        responder.announce(
            [
                ptr(SENSORS, "no-type-suffix.local."),  # the alias does not end in the service type
                ptr(SENSORS, SENSORS),  # an alias that is the service type itself, no instance label
                ptr(SENSORS, collided),
                srv(collided, 1111, "one.local.", unique=False),
                srv(collided, 2222, "two.local.", unique=False),
            ]
        )
        await sink.wait_for(named(good))
        marker = await announce_marker(responder, sink)
        assert isinstance(session, MdnsSession)
        await resolutions_settled(session)
    finally:
        await session.stop()
    assert {o.name for o in sink.mdns} == {f"{good}.{SENSORS}", marker}
    assert sink.failures == []


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_flood_of_5000_instances_keeps_the_session_bounded(responder: Responder) -> None:
    flood_type = run_service_type("fld")
    keep = run_instance("keep")
    await responder.register(flood_type, keep, {"k": "v"})
    flood = [ptr(flood_type, f"flood-{n:04d}-{keep}.{flood_type}") for n in range(5000)]
    narrow, wide = RecordingSink(), RecordingSink()
    tracemalloc.start()
    try:
        narrow_session = await provider().start(mdns_scope(flood_type, instance_prefix=keep), narrow)
        wide_session = await provider().start(mdns_scope(flood_type, max_candidates=8), wide)
        await narrow.wait_for(named(keep))
        before, _ = tracemalloc.get_traced_memory()
        for start in range(0, 5000, 250):
            responder.announce(flood[start : start + 250])
            await asyncio.sleep(0.02)  # real peer: paced, so loopback's receive buffers take the flood
        await heard(responder, narrow_session, wide_session)  # the engines handled the flood before it
        after, peak = tracemalloc.get_traced_memory()
        assert isinstance(narrow_session, MdnsSession) and isinstance(wide_session, MdnsSession)
        narrow_tracked, wide_tracked = narrow_session.tracked_count, wide_session.tracked_count
        narrow_cache = sum(len(v) for v in narrow_session._zc.cache.cache.values())
    finally:
        tracemalloc.stop()
        await narrow_session.stop()
        await wide_session.stop()
    assert narrow_tracked == 1  # only the in-scope instance; 5,000 names dropped on arrival
    assert wide_tracked <= 9  # max_candidates + 1: the table ends such a session limit-reached
    assert len({o.name for o in wide.mdns}) <= 9
    assert narrow_cache <= 10_000  # python-zeroconf's own cap (_MAX_CACHE_RECORDS)
    # Two engines each caching 5,000 PTRs: a few MB at most, not growing with what the sessions track.
    assert after - before < 16 * 1024 * 1024 and peak - before < 24 * 1024 * 1024


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_an_instance_left_out_for_lack_of_room_is_taken_in_once_a_slot_frees(
    responder: Responder,
) -> None:
    names = [f"{run_instance(f'slot{n}')}.{SENSORS}" for n in range(3)]
    sink = RecordingSink()
    session = await provider(presence_interval_s=0.2).start(mdns_scope(SENSORS, max_candidates=1), sink)
    assert isinstance(session, MdnsSession)
    try:
        await heard(responder, session)
        responder.announce(
            [record for name in names for record in (ptr(SENSORS, name), srv(name, 80, "s.local."))]
        )
        async with asyncio.timeout(5):
            while len({o.name for o in sink.mdns}) < 2:
                await asyncio.sleep(0.02)  # real peer: the responder's records over loopback
        assert session.tracked_count == 2  # max_candidates + 1
        first_two = {o.name for o in sink.mdns}
        [left_out] = set(names) - first_two
        responder.announce([ptr(SENSORS, sorted(first_two)[0], ttl=0)])  # one of them says goodbye
        await sink.wait_for(lambda o: o.name == left_out and o.event == "add")
    finally:
        await session.stop()


# -- the stop contract ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_stop_ends_resolutions_and_closes_every_socket_before_it_returns(responder: Responder) -> None:
    sink = RecordingSink()
    session = await provider(resolve_timeout_ms=600_000).start(mdns_scope(PRINTERS), sink)
    assert isinstance(session, MdnsSession)
    sockets = mdns_module.engine_sockets(session._azc)
    assert sockets and all(s.fileno() != -1 for s in sockets)
    responder.announce([ptr(PRINTERS, f"{run_instance('pending')}.{PRINTERS}")])
    async with asyncio.timeout(5):
        while session.tracked_count == 0:
            await asyncio.sleep(0.02)  # real peer: the responder's PTR over loopback
    async with asyncio.timeout(
        30
    ):  # far below the pending 10-minute resolution; timing: bench/mdns_stop.py (timing: bench/mdns_bench.py)
        await session.stop()
    assert all(s.fileno() == -1 for s in sockets)
    assert zeroconf_tasks() == []
    await session.stop()  # idempotent
    await witnessed(responder, PRINTERS, run_instance("after-stop"))
    assert sink.observations == [] and sink.failures == []


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_stop_unconfirmed_when_the_browser_does_not_acknowledge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = await provider().start(mdns_scope(SENSORS, cleanup_timeout_ms=200), RecordingSink())
    real_cancel = AsyncServiceBrowser.async_cancel

    async def stalled_cancel(self: AsyncServiceBrowser) -> None:
        await asyncio.Event().wait()  # never acknowledged

    monkeypatch.setattr(AsyncServiceBrowser, "async_cancel", stalled_cancel)
    with pytest.raises(StopUnconfirmed) as unconfirmed:
        async with asyncio.timeout(30):  # bounded: without the bound this would wait forever
            await session.stop()
    assert unconfirmed.value.code == "cleanup-unconfirmed"
    monkeypatch.setattr(AsyncServiceBrowser, "async_cancel", real_cancel)
    await session.stop()  # a later retry is acknowledged
    await session.stop()


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_aclose_stops_open_sessions(responder: Responder) -> None:
    mdns = provider()
    sink = RecordingSink()
    await mdns.start(mdns_scope(SENSORS), sink)
    await mdns.aclose()
    await mdns.aclose()
    await witnessed(responder, SENSORS, run_instance("after-close"))
    assert sink.observations == []
    assert zeroconf_tasks() == []


# -- failures never leak an engine, a session or a record name -----------------------------------------------


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> list[AsyncZeroconf]:
    """Every engine the provider opens."""
    opened: list[AsyncZeroconf] = []

    class Recording(AsyncZeroconf):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(mdns_module, "AsyncZeroconf", Recording)
    return opened


def stall_first_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's wait for the engine's start never ends (the close's own wait is answered)."""
    real_wait = Zeroconf.async_wait_for_start
    calls: list[Zeroconf] = []

    async def stalled_once(self: Zeroconf, timeout: float = 0) -> None:
        calls.append(self)
        if len(calls) == 1:
            await asyncio.Event().wait()
        await real_wait(self, timeout=timeout)

    monkeypatch.setattr(Zeroconf, "async_wait_for_start", stalled_once)


async def sockets_of(azc: AsyncZeroconf) -> list[Any]:
    """The engine's sockets, once it has opened them."""
    async with asyncio.timeout(10):
        while not (found := mdns_module.engine_sockets(azc)):
            await asyncio.sleep(0.01)  # real peer: python-zeroconf opens its sockets
    return found


async def all_closed(sockets: list[Any]) -> bool:
    """True once every socket is closed (closing a transport takes a loop turn or two)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            while any(s.fileno() != -1 for s in sockets):
                await asyncio.sleep(0.01)  # real peer: the transports close their sockets
    return all(s.fileno() == -1 for s in sockets)


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_start_cancelled_while_the_engine_starts_closes_the_engine(
    monkeypatch: pytest.MonkeyPatch, engines: list[AsyncZeroconf]
) -> None:
    stall_first_start(monkeypatch)
    starting = asyncio.ensure_future(provider().start(mdns_scope(SENSORS), RecordingSink()))
    async with asyncio.timeout(10):
        while not engines:
            await asyncio.sleep(0.01)  # real peer: the provider opens its engine
    sockets = await sockets_of(engines[0])
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert await all_closed(sockets)
    assert engines[0].zeroconf.done


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_a_start_cancelled_by_an_anyio_scope_closes_the_engine(
    monkeypatch: pytest.MonkeyPatch, engines: list[AsyncZeroconf]
) -> None:
    stall_first_start(monkeypatch)
    with anyio.move_on_after(0.3) as scope:
        await provider().start(mdns_scope(SENSORS), RecordingSink())
    assert scope.cancelled_caught and len(engines) == 1
    assert engines[0].zeroconf.done  # the close ran to its end inside the cancelled scope


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_an_unexpected_fault_starting_the_browser_closes_the_engine_and_is_raised(
    monkeypatch: pytest.MonkeyPatch, engines: list[AsyncZeroconf]
) -> None:
    real_start = MdnsSession.start

    def faulty_start(self: MdnsSession) -> None:
        real_start(self)
        raise RuntimeError("unexpected")

    monkeypatch.setattr(MdnsSession, "start", faulty_start)
    with pytest.raises(RuntimeError):
        await provider().start(mdns_scope(SENSORS), RecordingSink())
    assert engines[0].zeroconf.done
    assert await all_closed(mdns_module.engine_sockets(engines[0]))
    assert zeroconf_tasks() == []


@pytest.mark.asyncio
@pytest.mark.realtime
async def test_aclose_stops_every_session_although_one_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mdns = provider()
    first = await mdns.start(mdns_scope(SENSORS), RecordingSink())
    second = await mdns.start(mdns_scope(SENSORS), RecordingSink())
    assert isinstance(first, MdnsSession) and isinstance(second, MdnsSession)
    sockets = mdns_module.engine_sockets(second._azc)

    async def broken_stop() -> None:
        raise ValueError(f"canary {SENSORS}")

    first.stop = broken_stop  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.WARNING, logger="sensorium.mdns"):
        await mdns.aclose()
    assert await all_closed(sockets)
    assert "ValueError" in caplog.text and "canary" not in caplog.text
    await MdnsSession.stop(first)


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["_report", "presence_pass"])
@pytest.mark.realtime
async def test_a_fault_in_a_session_task_fails_the_session_with_a_fixed_text(
    monkeypatch: pytest.MonkeyPatch, responder: Responder, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    instance = run_instance(f"fault{where}")
    await responder.register(SENSORS, instance, {"k": "v"})

    def faulty(self: MdnsSession, *args: Any) -> None:
        raise RuntimeError(f"canary {instance}")

    monkeypatch.setattr(MdnsSession, where, faulty)
    loop_errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context))
    sink = RecordingSink()
    session = await provider(presence_interval_s=0.2).start(mdns_scope(SENSORS), sink)
    try:
        error = await failed(sink)
    finally:
        await session.stop()
    assert (
        error.code == "provider-failure" and instance not in error.message and "canary" not in error.message
    )
    assert "canary" not in caplog.text and loop_errors == []
    assert sink.failures == [error]  # reported once
