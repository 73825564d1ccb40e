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
    """One D-Bus client of bluetoothd, recording the Device1 PropertiesChanged it receives."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self.changes: list[tuple[dict[str, Any], list[str]]] = []
        bus.add_message_handler(self._on_message)

    def _on_message(self, msg: Message) -> None:
        is_change = msg.message_type == MessageType.SIGNAL and msg.member == "PropertiesChanged"
        if is_change and msg.body[0] == "org.bluez.Device1":
            self.changes.append(({k: _plain(v) for k, v in msg.body[1].items()}, list(msg.body[2])))

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
        await asyncio.sleep(0.01)
    assert not bluez.discovering() and bluez.clients() == []


@pytest.mark.asyncio
async def test_rssi_moves_under_8_db_and_repeated_data_are_not_signalled_by_default(
    bluez: BluezController, client: Client
) -> None:
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
    await asyncio.sleep(0.2)
    assert not pending.done()
    bluez.unwedge()
    assert (await pending).message_type == MessageType.METHOD_RETURN
    other.bus.disconnect()
