"""The emulated bluetoothd keeps BlueZ's rules (src/adapter.c, src/device.c): checked with plain clients."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from tests.providers.bluez_mock import BluezController, bluez, device_path

__all__ = ["bluez"]  # the fixture, imported above

ADAPTER = "/org/bluez/hci0"
DEV = "AA:BB:CC:00:00:07"
HEART = "0000180d-0000-1000-8000-00805f9b34fb"


class Client:
    """One D-Bus client of bluetoothd, recording the Device1 PropertiesChanged it receives (and the order of
    replies and adapter signals in `events`)."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self.changes: list[tuple[dict[str, Any], list[str]]] = []
        self.events: list[str] = []
        bus.add_message_handler(self._on_message)

    def _on_message(self, msg: Message) -> None:
        is_change = msg.message_type == MessageType.SIGNAL and msg.member == "PropertiesChanged"
        if is_change and msg.body[0] == "org.bluez.Device1":
            self.changes.append(({k: _plain(v) for k, v in msg.body[1].items()}, list(msg.body[2])))
        elif is_change and msg.body[0] == "org.bluez.Adapter1" and "Discovering" in msg.body[1]:
            self.events.append(f"Discovering={msg.body[1]['Discovering'].value}")
        elif msg.message_type in (MessageType.METHOD_RETURN, MessageType.ERROR):
            self.events.append(msg.error_name or "return")

    async def call(self, member: str, sig: str = "", *body: Any) -> Message:
        msg = Message(
            destination="org.bluez",
            path=ADAPTER,
            interface="org.bluez.Adapter1",
            member=member,
            signature=sig,
            body=list(body),
        )
        reply = await self.bus.call(msg)
        assert reply is not None
        return reply

    async def settle(self) -> None:
        """One round trip: every signal emitted before it has arrived."""
        await self.call("SetDiscoveryFilter", "a{sv}", {"Transport": Variant("s", "le")})


def _plain(value: Any) -> Any:
    if isinstance(value, Variant):
        return _plain(value.value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


LE_FILTER = {"Transport": Variant("s", "le"), "DuplicateData": Variant("b", True), "RSSI": Variant("n", -127)}


async def started(client: Client, flt: dict[str, Variant] | None = None) -> None:
    """SetDiscoveryFilter (when given) and StartDiscovery, both answered with success."""
    if flt is not None:
        assert (
            await client.call("SetDiscoveryFilter", "a{sv}", flt)
        ).message_type == MessageType.METHOD_RETURN
    reply = await client.call("StartDiscovery")
    assert reply.message_type == MessageType.METHOD_RETURN, reply.error_name


async def until(check: Any, timeout: float = 3.0) -> None:
    """Poll the emulator until `check()` holds (its timers run in its own process)."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)  # real peer: the emulator's timers run in its own process


async def connect() -> Client:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    rule = "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged'"
    await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[rule],
        )
    )
    return Client(bus)


@pytest_asyncio.fixture
async def client(bluez: BluezController) -> AsyncIterator[Client]:
    one = await connect()
    yield one
    one.bus.disconnect()


@pytest.mark.asyncio
async def test_sessions_are_per_sender_and_discovering_while_any_holds_one(
    bluez: BluezController, client: Client
) -> None:
    other = await connect()
    try:
        refused = await client.call("StopDiscovery")
        assert (refused.error_name, refused.body) == ("org.bluez.Error.Failed", ["No discovery started"])
        assert (await client.call("StartDiscovery")).message_type == MessageType.METHOD_RETURN
        again = await client.call("StartDiscovery")
        assert again.error_name == "org.bluez.Error.InProgress"
        assert (await other.call("StartDiscovery")).message_type == MessageType.METHOD_RETURN
        assert sorted(bluez.clients()) == sorted([str(client.bus.unique_name), str(other.bus.unique_name)])
        await client.call("StopDiscovery")
        assert bluez.discovering() and bluez.clients() == [other.bus.unique_name]
    finally:
        other.bus.disconnect()
    # adapter.c `discovery_disconnect`: the other client's session goes with its connection.
    for _ in range(100):
        if not bluez.discovering():
            break
        await asyncio.sleep(0.01)  # real peer: the emulated bluetoothd runs apart
    assert not bluez.discovering() and bluez.clients() == []


@pytest.mark.asyncio
async def test_rssi_moves_under_8_db_and_repeated_data_are_not_signalled_by_default(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(duplicate_filter=False)  # a controller that reports every advert
    await client.call("StartDiscovery")
    bluez.add_device(DEV, rssi=-60, manufacturer_data={0x4C: b"\x01"})
    for rssi in (-62, -66, -67):  # less than 8 dB from -60: nothing
        bluez.advertise(DEV, rssi=rssi)
    bluez.advertise(DEV, rssi=-70)  # 10 dB from the last signalled value
    bluez.advertise(DEV, rssi=-70, manufacturer_data={0x4C: b"\x02"})  # new data
    await client.settle()
    assert [c for c, _ in client.changes] == [{"RSSI": -70}, {"ManufacturerData": {0x4C: b"\x02"}}]


@pytest.mark.asyncio
async def test_an_rssi_filter_and_duplicate_data_signal_every_report(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(duplicate_filter=False)
    wanted = {"DuplicateData": Variant("b", True), "RSSI": Variant("n", -127)}
    await client.call("SetDiscoveryFilter", "a{sv}", wanted)
    await client.call("StartDiscovery")
    bluez.add_device(DEV, rssi=-60, manufacturer_data={0x4C: b"\x01"})
    for _ in range(3):
        bluez.advertise(DEV, rssi=-60)
    await client.settle()
    assert [c for c, _ in client.changes] == [{"RSSI": -60, "ManufacturerData": {0x4C: b"\x01"}}] * 3


@pytest.mark.asyncio
async def test_filters_are_merged_across_clients(bluez: BluezController, client: Client) -> None:
    heart = {"UUIDs": Variant("as", [HEART])}
    await client.call("SetDiscoveryFilter", "a{sv}", heart)
    await client.call("StartDiscovery")
    assert not bluez.advertise(DEV, rssi=-50, service_uuids=[])  # nobody wants it
    assert bluez.advertise("AA:BB:CC:00:00:09", rssi=-50, service_uuids=[HEART])
    wide = await connect()
    try:
        await wide.call("StartDiscovery")  # no filter: everything is reported to every client
        assert bluez.advertise("AA:BB:CC:00:00:08", rssi=-50, service_uuids=[])
    finally:
        wide.bus.disconnect()


@pytest.mark.asyncio
async def test_the_last_session_ending_clears_rssi_but_keeps_the_device(
    bluez: BluezController, client: Client
) -> None:
    await client.call("StartDiscovery")
    bluez.add_device(DEV, rssi=-60, tx_power=-4)
    await client.call("StopDiscovery")
    await client.settle()
    assert client.changes[-1] == ({}, ["RSSI", "TxPower"])
    props = bluez.device_props(DEV)
    assert props is not None and "RSSI" not in props and props["Address"] == DEV
    assert device_path("hci0", DEV).endswith("dev_AA_BB_CC_00_00_07")


@pytest.mark.asyncio
async def test_knobs_stall_one_sender_and_wedge_the_daemon(bluez: BluezController, client: Client) -> None:
    await client.call("StartDiscovery")
    bluez.stall_stop(client.bus.unique_name)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await client.call("StopDiscovery")
    assert bluez.clients() == [client.bus.unique_name]  # never answered: the session stays
    bluez.wedge()
    other = await connect()
    pending = asyncio.ensure_future(other.call("StartDiscovery"))
    await asyncio.sleep(0.2)  # real peer: a wedged bluetoothd (emulated) never answers
    assert not pending.done()
    bluez.unwedge()
    assert (await pending).message_type == MessageType.METHOD_RETURN
    other.bus.disconnect()


# ---------------------------------------------------------------------- the controller and its scan cycle


@pytest.mark.asyncio
async def test_the_controller_reports_a_device_once_per_scan_until_the_cycle_restarts_it(
    bluez: BluezController, client: Client
) -> None:
    await started(client, LE_FILTER)
    assert [bluez.advertise(DEV, rssi=-60) for _ in range(3)] == [True, False, False]
    scans = bluez.scans_started()
    assert bluez.end_cycle()  # DISCOV_LE_TIMEOUT: a filtered discovery restarts at once
    await until(lambda: bluez.scans_started() == scans + 1 and bluez.scanning())
    assert bluez.discovering()  # bluetoothd's Discovering never dropped
    assert bluez.advertise(DEV, rssi=-60)
    bluez.configure(duplicate_filter=False)  # e.g. an advertisement monitor registered
    assert bluez.advertise(DEV, rssi=-60) and bluez.advertise(DEV, rssi=-60)


@pytest.mark.asyncio
async def test_a_regular_discovery_restarts_after_the_idle_timeout(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(idle_s=0.3)
    await started(client)  # no filter: regular discovery
    bluez.end_cycle()
    assert not bluez.scanning() and bluez.discovering()
    assert not bluez.advertise(DEV)  # nothing is heard while bluetoothd waits
    await until(bluez.scanning)
    assert bluez.advertise(DEV)


@pytest.mark.asyncio
async def test_only_a_change_of_the_merged_filter_restarts_the_scan(
    bluez: BluezController, client: Client
) -> None:
    await started(client, LE_FILTER)
    assert bluez.advertise(DEV)
    scans = bluez.scans_started()
    joining = await connect()
    try:
        await started(joining, LE_FILTER)  # "filters were equal, deciding to not restart the scan"
        higher = {**LE_FILTER, "RSSI": Variant("n", -60)}  # the merged RSSI is the lowest: unchanged
        await joining.call("SetDiscoveryFilter", "a{sv}", higher)
        assert bluez.scans_started() == scans and not bluez.advertise(DEV)
        pathloss = {"Transport": Variant("s", "le"), "Pathloss": Variant("q", 137)}
        await joining.call("SetDiscoveryFilter", "a{sv}", pathloss)  # the merged RSSI goes: a restart
        await until(lambda: bluez.scans_started() == scans + 1 and bluez.scanning())
        assert bluez.advertise(DEV)
    finally:
        joining.bus.disconnect()


@pytest.mark.asyncio
async def test_a_start_from_idle_always_starts_the_kernel(bluez: BluezController, client: Client) -> None:
    await started(client, LE_FILTER)
    await client.call("StopDiscovery")
    assert not bluez.scanning() and not bluez.discovering()
    scans = bluez.scans_started()
    await started(client)  # the kept filter, unchanged: started anyway, since nothing was discovering
    assert bluez.scans_started() == scans + 1 and bluez.scanning()


# ------------------------------------------------------------------------ filters and clients


@pytest.mark.asyncio
async def test_filters_outlive_stop_discovery_and_a_filter_only_disconnect_stops_the_adapter(
    bluez: BluezController, client: Client
) -> None:
    await started(client, LE_FILTER)
    await client.call("StopDiscovery")
    assert bluez.presets() == [client.bus.unique_name]  # discovery_remove kept it in set_filter_list
    listener = await connect()
    try:
        await started(listener, LE_FILTER)
        client.bus.disconnect()  # discovery_disconnect -> discovery_stop: one other client discovering
        await until(lambda: not bluez.discovering())
        assert bluez.clients() == [listener.bus.unique_name]  # still registered, and deaf
        assert not bluez.scanning() and not bluez.advertise(DEV)
    finally:
        listener.bus.disconnect()


@pytest.mark.asyncio
async def test_a_filter_only_disconnect_leaves_two_discovering_clients_alone(
    bluez: BluezController, client: Client
) -> None:
    await client.call("SetDiscoveryFilter", "a{sv}", LE_FILTER)  # pre-set only
    first, second = await connect(), await connect()
    try:
        await started(first, LE_FILTER)
        await started(second, LE_FILTER)
        client.bus.disconnect()
        await until(lambda: bluez.presets() == [])
        assert bluez.discovering() and bluez.scanning()
    finally:
        first.bus.disconnect()
        second.bus.disconnect()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "flt",
    [
        {"Colour": Variant("s", "red")},  # unknown key
        {"RSSI": Variant("i", -70)},  # RSSI is an int16
        {"RSSI": Variant("n", -128)},
        {"RSSI": Variant("n", -70), "Pathloss": Variant("q", 20)},  # never both
        {"Pathloss": Variant("q", 138)},
        {"Transport": Variant("s", "radio")},
        {"UUIDs": Variant("as", ["not-a-uuid"])},
        {"DuplicateData": Variant("s", "yes")},
    ],
)
async def test_filter_parsing_is_strict(
    bluez: BluezController, client: Client, flt: dict[str, Variant]
) -> None:
    reply = await client.call("SetDiscoveryFilter", "a{sv}", flt)
    assert reply.error_name == "org.bluez.Error.InvalidArguments"
    assert bluez.filters() == {}


@pytest.mark.asyncio
async def test_uuids_are_matched_on_the_uuid_lists_only(bluez: BluezController, client: Client) -> None:
    await started(client, {**LE_FILTER, "UUIDs": Variant("as", ["fcd2"])})
    bthome = "0000fcd2-0000-1000-8000-00805f9b34fb"
    assert not bluez.advertise(DEV, service_data={"fcd2": b"\x40\x01"})  # kernel `is_filter_match`
    assert bluez.advertise("AA:BB:CC:00:00:08", service_uuids=[bthome])
    assert bluez.filters()[str(client.bus.unique_name)]["UUIDs"] == [bthome]  # kept in 128-bit form


# ------------------------------------------------------------------------------------ devices


@pytest.mark.asyncio
async def test_service_data_uuids_join_uuids_and_manufacturer_data_merges_per_company(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(duplicate_filter=False)
    await started(client)  # no DuplicateData: data is merged and signalled on change
    bluez.add_device(
        DEV, service_uuids=[HEART], service_data={"fcd2": b"\x40"}, manufacturer_data={1: b"\x01"}
    )
    bluez.advertise(DEV, manufacturer_data={2: b"\x02"})
    await client.settle()
    props = bluez.device_props(DEV)
    assert props is not None
    assert props["UUIDs"] == [HEART, "0000fcd2-0000-1000-8000-00805f9b34fb"]
    assert props["ManufacturerData"] == {"1": "01", "2": "02"}  # company 1 kept from the first report
    assert client.changes[-1][0] == {"ManufacturerData": {1: b"\x01", 2: b"\x02"}}


@pytest.mark.asyncio
async def test_duplicate_data_replaces_manufacturer_data_at_every_report(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(duplicate_filter=False)
    await started(client, LE_FILTER)
    bluez.add_device(DEV, manufacturer_data={1: b"\x01"})
    bluez.forget_advert(DEV)
    bluez.advertise(DEV, manufacturer_data={2: b"\x02"})
    props = bluez.device_props(DEV)
    assert props is not None and props["ManufacturerData"] == {"2": "02"}


@pytest.mark.asyncio
async def test_a_0_dbm_report_invalidates_rssi(bluez: BluezController, client: Client) -> None:
    bluez.configure(duplicate_filter=False)
    await started(client, LE_FILTER)
    bluez.add_device(DEV, rssi=-40)
    bluez.advertise(DEV, rssi=0)
    await client.settle()
    assert client.changes[-1] == ({}, ["RSSI"])  # device.c `dev_property_exists_rssi`


@pytest.mark.asyncio
async def test_reports_of_one_processing_cycle_merge_into_one_signal(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(duplicate_filter=False)
    await started(client, LE_FILTER)
    bluez.add_device(DEV, rssi=-40)
    bluez.burst_rssi(DEV, [-41, -42, -43])  # one control call: one main-loop cycle of bluetoothd
    await client.settle()
    assert [c for c, _ in client.changes] == [{"RSSI": -43}]


@pytest.mark.asyncio
async def test_temporary_devices_go_after_the_timeout_at_the_end_of_discovery_and_on_power_off(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(temporary_timeout_s=0.3)
    await started(client, LE_FILTER)
    bluez.add_device(DEV)
    await until(lambda: bluez.device_props(DEV) is None)  # device.c `device_disappeared`
    beacon, tag, known = "AA:BB:CC:00:00:0B", "AA:BB:CC:00:00:0C", "AA:BB:CC:00:00:0D"
    bluez.configure(temporary_timeout_s=30)
    bluez.add_device(beacon, connectable=False)
    bluez.add_device(tag)
    bluez.add_cached(known)
    await client.call("StopDiscovery")  # `discovery_cleanup`: temporary and not connectable
    assert bluez.device_props(beacon) is None and bluez.device_props(tag) is not None
    bluez.set_powered(False)  # `remove_temporary_devices`
    assert bluez.device_props(tag) is None and bluez.device_props(known) is not None


@pytest.mark.asyncio
async def test_a_bredr_device_is_found_only_while_the_discovery_includes_bredr(
    bluez: BluezController, client: Client
) -> None:
    phone = "AA:BB:CC:00:00:0E"
    await started(client, LE_FILTER)
    assert not bluez.advertise(phone, name="Phone", device_class=0x5A020C)
    plain = await connect()
    try:
        await started(plain)  # another program's regular discovery: BR/EDR and LE
        assert bluez.advertise(phone, name="Phone", device_class=0x5A020C)
        props = bluez.device_props(phone)
        assert props is not None and props["Class"] == 0x5A020C and props["AddressType"] == "public"
    finally:
        plain.bus.disconnect()


# ------------------------------------------------------------------ two stages and the kernel's errors


@pytest.mark.asyncio
async def test_start_and_stop_are_answered_when_the_kernel_completes_then_discovering_follows(
    bluez: BluezController, client: Client
) -> None:
    bluez.configure(mgmt_delay_s=0.2)
    pending = asyncio.ensure_future(client.call("StartDiscovery"))
    await bluez.called("StartDiscovery", unless=pending)
    assert bluez.clients() == [client.bus.unique_name] and not bluez.discovering() and not pending.done()
    assert (await pending).message_type == MessageType.METHOD_RETURN
    await client.call("StopDiscovery")
    await client.settle()
    assert client.events == ["return", "Discovering=True", "return", "Discovering=False", "return"]


@pytest.mark.asyncio
async def test_a_failed_kernel_start_answers_in_progress_and_keeps_the_filter(
    bluez: BluezController, client: Client
) -> None:
    bluez.fail_kernel_start()
    await client.call("SetDiscoveryFilter", "a{sv}", LE_FILTER)
    reply = await client.call("StartDiscovery")
    assert reply.error_name == "org.bluez.Error.InProgress"
    assert bluez.clients() == [] and not bluez.discovering()
    assert bluez.presets() == [client.bus.unique_name]  # bleak leaves it there: the client must clear it


@pytest.mark.asyncio
async def test_a_rejected_kernel_stop_leaves_discovering_true_with_no_client(
    bluez: BluezController, client: Client
) -> None:
    await started(client, LE_FILTER)
    bluez.reject_kernel_stop()
    reply = await client.call("StopDiscovery")
    assert reply.error_name == "org.bluez.Error.InProgress"
    assert bluez.clients() == [] and bluez.discovering() and not bluez.scanning()
    # The kept filter is equal and Discovering stale: the next start is answered at once, deaf.
    await started(client)
    assert not bluez.scanning() and not bluez.advertise(DEV)


@pytest.mark.asyncio
async def test_a_kernel_that_stops_by_itself_is_restarted(bluez: BluezController, client: Client) -> None:
    await started(client, LE_FILTER)
    bluez.end_cycle()
    await until(bluez.scanning)
    assert bluez.discovering()
