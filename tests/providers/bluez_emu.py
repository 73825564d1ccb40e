"""An emulated bluetoothd for the tests: owns `org.bluez` on a private bus and keeps bluetoothd's rules.

Run as a process of its own (`python bluez_emu.py BUS_ADDRESS`); `bluez_mock.BluezController` drives it
through one JSON control method (`org.bluez.Emulator.Control` on `/org/bluez/emulator`). Written on
dbus-fast's low-level message handler, because the rules need what a high-level service object hides: the
sender of each call, replies that are sent later or never, and a main loop that can be wedged.

The rules, each after the BlueZ function it models (bluez/bluez, src/adapter.c and src/device.c):
- discovery clients are kept per D-Bus sender per adapter (adapter.c `start_discovery`,
  `get_discovery_client`); `Discovering` is true while any client holds a session;
- a second StartDiscovery of one sender answers `org.bluez.Error.InProgress` (`btd_error_busy`);
- StopDiscovery of a sender without a session answers `org.bluez.Error.Failed` "No discovery started"
  (adapter.c `stop_discovery`); on a powered-off adapter every discovery call answers `NotReady`;
- a client's session and pre-set filter go when its connection goes (adapter.c `discovery_disconnect`,
  the disconnect watch on NameOwnerChanged);
- filters are per client (adapter.c `set_discovery_filter`, pre-set filters kept in `set_filter_list`);
  reports are delivered when any client would take them (adapter.c `merge_discovery_filters`,
  `is_filter_match`: a client without a filter takes everything);
- RSSI is signalled only on a move of 8 dB or more (device.c `device_set_rssi` -> `RSSI_THRESHOLD`), and on
  every report once a discovering client set an RSSI or Pathloss filter (adapter.c `btd_adapter_device_found`
  -> `device_set_rssi_with_delta(dev, rssi, 0)` under `discovery_filter_has_proximity`);
- ManufacturerData / ServiceData are signalled only when they change, and on every report while a client
  set `DuplicateData` (device.c `device_set_manufacturer_data` / `device_set_service_data` clear the old
  data first when `duplicate`, see adapter.c `filter_duplicate_data`); TxPower only on change
  (device.c `device_set_tx_power`);
- when the last session ends, RSSI and TxPower are invalidated on every device found during discovery while
  the Device1 objects stay cached (adapter.c `discovery_cleanup` -> `invalidate_rssi_and_tx_power`);
- changes of one report go out as one PropertiesChanged (gdbus/object.c coalesces pending changes).

Knobs: StopDiscovery that never answers (the next caller, or one sender), StopDiscovery that answers an
error, StartDiscovery that fails or powers the adapter off, and `wedge`: the daemon's main loop stops
serving calls and its disconnect watch (both resume in order on `unwedge`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

BLUEZ = "org.bluez"
ADAPTER = "org.bluez.Adapter1"
DEVICE = "org.bluez.Device1"
PROPS = "org.freedesktop.DBus.Properties"
OM = "org.freedesktop.DBus.ObjectManager"
CONTROL_PATH = "/org/bluez/emulator"
CONTROL_IFACE = "org.bluez.Emulator"
RSSI_THRESHOLD = 8  # src/device.c
STREAM_UUID = "0000180d-0000-1000-8000-00805f9b34fb"  # what benchmark streams advertise
_NOT_READY = ("org.bluez.Error.NotReady", "Resource Not Ready")
_ADVERT_KEYS = ("RSSI", "TxPower", "ManufacturerData", "ServiceData")


@dataclass
class Client:
    """One discovery client of one adapter (adapter.c `struct discovery_client`)."""

    filter: dict[str, Any] | None = None
    discovering: bool = False


@dataclass
class Device:
    """One Device1 object and the advertising state BlueZ keeps for it."""

    path: str
    adapter: str
    props: dict[str, Variant]
    rssi: int = 0  # 0 = none, as in device.c
    tx_power: int = 127  # 127 = none
    found: bool = False  # in adapter->discovery_found


@dataclass
class Adapter:
    """One Adapter1 object with its discovery clients."""

    name: str
    powered: bool = True
    clients: dict[str, Client] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The object path."""
        return f"/org/bluez/{self.name}"

    def discovering(self) -> bool:
        """True while any client holds a discovery session."""
        return any(c.discovering for c in self.clients.values())

    def props(self) -> dict[str, Variant]:
        """Adapter1 properties as BlueZ reports them."""
        return {
            "Address": Variant("s", "00:00:00:00:00:00"),
            "Name": Variant("s", self.name),
            "Alias": Variant("s", self.name),
            "Powered": Variant("b", self.powered),
            "Discovering": Variant("b", self.discovering()),
            "Discoverable": Variant("b", False),
            "Pairable": Variant("b", False),
            "Roles": Variant("as", ["central", "peripheral"]),
            "UUIDs": Variant("as", []),
        }


def _bytes_dict(sig: str, data: dict[Any, str]) -> Variant:
    key = int if sig == "a{qv}" else str
    return Variant(sig, {key(k): Variant("ay", bytes.fromhex(v)) for k, v in data.items()})


class Emulator:
    """The daemon's state and its D-Bus behaviour."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self.adapters: dict[str, Adapter] = {}
        self.devices: dict[str, Device] = {}
        self.calls: list[tuple[str, str, str, Any]] = []  # (sender, path, member, args)
        self.stall_next_stop = False
        self.stall_senders: set[str] = set()
        self.stalled: list[tuple[str, Message]] = []
        self.fail_stop: tuple[str, str] | None = None
        self.fail_start: str | None = None
        self.power_off_on_start = False
        self.wedge_after_start = False
        self._unanswered: list[Message] = []
        self.wedged = False
        self._backlog: list[Message] = []
        self.stream_sent = 0
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- dispatch --------------------------------------------------------------------------------------

    def on_message(self, msg: Message) -> bool | Message | None:
        """Every message the bus delivers to us."""
        if msg.message_type == MessageType.METHOD_CALL and msg.path == CONTROL_PATH:
            return self._control(msg)
        if msg.message_type not in (MessageType.METHOD_CALL, MessageType.SIGNAL):
            return None
        if self.wedged:
            self._backlog.append(msg)
            return True
        return self._serve(msg)

    def _serve(self, msg: Message) -> bool | Message | None:
        if msg.message_type == MessageType.SIGNAL:
            if msg.member == "NameOwnerChanged" and msg.body[2] == "":
                self._client_gone(msg.body[0])
            return None
        try:
            reply = self._call(msg)
        except _Refusal as refusal:
            return Message.new_error(msg, refusal.name, refusal.text)
        if reply is True:
            return True
        return reply if isinstance(reply, Message) else Message.new_method_return(msg)

    def _call(self, msg: Message) -> Message | bool | None:
        self.calls.append((msg.sender or "", msg.path or "", msg.member or "", _plain(msg.body)))
        if msg.interface == OM and msg.member == "GetManagedObjects":
            return Message.new_method_return(msg, "a{oa{sa{sv}}}", [self._managed()])
        if msg.interface == "org.freedesktop.DBus.Introspectable":
            return Message.new_method_return(msg, "s", ["<node/>"])
        if msg.interface == "org.freedesktop.DBus.Peer" and msg.member == "Ping":
            return None
        if msg.interface == PROPS:
            return self._properties(msg)
        adapter = self._adapter_at(msg.path)
        if msg.interface == ADAPTER and adapter is not None:
            handler: Callable[[Adapter, Message], Message | bool | None] | None = {
                "SetDiscoveryFilter": self._set_filter,
                "StartDiscovery": self._start,
                "StopDiscovery": self._stop,
                "RemoveDevice": self._remove_device_call,
            }.get(msg.member or "")
            if handler is not None:
                return handler(adapter, msg)
        raise _Refusal("org.freedesktop.DBus.Error.UnknownMethod", "Unknown method")

    # ---- objects ---------------------------------------------------------------------------------------

    def _adapter_at(self, path: str | None) -> Adapter | None:
        for adapter in self.adapters.values():
            if adapter.path == path:
                return adapter
        return None

    def _managed(self) -> dict[str, dict[str, dict[str, Variant]]]:
        objects: dict[str, dict[str, dict[str, Variant]]] = {}
        for adapter in self.adapters.values():
            objects[adapter.path] = {ADAPTER: adapter.props()}
        for device in self.devices.values():
            objects[device.path] = {DEVICE: dict(device.props)}
        return objects

    def _props_of(self, path: str | None, iface: str) -> dict[str, Variant]:
        adapter = self._adapter_at(path)
        if adapter is not None and iface == ADAPTER:
            return adapter.props()
        device = self.devices.get(path or "")
        if device is not None and iface == DEVICE:
            return device.props
        raise _Refusal("org.freedesktop.DBus.Error.UnknownObject", "Unknown object")

    def _properties(self, msg: Message) -> Message:
        if msg.member == "GetAll":
            return Message.new_method_return(msg, "a{sv}", [self._props_of(msg.path, msg.body[0])])
        if msg.member == "Get":
            props = self._props_of(msg.path, msg.body[0])
            if msg.body[1] not in props:
                raise _Refusal("org.freedesktop.DBus.Error.InvalidArgs", "No such property")
            return Message.new_method_return(msg, "v", [props[msg.body[1]]])
        raise _Refusal("org.freedesktop.DBus.Error.UnknownMethod", "Unknown method")

    def _changed(self, path: str, iface: str, changed: dict[str, Variant], invalidated: list[str]) -> None:
        if changed or invalidated:
            signal_ = Message.new_signal(
                path, PROPS, "PropertiesChanged", "sa{sv}as", [iface, changed, invalidated]
            )
            self.bus.send(signal_)

    def _adapter_changed(self, adapter: Adapter, was_discovering: bool) -> None:
        if adapter.discovering() != was_discovering:
            self._changed(adapter.path, ADAPTER, {"Discovering": Variant("b", adapter.discovering())}, [])
            if was_discovering:
                self._discovery_cleanup(adapter)

    def _discovery_cleanup(self, adapter: Adapter) -> None:
        """adapter.c `discovery_cleanup` -> `invalidate_rssi_and_tx_power`: Device1 objects stay cached."""
        for device in self.devices.values():
            if device.adapter != adapter.name or not device.found:
                continue
            device.found = False
            gone: list[str] = [k for k in ("RSSI", "TxPower") if k in device.props]
            for key in gone:
                del device.props[key]
            device.rssi, device.tx_power = 0, 127
            self._changed(device.path, DEVICE, {}, gone)

    # ---- discovery methods -----------------------------------------------------------------------------

    def _client(self, adapter: Adapter, sender: str) -> Client:
        return adapter.clients.setdefault(sender, Client())

    def _set_filter(self, adapter: Adapter, msg: Message) -> None:
        """adapter.c `set_discovery_filter`: per-sender; an empty dict clears the sender's filter."""
        if not adapter.powered:
            raise _Refusal(*_NOT_READY)
        parsed = _parse_filter(msg.body[0])
        client = adapter.clients.get(msg.sender or "")
        if client is None:
            if parsed is not None:
                adapter.clients[msg.sender or ""] = Client(filter=parsed)
            return
        client.filter = parsed
        if parsed is None and not client.discovering:
            del adapter.clients[msg.sender or ""]

    def _start(self, adapter: Adapter, msg: Message) -> bool | None:
        """adapter.c `start_discovery`."""
        if not adapter.powered:
            raise _Refusal(*_NOT_READY)
        if self.fail_start is not None:
            raise _Refusal(self.fail_start, "injected")
        client = self._client(adapter, msg.sender or "")
        if client.discovering:
            raise _Refusal("org.bluez.Error.InProgress", "Operation already in progress")
        was = adapter.discovering()
        client.discovering = True
        self._adapter_changed(adapter, was)
        if self.power_off_on_start:
            self._set_powered(adapter, False)
        if self.wedge_after_start:  # the session exists, but the main loop hangs before the reply goes out
            self.wedge_after_start = False
            self.wedged = True
            self._unanswered.append(msg)
            return True
        return None

    def _stop(self, adapter: Adapter, msg: Message) -> bool | None:
        """adapter.c `stop_discovery`; the stall knob keeps the reply forever (the session stays too)."""
        if not adapter.powered:
            raise _Refusal(*_NOT_READY)
        sender = msg.sender or ""
        client = adapter.clients.get(sender)
        if client is None or not client.discovering:
            raise _Refusal("org.bluez.Error.Failed", "No discovery started")
        if self.stall_next_stop or sender in self.stall_senders:
            self.stall_next_stop = False
            self.stalled.append((sender, msg))
            return True
        if self.fail_stop is not None:
            raise _Refusal(*self.fail_stop)
        self._end_session(adapter, sender)
        return None

    def _end_session(self, adapter: Adapter, sender: str) -> None:
        """adapter.c `discovery_stop` / `discovery_remove`."""
        was = adapter.discovering()
        adapter.clients.pop(sender, None)
        self._adapter_changed(adapter, was)

    def _client_gone(self, sender: str) -> None:
        """adapter.c `discovery_disconnect`: the watch on the client's bus name."""
        for adapter in self.adapters.values():
            if sender in adapter.clients:
                self._end_session(adapter, sender)
        self.stall_senders.discard(sender)
        self.stalled = [(s, m) for s, m in self.stalled if s != sender]

    def _remove_device_call(self, adapter: Adapter, msg: Message) -> None:
        path = msg.body[0]
        if path not in self.devices:
            raise _Refusal("org.bluez.Error.DoesNotExist", "Does Not Exist")
        self._remove_device(path)

    def _remove_device(self, path: str) -> None:
        self.devices.pop(path, None)
        self.bus.send(Message.new_signal("/", OM, "InterfacesRemoved", "oas", [path, [DEVICE]]))

    def _set_powered(self, adapter: Adapter, powered: bool) -> None:
        was = adapter.discovering()
        adapter.powered = powered
        if not powered:
            adapter.clients.clear()
        self._changed(adapter.path, ADAPTER, {"Powered": Variant("b", powered)}, [])
        self._adapter_changed(adapter, was)

    # ---- advertising reports (adapter.c `btd_adapter_device_found`) --------------------------------------

    def _takers(self, adapter: Adapter) -> list[Client]:
        return [c for c in adapter.clients.values() if c.discovering]

    def _wanted(self, takers: list[Client], rssi: int, uuids: list[str]) -> bool:
        """adapter.c `merge_discovery_filters` + `is_filter_match`: any client that would take it."""
        for client in takers:
            flt = client.filter
            if flt is None:
                return True
            wanted_uuids = flt.get("UUIDs") or []
            if wanted_uuids and not set(wanted_uuids) & set(uuids):
                continue
            if "RSSI" in flt and rssi < flt["RSSI"]:
                continue
            return True
        return False

    def report(self, adapter_name: str, address: str, adv: dict[str, Any]) -> bool:
        """One advertising report from the controller; True when BlueZ passed it on."""
        adapter = self.adapters[adapter_name]
        takers = self._takers(adapter)
        rssi = int(adv["rssi"])
        uuids = [u.lower() for u in adv.get("uuids", [])]
        if not takers or not self._wanted(takers, rssi, uuids):
            return False
        proximity = any(c.filter and ("RSSI" in c.filter or "Pathloss" in c.filter) for c in takers)
        duplicate = any(c.filter and c.filter.get("DuplicateData") for c in takers)
        path = f"{adapter.path}/dev_{address.replace(':', '_').upper()}"
        device = self.devices.get(path)
        if device is None:
            self._new_device(adapter, path, address, adv, rssi, uuids)
            return True
        device.found = True
        self._changed(path, DEVICE, self._merge(device, adv, rssi, uuids, proximity, duplicate), [])
        return True

    def _new_device(
        self, adapter: Adapter, path: str, address: str, adv: dict[str, Any], rssi: int, uuids: list[str]
    ) -> None:
        props: dict[str, Variant] = {
            "Address": Variant("s", address),
            "AddressType": Variant("s", "random"),
            "Alias": Variant("s", adv.get("name") or address.replace(":", "-")),
            "Adapter": Variant("o", adapter.path),
            "Paired": Variant("b", False),
            "Bonded": Variant("b", False),
            "Trusted": Variant("b", False),
            "Blocked": Variant("b", False),
            "Connected": Variant("b", False),
            "LegacyPairing": Variant("b", False),
            "ServicesResolved": Variant("b", False),
            "UUIDs": Variant("as", uuids),
            "RSSI": Variant("n", rssi),
        }
        if adv.get("name") is not None:
            props["Name"] = Variant("s", adv["name"])
        if adv.get("tx_power") is not None:
            props["TxPower"] = Variant("n", int(adv["tx_power"]))
        if adv.get("mfr"):
            props["ManufacturerData"] = _bytes_dict("a{qv}", adv["mfr"])
        if adv.get("sd"):
            props["ServiceData"] = _bytes_dict("a{sv}", adv["sd"])
        device = Device(path, adapter.name, props, rssi=rssi, found=True)
        device.tx_power = int(adv["tx_power"]) if adv.get("tx_power") is not None else 127
        self.devices[path] = device
        self.bus.send(Message.new_signal("/", OM, "InterfacesAdded", "oa{sa{sv}}", [path, {DEVICE: props}]))

    def _merge(
        self,
        device: Device,
        adv: dict[str, Any],
        rssi: int,
        uuids: list[str],
        proximity: bool,
        duplicate: bool,
    ) -> dict[str, Variant]:
        changed: dict[str, Variant] = {}
        # device.c `device_set_rssi_with_delta`
        threshold = 0 if proximity else RSSI_THRESHOLD
        if device.rssi == 0 or abs(device.rssi - rssi) >= threshold:
            if device.rssi != rssi or threshold == 0:
                changed["RSSI"] = Variant("n", rssi)
            device.rssi = rssi
        tx = adv.get("tx_power")
        if tx is not None and int(tx) != device.tx_power:  # device.c `device_set_tx_power`
            device.tx_power = int(tx)
            changed["TxPower"] = Variant("n", int(tx))
        name = adv.get("name")
        if name is not None and _value(device.props.get("Name")) != name:
            changed["Name"] = changed["Alias"] = Variant("s", name)
        merged = sorted(set(_value(device.props["UUIDs"])) | set(uuids))
        if merged != sorted(_value(device.props["UUIDs"])):  # device.c `device_add_eir_uuids`
            changed["UUIDs"] = Variant("as", merged)
        for key, sig, src in (("ManufacturerData", "a{qv}", "mfr"), ("ServiceData", "a{sv}", "sd")):
            if adv.get(src):
                new = _bytes_dict(sig, adv[src])
                if duplicate or _value(device.props.get(key)) != _value(new):
                    changed[key] = new
        device.props.update(changed)
        return changed

    # ---- control ---------------------------------------------------------------------------------------

    def _control(self, msg: Message) -> Message:
        try:
            request = json.loads(msg.body[0])
            result = getattr(self, "c_" + request.pop("op"))(**request)
        except Exception as exc:  # a test's mistake: tell it, keep running
            return Message.new_error(msg, "org.bluez.Emulator.Error", f"{type(exc).__name__}: {exc}")
        return Message.new_method_return(msg, "s", [json.dumps(result)])

    def c_add_adapter(self, name: str, powered: bool = True) -> str:
        adapter = self.adapters[name] = Adapter(name, powered)
        self.bus.send(
            Message.new_signal(
                "/", OM, "InterfacesAdded", "oa{sa{sv}}", [adapter.path, {ADAPTER: adapter.props()}]
            )
        )
        return adapter.path

    def c_remove_adapter(self, name: str) -> None:
        adapter = self.adapters.pop(name)
        for path in [p for p, d in self.devices.items() if d.adapter == name]:
            self._remove_device(path)
        self.bus.send(Message.new_signal("/", OM, "InterfacesRemoved", "oas", [adapter.path, [ADAPTER]]))

    def c_set_powered(self, name: str, powered: bool) -> None:
        self._set_powered(self.adapters[name], powered)

    def c_report(self, adapter: str, address: str, adv: dict[str, Any]) -> bool:
        return self.report(adapter, address, adv)

    def c_reports(self, adapter: str, address: str, advs: list[dict[str, Any]]) -> int:
        return sum(self.report(adapter, address, adv) for adv in advs)

    def c_stream(self, adapter: str, addresses: list[str], count: int, rate: float, rssi: list[int]) -> None:
        """Emit `count` reports at `rate` per second, cycling over addresses and RSSI values (benchmarks)."""
        task = asyncio.get_running_loop().create_task(self._stream(adapter, addresses, count, rate, rssi))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stream(
        self, adapter: str, addresses: list[str], count: int, rate: float, rssi: list[int]
    ) -> None:
        self.stream_sent = 0
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(count):
            due = start + i / rate
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            adv = {"rssi": rssi[i % len(rssi)], "uuids": [STREAM_UUID], "name": "bench"}
            self.report(adapter, addresses[i % len(addresses)], adv)
            self.stream_sent = i + 1

    def c_streamed(self) -> int:
        """How many reports the current stream has emitted so far."""
        return self.stream_sent

    def c_add_cached(
        self, adapter: str, address: str, name: str | None = None, uuids: Sequence[str] = ()
    ) -> str:
        """A device BlueZ knows from before (paired or seen earlier): a Device1 without RSSI."""
        owner = self.adapters[adapter]
        path = f"{owner.path}/dev_{address.replace(':', '_').upper()}"
        props: dict[str, Variant] = {
            "Address": Variant("s", address),
            "AddressType": Variant("s", "random"),
            "Alias": Variant("s", name or address.replace(":", "-")),
            "Adapter": Variant("o", owner.path),
            "Paired": Variant("b", True),
            "Trusted": Variant("b", False),
            "Connected": Variant("b", False),
            "ServicesResolved": Variant("b", False),
            "UUIDs": Variant("as", list(uuids)),
        }
        if name is not None:
            props["Name"] = Variant("s", name)
        self.devices[path] = Device(path, adapter, props)
        self.bus.send(Message.new_signal("/", OM, "InterfacesAdded", "oa{sa{sv}}", [path, {DEVICE: props}]))
        return path

    def c_set_device(self, path: str, props: dict[str, Any]) -> None:
        """Non-advertising Device1 properties change (Trusted, Connected, Alias, ServicesResolved, ...)."""
        device = self.devices[path]
        typed = {k: Variant("b" if isinstance(v, bool) else "s", v) for k, v in props.items()}
        device.props.update(typed)
        self._changed(path, DEVICE, typed, [])

    def c_remove_device(self, path: str) -> None:
        self._remove_device(path)

    def c_device_props(self, path: str) -> dict[str, Any] | None:
        device = self.devices.get(path)
        return None if device is None else {k: _plain(v.value) for k, v in device.props.items()}

    def c_clients(self, adapter: str) -> list[str]:
        return sorted(s for s, c in self.adapters[adapter].clients.items() if c.discovering)

    def c_filters(self, adapter: str) -> dict[str, Any]:
        return {s: c.filter for s, c in self.adapters[adapter].clients.items()}

    def c_discovering(self, adapter: str) -> bool:
        return self.adapters[adapter].discovering()

    def c_calls(self, member: str) -> list[list[Any]]:
        return [[sender, path, args] for sender, path, m, args in self.calls if m == member]

    def c_stall_stop(self, sender: str | None = None) -> None:
        if sender is None:
            self.stall_next_stop = True
        else:
            self.stall_senders.add(sender)

    def c_release_stalled(self) -> int:
        """Answer every stalled StopDiscovery now (its session ends)."""
        stalled, self.stalled = self.stalled, []
        self.stall_senders.clear()
        self.stall_next_stop = False
        for sender, msg in stalled:
            for adapter in self.adapters.values():
                if sender in adapter.clients:
                    self._end_session(adapter, sender)
            self.bus.send(Message.new_method_return(msg))
        return len(stalled)

    def c_fail_stop(self, error: str | None, message: str = "Operation failed") -> None:
        self.fail_stop = None if error is None else (error, message)

    def c_fail_start(self, error: str | None) -> None:
        self.fail_start = error

    def c_power_off_on_start(self) -> None:
        self.power_off_on_start = True

    def c_wedge_after_start(self) -> None:
        self.wedge_after_start = True

    def c_wedge(self) -> None:
        self.wedged = True

    def c_unwedge(self) -> None:
        """The main loop runs again: everything that queued up is served in order."""
        self.wedged = False
        unanswered, self._unanswered = self._unanswered, []
        for msg in unanswered:
            self.bus.send(Message.new_method_return(msg))
        backlog, self._backlog = self._backlog, []
        for msg in backlog:
            reply = self._serve(msg)
            if isinstance(reply, Message):
                self.bus.send(reply)


class _Refusal(Exception):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name, self.text = name, text


def _parse_filter(raw: dict[str, Variant]) -> dict[str, Any] | None:
    """adapter.c `parse_discovery_filter_dict`; None for an empty filter."""
    parsed: dict[str, Any] = {}
    for key, variant in raw.items():
        value = variant.value
        if key == "RSSI" and not -127 <= value <= 20:  # adapter.c `parse_rssi`
            raise _Refusal("org.bluez.Error.InvalidArguments", "Invalid arguments in method call")
        parsed[key] = [u.lower() for u in value] if key == "UUIDs" else value
    # An all-default filter (only Transport, no UUIDs, no proximity, no DuplicateData) is regular discovery.
    defaults: dict[str, object] = {"Transport": parsed.get("Transport"), "DuplicateData": False, "UUIDs": []}
    effective = {k: v for k, v in parsed.items() if defaults.get(k, object()) != v}
    return parsed if effective else None


def _value(v: Any) -> Any:
    return _plain(v.value) if isinstance(v, Variant) else v


def _plain(v: Any) -> Any:
    if isinstance(v, Variant):
        return _plain(v.value)
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


class _FullBufferSafe:
    """The bus socket, answering a full send buffer with "0 bytes sent" instead of EAGAIN.

    dbus-fast 5.2.0's writer (dbus_fast/aio/message_bus.py `_MessageWriter.write_callback`) writes directly
    when its queue is empty and tears the connection down on BlockingIOError; a burst of signals from the
    emulator can fill the socket exactly. Zero bytes sent makes it wait for writability, as it does after
    a partial write.
    """

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def send(self, data: Any) -> int:
        try:
            return int(self._sock.send(data))
        except BlockingIOError:
            return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def main(address: str) -> None:
    """Own org.bluez on `address` and serve until SIGTERM."""
    bus = await MessageBus(bus_address=address).connect()
    assert bus._writer is not None
    bus._writer.sock = _FullBufferSafe(bus._writer.sock)  # type: ignore[assignment]  # a wrapping socket
    emulator = Emulator(bus)
    bus.add_message_handler(emulator.on_message)
    await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=["type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged'"],
        )
    )
    await bus.request_name(BLUEZ)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    lost = asyncio.ensure_future(bus.wait_for_disconnect())  # type: ignore[no-untyped-call]
    await asyncio.wait({lost, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if lost.done() and os.environ.get("BLUEZ_EMU_TRACE"):
        with open(os.environ["BLUEZ_EMU_TRACE"], "a") as trace:
            trace.write(f"disconnected: {lost.exception()!r}\n")
    bus.disconnect()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
