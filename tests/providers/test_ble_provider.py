"""The BLE provider with real bleak against emulated BlueZ: discovery, updates, removal, filtering."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest

from connector.core.observations import BleObservation
from connector.core.scope import DiscoveryScope, ScopeFilter
from providers.ble import BleProvider, BleSession, discovery_filters
from tests.providers.bluez_mock import BluezController, RecordingSink, bluez, every_advert

__all__ = ["bluez", "every_advert"]  # the fixtures, imported above

HEART = "0000180d-0000-1000-8000-00805f9b34fb"
ENV_SENSING = "0000181a-0000-1000-8000-00805f9b34fb"
APPLE, NORDIC = 0x004C, 0x0059

DEV_A = "AA:BB:CC:00:00:01"
DEV_B = "AA:BB:CC:00:00:02"
DEV_C = "AA:BB:CC:00:00:03"
MARKER = "AA:BB:CC:00:00:FF"


def ble_scope(
    *,
    service_uuids: tuple[str, ...] = (),
    manufacturer_ids: tuple[int, ...] = (),
    name_prefix: str | None = None,
    min_rssi_dbm: int | None = None,
    exclusions: ScopeFilter | None = None,
    adapter: str | None = None,
) -> DiscoveryScope:
    """An admitted BLE scope."""
    return DiscoveryScope(
        transport="ble",
        window_seconds=10,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(
            service_uuids=service_uuids,
            manufacturer_ids=manufacturer_ids,
            name_prefix=name_prefix,
            min_rssi_dbm=min_rssi_dbm,
        ),
        exclusions=exclusions,
        adapter=adapter,
        cleanup_timeout_ms=1000,
    )


def at(address: str, **fields: object) -> Callable[[BleObservation], bool]:
    """Predicate: an observation of `address` whose fields equal `fields`."""

    def check(o: BleObservation) -> bool:
        return o.address == address and all(getattr(o, k) == v for k, v in fields.items())

    return check


async def reports_of(sink: RecordingSink, address: str, count: int, timeout: float = 3.0) -> None:
    """Wait until `count` observations of `address` arrived."""
    async with asyncio.timeout(timeout):
        while sink.addresses().count(address) < count:
            await asyncio.sleep(0.005)  # real peer: the BLE worker relays BlueZ's reports


async def barrier(bluez: BluezController, sink: RecordingSink, **marker: Any) -> None:
    """Send an in-scope marker advert and wait for it: every earlier advert has been handled by then."""
    bluez.add_device(MARKER, **marker)
    await sink.wait_for(at(MARKER))


def test_capabilities_declare_pushed_down_filters_and_concurrent_sessions() -> None:
    caps = BleProvider().capabilities
    assert caps.transport == "ble"
    assert caps.backend_filters == frozenset({"min_rssi_dbm"})  # UUIDs are matched in the worker
    assert caps.concurrent_sessions is True  # every session is a BlueZ discovery client of its own


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        # Always LE and every report: DuplicateData, and an RSSI filter at BlueZ's lowest value without a
        # floor; never UUIDs (CONTRACT §6.3: BlueZ would match them on the advert's UUID lists only).
        (ble_scope(manufacturer_ids=(APPLE,)), {"Transport": "le", "DuplicateData": True, "RSSI": -127}),
        (
            ble_scope(service_uuids=(HEART, ENV_SENSING)),
            {"Transport": "le", "DuplicateData": True, "RSSI": -127},
        ),
        (
            ble_scope(service_uuids=(HEART,), min_rssi_dbm=-70),
            {"Transport": "le", "DuplicateData": True, "RSSI": -70},
        ),
        # BlueZ accepts -127..20: a higher floor is pushed as 20 (still a superset), a lower one as -127.
        (ble_scope(min_rssi_dbm=40), {"Transport": "le", "DuplicateData": True, "RSSI": 20}),
        (ble_scope(min_rssi_dbm=-128), {"Transport": "le", "DuplicateData": True, "RSSI": -127}),
        # Exclusions are never pushed down: BlueZ filters only select.
        (
            ble_scope(name_prefix="x", exclusions=ScopeFilter(service_uuids=(HEART,))),
            {"Transport": "le", "DuplicateData": True, "RSSI": -127},
        ),
    ],
)
def test_discovery_filters_are_a_superset_of_the_scope(
    scope: DiscoveryScope, expected: dict[str, object]
) -> None:
    assert discovery_filters(scope) == expected


@pytest.mark.asyncio
async def test_device_added_during_the_scan_reaches_the_sink_with_its_advert(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(ENV_SENSING,)), sink)
    bluez.add_device(
        DEV_A,
        name="Thermo-1",
        rssi=-58,
        service_uuids=[ENV_SENSING],
        manufacturer_data={NORDIC: b"\x05\x10"},
        service_data={ENV_SENSING: b"\x01\x02"},
        tx_power=-8,
    )
    seen = await sink.wait_for(at(DEV_A))
    await session.stop()
    assert seen == BleObservation(
        address=DEV_A,
        rssi=-58,
        name="Thermo-1",
        service_uuids=(ENV_SENSING,),
        manufacturer_data={NORDIC: b"\x05\x10"},
        service_data={ENV_SENSING: b"\x01\x02"},
        tx_power=-8,
    )
    assert sink.failures == []


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_rssi_and_advert_updates_reach_the_sink(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(manufacturer_ids=(APPLE,)), sink)
    bluez.add_device(DEV_A, rssi=-70, manufacturer_data={APPLE: b"\x01"})
    await sink.wait_for(at(DEV_A, rssi=-70))
    bluez.update(DEV_A, rssi=-45)
    await sink.wait_for(at(DEV_A, rssi=-45))
    bluez.update(DEV_A, manufacturer_data={APPLE: b"\x02\x03"}, name="Tag")
    updated = await sink.wait_for(at(DEV_A, name="Tag"))
    await session.stop()
    assert updated.manufacturer_data == {APPLE: b"\x02\x03"}
    assert updated.rssi == -45
    # A nameless device: bleak gives no local name (BlueZ's alias is the address then).
    assert sink.observations[0].name is None


@pytest.mark.asyncio
async def test_a_cached_device_whose_other_properties_flip_is_no_observation(bluez: BluezController) -> None:
    bluez.add_cached(DEV_A, name="Known", service_uuids=[HEART])  # paired earlier: cached, no RSSI
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), sink)
    # bleak runs its advertisement callback for each of these (RSSI -127 substituted): not reports.
    bluez.set_device(DEV_A, Trusted=True)
    bluez.set_device(DEV_A, Connected=True)
    bluez.set_device(DEV_A, ServicesResolved=True)
    bluez.set_device(DEV_A, Alias="Renamed")
    bluez.set_device(DEV_A, Connected=False)
    await barrier(bluez, sink, service_uuids=[HEART])
    assert DEV_A not in sink.addresses()
    bluez.advertise(DEV_A, rssi=-50, service_uuids=[HEART])  # an advertisement report: now it is seen
    await sink.wait_for(at(DEV_A, rssi=-50, name="Known"))
    await session.stop()
    assert all(o.rssi != -127 for o in sink.observations)


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_a_steady_device_is_observed_at_every_report(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), sink)
    pushed = bluez.filters()
    assert list(pushed.values()) == [{"Transport": "le", "DuplicateData": True, "RSSI": -127}]
    data = {APPLE: b"\x01\x02"}
    bluez.add_device(DEV_A, service_uuids=[HEART], rssi=-60, manufacturer_data=data)
    await reports_of(sink, DEV_A, 1)
    for seen in range(2, 7):  # the same advert again and again: no 8 dB move, no data change
        bluez.advertise(DEV_A, rssi=-61, manufacturer_data=data)
        await reports_of(sink, DEV_A, seen)  # each report seen before the next: no batch merges two
    await barrier(bluez, sink, service_uuids=[HEART])
    await session.stop()
    assert sink.addresses().count(DEV_A) == 6


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_a_removed_device_stops_being_observed(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), sink)
    bluez.add_device(DEV_A, service_uuids=[HEART])
    bluez.add_device(DEV_B, service_uuids=[HEART])
    await sink.wait_for(at(DEV_B))
    bluez.remove(DEV_A)  # InterfacesRemoved: the session's TTL expiry takes it out of the snapshot
    seen_before = len(sink.observations)
    bluez.update(DEV_B, rssi=-41)
    await sink.wait_for(at(DEV_B, rssi=-41))
    assert DEV_A not in [o.address for o in sink.observations[seen_before:]]
    bluez.add_device(DEV_A, service_uuids=[HEART], rssi=-77)  # back again: a fresh advert counts again
    await sink.wait_for(at(DEV_A, rssi=-77))
    await session.stop()


@pytest.mark.asyncio
async def test_service_uuids_are_matched_in_the_worker_and_out_of_scope_devices_never_reach_the_sink(
    bluez: BluezController,
) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), sink)
    pushed = bluez.method_calls("SetDiscoveryFilter")[0][0]
    assert "UUIDs" not in pushed and pushed["Transport"] == "le"  # CONTRACT §6.3
    # Another client: bluetoothd passes every device to both, and each session re-filters.
    other = BleProvider()
    wide = await other.start(ble_scope(manufacturer_ids=(APPLE,)), RecordingSink())
    await bluez.settled()  # the joining filter restarts the scan: each device below advertises once
    bluez.add_device(DEV_B, service_uuids=[ENV_SENSING], manufacturer_data={APPLE: b"\x01"})
    bluez.add_device(DEV_C, name="NoServices")
    bluez.update(DEV_B, rssi=-20)
    bluez.add_device(DEV_A, service_uuids=[ENV_SENSING, HEART])
    await sink.wait_for(at(DEV_A))
    await barrier(bluez, sink, service_uuids=[HEART])
    await session.stop()
    await wide.stop()
    assert sink.addresses() == [DEV_A, MARKER]


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_manufacturer_name_and_exclusion_filters_run_in_the_provider(bluez: BluezController) -> None:
    scope = ble_scope(
        manufacturer_ids=(APPLE,), name_prefix="Tag", exclusions=ScopeFilter(service_uuids=(ENV_SENSING,))
    )
    sink = RecordingSink()
    session = await BleProvider().start(scope, sink)
    assert "UUIDs" not in bluez.method_calls("SetDiscoveryFilter")[0][0]
    bluez.add_device(DEV_B, name="Tag-2", manufacturer_data={NORDIC: b"\x01"})  # wrong company
    bluez.add_device(DEV_C, name="Tag-3", manufacturer_data={APPLE: b"\x01"}, service_uuids=[ENV_SENSING])
    bluez.add_device(DEV_A, name="Tag-1", manufacturer_data={APPLE: b"\x01", NORDIC: b"\x02"})
    bluez.update(DEV_C, rssi=-30)
    await barrier(bluez, sink, name="Tag-M", manufacturer_data={APPLE: b""})
    await session.stop()
    assert sink.addresses() == [DEV_A, MARKER]


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_rssi_floor_is_pushed_down_and_enforced(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,), min_rssi_dbm=-70), sink)
    assert bluez.method_calls("SetDiscoveryFilter")[0][0]["RSSI"] == -70
    bluez.add_device(DEV_A, service_uuids=[HEART], rssi=-85)
    await barrier(bluez, sink, service_uuids=[HEART], rssi=-50)
    assert DEV_A not in sink.addresses()
    bluez.update(DEV_A, rssi=-65)
    await sink.wait_for(at(DEV_A, rssi=-65))
    await session.stop()


@pytest.mark.asyncio
async def test_named_adapters_scope_first_then_provider_then_bleak_default(bluez: BluezController) -> None:
    bluez.add_adapter("hci1")
    scans_hci1 = BleProvider(adapter="hci1")
    session = await scans_hci1.start(ble_scope(service_uuids=(HEART,)), RecordingSink())
    assert bluez.discovering("hci1") and not bluez.discovering("hci0")
    await session.stop()
    session = await scans_hci1.start(ble_scope(service_uuids=(HEART,), adapter="hci0"), RecordingSink())
    assert bluez.discovering("hci0") and not bluez.discovering("hci1")
    await session.stop()
    # bleak's default is the first powered adapter. The control call returns once bluetoothd applied the
    # change, and hci0 comes first by name whether or not the link has heard hci1 power off by then.
    bluez.set_powered(False, "hci1")
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), sink)
    assert len(bluez.method_calls("StartDiscovery", "hci0")) == 2
    # Adverts are routed by adapter: a device seen by hci1 is not this session's.
    bluez.add_device(DEV_B, service_uuids=[HEART], adapter="hci1")
    await barrier(bluez, sink, service_uuids=[HEART])
    await session.stop()
    assert sink.addresses() == [MARKER]


@pytest.mark.asyncio
async def test_candidate_data_never_reaches_the_logs(
    bluez: BluezController, caplog: pytest.LogCaptureFixture
) -> None:
    canary_in, canary_out = "CANARY-in-7f3a", "CANARY-out-91bc"
    caplog.set_level(logging.DEBUG)
    logging.getLogger("bleak").setLevel(logging.NOTSET)
    sink = RecordingSink()
    provider = BleProvider()
    session = await provider.start(ble_scope(service_uuids=(HEART,)), sink)
    bluez.add_device(DEV_B, name=canary_out, manufacturer_data={APPLE: canary_out.encode()})
    bluez.add_device(
        DEV_A, name=canary_in, service_uuids=[HEART], manufacturer_data={APPLE: canary_in.encode()}
    )
    await sink.wait_for(at(DEV_A))
    await session.stop()
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    for secret in (canary_in, canary_out, DEV_A, DEV_B, DEV_A.replace(":", "_")):
        assert secret not in text


@pytest.mark.asyncio
async def test_nothing_is_left_running_after_stop(bluez: BluezController) -> None:
    before = asyncio.all_tasks()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), RecordingSink())
    assert isinstance(session, BleSession)
    pid = session.worker_pid
    assert pid is not None and bluez.clients() == [session.unique_name]
    await session.stop()
    await asyncio.sleep(0)  # real peer: one loop turn, for the worker pipe's reader to take its EOF
    leftovers = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert leftovers == []
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert not bluez.discovering() and bluez.clients() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker exited and was reaped


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_a_burst_of_adverts_reaches_the_sink_complete_and_in_order(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(service_uuids=(HEART,)), sink)
    bluez.add_device(DEV_A, service_uuids=[HEART], rssi=-90)
    await sink.wait_for(at(DEV_A, rssi=-90))
    values = [-30 - i % 50 for i in range(1000)] + [-7]
    bluez.burst_rssi(DEV_A, values)
    await sink.wait_for(at(DEV_A, rssi=-7), timeout=10)
    await session.stop()
    # Every report was re-filtered; within one batch only a device's latest crosses, in order.
    seen = [o.rssi for o in sink.observations[1:]]
    assert seen[-1] == -7 and 1 <= len(seen) <= len(values)
    positions = iter(range(len(values)))
    assert all(any(values[i] == rssi for i in positions) for rssi in seen)


@pytest.mark.asyncio
async def test_the_connectors_bus_link_stays_connected_across_sessions(bluez: BluezController) -> None:
    provider = BleProvider()
    first = await provider.start(ble_scope(service_uuids=(HEART,)), RecordingSink())
    assert isinstance(first, BleSession)
    await first.stop()
    bus = first._link._bus
    assert bus is not None and bus.connected  # no reconnect (and no lost match rules) per scan
    second = await provider.start(ble_scope(service_uuids=(HEART,)), RecordingSink())
    assert isinstance(second, BleSession) and second._link is first._link
    await second.stop()
    assert first._link._bus is bus
