"""The BLE provider on a real controller's rules (CONTRACT §6.3, §6.5): what a bench user meets (emulated).

The emulated controller reports each device once per scan (its duplicate filter) and bluetoothd restarts the
scan only when the merged filter of its clients changes; see `bluez_emu.py` for the rules and their sources.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from connector.core.observations import BleObservation
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.errors import ProviderError
from providers.ble import BleProvider, BleSession, bus_link
from tests.providers.bluez_mock import BluezController, RecordingSink, bluez

__all__ = ["bluez"]  # the fixture, imported above

HEART = "0000180d-0000-1000-8000-00805f9b34fb"
BTHOME = "0000fcd2-0000-1000-8000-00805f9b34fb"
SENSOR = "AA:BB:CC:00:01:01"
STEADY = "AA:BB:CC:00:01:02"
LATER = "AA:BB:CC:00:01:03"
PHONE = "AA:BB:CC:00:01:04"
BUDS = "AA:BB:CC:00:01:05"
PHONE_CLASS = 0x5A020C  # major class phone, smartphone
DBUS = "org.freedesktop.DBus"


def scope(**filters: Any) -> DiscoveryScope:
    """An admitted BLE scope with the given filters."""
    return DiscoveryScope(
        transport="ble",
        window_seconds=10,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(**filters),
        cleanup_timeout_ms=1000,
    )


def at(address: str) -> Callable[[BleObservation], bool]:
    return lambda o: o.address == address


async def steady(
    bluez: BluezController, address: str, sink: RecordingSink, timeout: float, **adv: Any
) -> None:
    """A device that keeps advertising (every 50 ms) until `sink` saw it, at most `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not any(o.address == address for o in sink.observations):
            bluez.advertise(address, **adv)
            await asyncio.sleep(0.05)  # real peer: a device advertising every 50 ms


class PlainClient:
    """Another program on the bus (bluetoothctl, a desktop panel): a D-Bus client of bluetoothd."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus

    async def call(self, member: str, sig: str = "", *body: Any) -> Message:
        msg = Message(
            destination="org.bluez",
            path="/org/bluez/hci0",
            interface="org.bluez.Adapter1",
            member=member,
            signature=sig,
            body=list(body),
        )
        reply = await self.bus.call(msg)
        assert reply is not None
        return reply


@pytest_asyncio.fixture
async def plain(bluez: BluezController) -> AsyncIterator[PlainClient]:
    client = PlainClient(await MessageBus(bus_type=BusType.SYSTEM).connect())
    yield client
    client.bus.disconnect()


@pytest.mark.asyncio
async def test_a_service_data_only_sensor_is_found_by_a_scope_running_alone(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(scope(service_uuids=(BTHOME,)), sink)
    bluez.add_device(SENSOR, service_data={BTHOME: b"\x40\x02\xc4\x09"})  # BTHome: no UUID list at all
    seen = await sink.wait_for(at(SENSOR))
    await session.stop()
    assert BTHOME in seen.service_uuids and seen.service_data == {BTHOME: b"\x40\x02\xc4\x09"}
    assert all("UUIDs" not in row[0] for row in bluez.method_calls("SetDiscoveryFilter"))


@pytest.mark.asyncio
async def test_a_scan_joining_a_running_one_sees_a_steady_device_within_its_window(
    bluez: BluezController,
) -> None:
    bluez.configure(cycle_s=3600)  # no cycle ends: only a forced restart lets the joining scan hear it
    first, joining = RecordingSink(), RecordingSink()
    running = await BleProvider().start(scope(service_uuids=(HEART,)), first)
    bluez.add_device(STEADY, service_uuids=[HEART])
    await first.wait_for(at(STEADY))
    assert not bluez.advertise(STEADY)  # the controller already reported it in this scan
    scans = bluez.scans_started()
    session = await BleProvider().start(scope(service_uuids=(HEART,)), joining)
    assert bluez.scans_started() > scans  # the Pathloss start changed the merged filter
    await steady(bluez, STEADY, joining, timeout=3.0)
    await session.stop()
    await running.stop()


@pytest.mark.asyncio
async def test_while_plain_discovery_holds_the_adapter_a_joining_scan_hears_within_one_cycle(
    bluez: BluezController, plain: PlainClient
) -> None:
    bluez.configure(cycle_s=3600)  # the test ends the cycle itself
    assert (await plain.call("StartDiscovery")).message_type == MessageType.METHOD_RETURN
    first = RecordingSink()
    running = await BleProvider().start(scope(service_uuids=(HEART,)), first)
    bluez.add_device(STEADY, service_uuids=[HEART])
    await first.wait_for(at(STEADY))
    scans = bluez.scans_started()
    joining = RecordingSink()
    session = await BleProvider().start(scope(service_uuids=(HEART,)), joining)
    # A regular client clears the merged filter whatever the others ask: no restart could be forced,
    assert bluez.scans_started() == scans and not bluez.advertise(STEADY)
    assert bluez.end_cycle()  # so the device is heard once the controller's cycle (10.24 s) ends
    await steady(bluez, STEADY, joining, timeout=1.5)
    await session.stop()
    await running.stop()


@pytest.mark.asyncio
async def test_a_scan_survives_another_scans_failed_start_and_the_kill_of_its_worker(
    bluez: BluezController,
) -> None:
    bluez.configure(cycle_s=3600)  # no cycle restart within the test: every restart counted is a cause
    healthy = RecordingSink()
    running = await BleProvider().start(scope(service_uuids=(HEART,)), healthy)
    bluez.fail_start("org.bluez.Error.Failed")  # StartDiscovery refused after the filter was pre-set
    with pytest.raises(ProviderError) as caught:
        await BleProvider().start(scope(service_uuids=(HEART,)), RecordingSink())
    assert caught.value.diagnostics == ({"code": "ble-backend", "message": "org.bluez.Error.Failed"},)
    bluez.fail_start(None)
    # The failed worker cleared its filter before it went, so its disconnect did not stop the adapter
    # (adapter.c `discovery_disconnect` -> `discovery_stop` with one other client discovering).
    scans = bluez.scans_started()
    assert bluez.presets() == [] and bluez.discovering() and bluez.scanning()
    assert isinstance(running, BleSession) and bluez.clients() == [running.unique_name]
    await steady(bluez, LATER, healthy, timeout=3.0, service_uuids=[HEART])
    assert healthy.failures == [] and bluez.scans_started() == scans  # heard without any restart
    await running.stop()


@pytest.mark.asyncio
async def test_a_deaf_adapter_mid_window_is_restarted(bluez: BluezController, plain: PlainClient) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(scope(service_uuids=(HEART,)), sink)
    # Another program pre-sets a filter and goes: with exactly one client discovering, bluetoothd stops.
    await plain.call("SetDiscoveryFilter", "a{sv}", {"Transport": Variant("s", "le")})
    plain.bus.disconnect()
    await steady(bluez, LATER, sink, timeout=3.0, service_uuids=[HEART])
    assert bluez.discovering() and sink.failures == []
    await session.stop()


@pytest.mark.asyncio
async def test_a_deaf_adapter_that_cannot_be_restarted_fails_the_session(
    bluez: BluezController, plain: PlainClient
) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(scope(service_uuids=(HEART,)), sink)
    await plain.call("SetDiscoveryFilter", "a{sv}", {"Transport": Variant("s", "le")})
    bluez.fail_kernel_start()  # the restart fails too: bluetoothd retries only after 10 s
    plain.bus.disconnect()
    failure = await sink.wait_for_failure(timeout=5.0)
    assert type(failure) is ProviderError and failure.code == "provider-failure"
    await session.stop()


@pytest.mark.asyncio
async def test_a_classic_phone_matching_the_name_prefix_is_no_candidate_while_plain_discovery_runs(
    bluez: BluezController, plain: PlainClient
) -> None:
    await plain.call("StartDiscovery")  # BR/EDR and LE: inquiry results reach every client
    sink = RecordingSink()
    session = await BleProvider().start(scope(name_prefix="Pixel"), sink)
    assert bluez.advertise(PHONE, name="Pixel 9", device_class=PHONE_CLASS)  # a Device1 with Class
    bluez.add_device(BUDS, name="Pixel Buds")
    await sink.wait_for(at(BUDS))
    await session.stop()
    assert sink.addresses() == [BUDS]


@pytest.mark.asyncio
@pytest.mark.timeout(480)  # 200 worker processes on a real dbus-daemon: minutes when both cores are busy
async def test_two_hundred_sessions_leave_the_match_rule_count_flat(bluez: BluezController) -> None:
    provider = BleProvider()

    async def match_rules() -> int:
        link = bus_link()
        bus = await link.bus()
        stats = await bus.call(
            Message(
                destination=DBUS,
                path="/org/freedesktop/DBus",
                interface=f"{DBUS}.Debug.Stats",
                member="GetConnectionStats",
                signature="s",
                body=[bus.unique_name],
            )
        )
        assert stats is not None and stats.message_type == MessageType.METHOD_RETURN
        return int(stats.body[0]["MatchRules"].value)

    session = await provider.start(scope(service_uuids=(HEART,)), RecordingSink())
    await session.stop()
    after_one = await match_rules()
    for _ in range(199):
        session = await provider.start(scope(service_uuids=(HEART,)), RecordingSink())
        await session.stop()
    assert await match_rules() == after_one


@pytest.mark.asyncio
async def test_a_rejected_stop_on_the_only_client_leaves_the_next_scan_working(
    bluez: BluezController,
) -> None:
    first = await BleProvider().start(scope(service_uuids=(HEART,)), RecordingSink())
    bluez.reject_kernel_stop()  # the kernel had just ended its scan (bluez/bluez#807)
    await first.stop()
    sink = RecordingSink()
    session = await BleProvider().start(scope(service_uuids=(HEART,)), sink)
    await steady(bluez, LATER, sink, timeout=3.0, service_uuids=[HEART])
    await session.stop()


@pytest.mark.asyncio
async def test_a_start_cut_short_by_a_power_off_is_unavailable(bluez: BluezController) -> None:
    bluez.power_off_during_kernel_start()  # StartDiscovery answers InProgress (adapter.c `discovery_free`)
    with pytest.raises(ProviderError) as caught:
        await BleProvider().start(scope(service_uuids=(HEART,)), RecordingSink())
    assert caught.value.code == "provider-unavailable"


@pytest.mark.asyncio
async def test_a_0_dbm_report_is_an_observation_at_0_dbm(bluez: BluezController) -> None:
    bluez.configure(duplicate_filter=False)
    sink = RecordingSink()
    session = await BleProvider().start(scope(service_uuids=(HEART,)), sink)
    bluez.add_device(SENSOR, service_uuids=[HEART], rssi=-40)
    await sink.wait_for(at(SENSOR))
    bluez.advertise(SENSOR, rssi=0)  # device.c: RSSI invalidated, nothing else changed
    seen = await sink.wait_for(lambda o: o.address == SENSOR and o.rssi == 0)
    await session.stop()
    assert seen.rssi == 0


@pytest.mark.asyncio
async def test_a_joining_scan_whose_forced_restart_fails_in_the_kernel_restarts_it_again(
    bluez: BluezController,
) -> None:
    healthy, joining = RecordingSink(), RecordingSink()
    running = await BleProvider().start(scope(service_uuids=(HEART,)), healthy)
    bluez.fail_kernel_start()  # the restart the joining scan forces fails: bluetoothd removes that client
    session = await BleProvider().start(scope(service_uuids=(HEART,)), joining)
    assert bluez.scanning() and len(bluez.clients()) == 2
    await steady(bluez, LATER, healthy, timeout=3.0, service_uuids=[HEART])
    await steady(bluez, LATER, joining, timeout=3.0, service_uuids=[HEART])
    await session.stop()
    await running.stop()
