"""An emulated bluetoothd and controller for the tests: owns `org.bluez` on a private bus, keeps their rules.

Run as a process of its own (`python bluez_emu.py BUS_ADDRESS`); `bluez_mock.BluezController` drives it
through one JSON control method (`org.bluez.Emulator.Control` on `/org/bluez/emulator`). Written on
dbus-fast's low-level message handler, because the rules need what a high-level service object hides: the
sender of each call, replies that are sent later or never, and a main loop that can be wedged.

Three layers, each after the code it models (bluez/bluez src/adapter.c, src/device.c, src/eir.c; the
kernel's net/bluetooth/hci_sync.c and mgmt.c for the controller and the kernel stage):

The controller and the kernel (`Kernel`):
- the controller's duplicate filter: while one scan runs, each device is reported once (hci_sync.c
  `hci_active_scan_sync` enables `LE_SCAN_FILTER_DUP_ENABLE`); a new scan starts with an empty filter. The
  `duplicate_filter` knob turns it off (as an advertisement monitor does, same function);
- an LE discovery ends by itself after `cycle_s` (DISCOV_LE_TIMEOUT, 10.24 s; `le_scan_disable`) and the
  kernel sends the Discovering event; the `end_cycle` control ends it now (tests drive time);
- the kernel's result filter for service discovery (mgmt.c `is_filter_match`): a report under the merged
  RSSI is dropped, and with UUIDs only one whose advertised UUID *lists* hold one passes (`eir_has_uuids`);
  a duplicate-filtered device stays filtered even when the kernel dropped its one report;
- a BR/EDR device (an advert with `class`) is found only while the running discovery includes BR/EDR;
- mgmt commands complete after `mgmt_delay_s` (command complete first, then the Discovering event); knobs
  make the next start fail, the next stop be rejected (the kernel had ended its scan: its Discovering event
  follows the rejection, the race of bluez/bluez#807), or the kernel stop discovering by itself.

bluetoothd's discovery (adapter.c):
- clients per D-Bus sender (`start_discovery`, `get_discovery_client`); a second StartDiscovery of one
  sender answers `org.bluez.Error.InProgress` (`btd_error_busy`); StopDiscovery without a session answers
  `Failed` "No discovery started" (`stop_discovery`); on a powered-off adapter every call answers NotReady;
- filters (`set_discovery_filter`, `parse_discovery_filter_dict` with `parse_uuids`, `parse_rssi`,
  `parse_pathloss`, `parse_transport`, `parse_duplicate_data`, `parse_discoverable`, `parse_pattern`,
  `parse_auto_connect`): an unknown key, a value of another D-Bus type, an out-of-range value, or RSSI with
  Pathloss answer `InvalidArguments`; an empty dict clears the filter; a pre-set filter waits in
  `set_filter_list`, and `discovery_remove` puts a stopped client's filter back there (filters outlive
  StopDiscovery);
- the merged filter (`merge_discovery_filters`, `discovery_filter_to_mgmt_cp`): transports ORed, the lowest
  RSSI, none when any client has none (a Pathloss-only client clears it), UUIDs united unless one client has
  none; a regular client clears it all. `update_discovery_filter` restarts the scan only when the merged
  filter changed (`filters_equal`) or the adapter is not discovering;
- two stages: StartDiscovery / StopDiscovery are answered when the kernel command completes
  (`start_discovery_complete`, `stop_discovery_complete`, `discovery_complete`); a failed kernel start
  answers InProgress and removes the client; a rejected kernel stop answers InProgress, removes the client
  and leaves `Discovering` true;
- the restart logic: `trigger_start_discovery`, `start_discovery_timeout` (stop first when the kernel runs),
  `discovering_callback` (the kernel ended a scan: restart at once for a filtered discovery, after
  IDLE_DISCOV_TIMEOUT `idle_s` otherwise; a failed restart retries after twice that);
- a client's connection going (`discovery_disconnect` -> `discovery_stop`, also for a client that only
  pre-set a filter: with exactly one other client discovering, the adapter stops and `Discovering` turns
  false while that client stays registered);
- reports (`btd_adapter_device_found`): nothing while not discovering; a device object is created before
  the filter check; with a filtered discovery, bluetoothd's own `is_filter_match` (UUID lists only; its
  proximity test passes whenever a client has no Pathloss); RSSI on every report while a filtered discovery
  has a proximity client (`device_set_rssi_with_delta(dev, rssi, 0)`), else on 8 dB moves (`device_set_rssi`);
- the end of discovery (`discovery_cleanup`): RSSI and TxPower invalidated on found devices, temporary
  devices that are not connectable removed; power-off (`property_set_mode` -> `remove_temporary_devices`,
  then `adapter_stop`): every temporary device removed, every client and pre-set filter dropped.

Devices (device.c):
- a report's UUID lists and its service-data UUIDs join `UUIDs` (`device_add_eir_uuids`, `add_service_data`);
  manufacturer and service data merge per company id / UUID and signal on change, or on every report while
  a client set `DuplicateData` (`device_set_manufacturer_data` clears first, `filter_duplicate_data`);
  TxPower on change (`device_set_tx_power`); a 0 dBm report invalidates RSSI (`dev_property_exists_rssi`);
- a temporary device is removed `temporary_timeout_s` after its last report (`device_update_last_seen` ->
  `set_temporary_timer`, `device_disappeared`; main.c DEFAULT_TEMPORARY_TIMEOUT 30 s);
- property changes are sent when the main loop is idle, one PropertiesChanged per object with the latest
  values (gdbus/object.c `process_changes`): reports of one processing cycle merge.

Test knobs besides: StopDiscovery that never answers (the next caller, or one sender), StopDiscovery or
StartDiscovery that answers an error at once, a power-off while a kernel start is pending (the start then
answers InProgress: `discovery_free` of `adapter->client`) or right after a start, and `wedge`: the daemon's
main loop stops serving calls and its disconnect watch (both resume in order on `unwedge`).
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
BASE_UUID = "-0000-1000-8000-00805f9b34fb"
# adapter.c: SCAN_TYPE_BREDR (1 << BDADDR_BREDR), SCAN_TYPE_LE (LE public | LE random); a dual-mode adapter.
SCAN_TYPE_BREDR, SCAN_TYPE_LE = 0x01, 0x06
SCAN_TYPE_DUAL = SCAN_TYPE_BREDR | SCAN_TYPE_LE
HCI_RSSI_INVALID = 127
PATHLOSS_MAX = 137  # adapter.c
IDLE_DISCOV_TIMEOUT_S = 5.0  # adapter.c
DISCOV_LE_TIMEOUT_S = 10.24  # include/net/bluetooth/hci_core.h
DEFAULT_TEMPORARY_TIMEOUT_S = 30.0  # src/main.c
# mgmt status codes (lib/mgmt.h)
MGMT_OK, MGMT_BUSY, MGMT_REJECTED, MGMT_NOT_POWERED = 0x00, 0x0A, 0x0B, 0x0F
_NOT_READY = ("org.bluez.Error.NotReady", "Resource Not Ready")
_BUSY = ("org.bluez.Error.InProgress", "Operation already in progress")
_INVALID = ("org.bluez.Error.InvalidArguments", "Invalid arguments in method call")
# Merged kernel filter (`struct mgmt_cp_start_service_discovery`): (type, rssi, sorted uuids); None = regular.
MergedFilter = tuple[int, int, tuple[str, ...]]


@dataclass
class Client:
    """One discovery client of one adapter (adapter.c `struct discovery_client`)."""

    filter: dict[str, Any] | None = None
    discovering: bool = False  # in discovery_list (else in set_filter_list)
    watch: bool = True  # the disconnect watch is still set
    msg: Message | None = None  # a Start/StopDiscovery waiting for the kernel


@dataclass
class Kernel:
    """What the kernel and the controller hold for one adapter."""

    scanning: bool = False
    scan_type: int = 0
    filter: MergedFilter | None = None
    reported: set[str] = field(default_factory=set)  # the controller's duplicate filter for this scan
    cycle: asyncio.TimerHandle | None = None


@dataclass
class Device:
    """One Device1 object and the advertising state BlueZ keeps for it."""

    path: str
    adapter: str
    props: dict[str, Variant]
    rssi: int = 0  # 0 = none, as in device.c
    tx_power: int = 127  # 127 = none
    found: bool = False  # in adapter->discovery_found
    temporary: bool = True
    connectable: bool = True
    timer: asyncio.TimerHandle | None = None
    mfr: dict[int, bytes] = field(default_factory=dict)  # bt_ad manufacturer data
    sd: dict[str, bytes] = field(default_factory=dict)  # bt_ad service data


@dataclass
class Adapter:
    """One Adapter1 object: bluetoothd's discovery state and the kernel below it."""

    name: str
    powered: bool = True
    clients: dict[str, Client] = field(default_factory=dict)
    discovering: bool = False  # adapter->discovering: the Discovering property
    discovery_enable: bool = False  # what bluetoothd believes the kernel does
    discovery_type: int = 0
    filtered_discovery: bool = False
    no_scan_restart_delay: bool = False
    current_filter: MergedFilter | None = None
    pending: str | None = None  # adapter->client: the sender whose call waits for the kernel
    idle_timer: asyncio.TimerHandle | None = None
    kernel: Kernel = field(default_factory=Kernel)

    @property
    def path(self) -> str:
        """The object path."""
        return f"/org/bluez/{self.name}"

    def discovery_list(self) -> list[str]:
        """Senders of the clients discovering (adapter->discovery_list)."""
        return [s for s, c in self.clients.items() if c.discovering]

    def props(self) -> dict[str, Variant]:
        """Adapter1 properties as BlueZ reports them."""
        return {
            "Address": Variant("s", "00:00:00:00:00:00"),
            "Name": Variant("s", self.name),
            "Alias": Variant("s", self.name),
            "Powered": Variant("b", self.powered),
            "Discovering": Variant("b", self.discovering),
            "Discoverable": Variant("b", False),
            "Pairable": Variant("b", False),
            "Roles": Variant("as", ["central", "peripheral"]),
            "UUIDs": Variant("as", []),
        }


def uuid128(text: str) -> str | None:
    """bt_string_to_uuid + bt_uuid_to_uuid128: 16-, 32- and 128-bit forms; None when no UUID."""
    raw = text.lower().removeprefix("0x")
    try:
        if len(raw) in (4, 8):
            return f"{int(raw, 16):08x}{BASE_UUID}"
        if len(raw) == 36 and raw.count("-") == 4:
            int(raw.replace("-", ""), 16)
            return raw
    except ValueError:
        return None
    return None


def _bytes_dict(sig: str, data: dict[Any, bytes]) -> Variant:
    return Variant(sig, {k: Variant("ay", v) for k, v in data.items()})


class Emulator:
    """The daemon's state and its D-Bus behaviour."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self.loop = asyncio.get_running_loop()
        self.adapters: dict[str, Adapter] = {}
        self.devices: dict[str, Device] = {}
        self.calls: list[tuple[str, str, str, Any]] = []  # (sender, path, member, args)
        self.stall_next_stop = False
        self.stall_senders: set[str] = set()
        self.stalled: list[tuple[str, Message]] = []
        self.fail_stop: tuple[str, str] | None = None
        self.fail_start: str | None = None
        self.fail_kernel_start: int | None = None
        self.reject_kernel_stop = False
        self.power_off_on_start = False
        self.power_off_in_kernel_start = False
        self.wedge_after_start = False
        self.wedged = False
        self._backlog: list[Message | tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.stream_sent = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending_changes: dict[tuple[str, str], set[str]] = {}
        # Knobs of the controller and the daemon (defaults: the real values).
        self.duplicate_filter = True
        self.cycle_s = DISCOV_LE_TIMEOUT_S
        self.idle_s = IDLE_DISCOV_TIMEOUT_S
        self.temporary_timeout_s = DEFAULT_TEMPORARY_TIMEOUT_S
        self.mgmt_delay_s = 0.0
        self.scans_started = 0
        self.mgmt_unanswered = 0  # mgmt commands the kernel has not answered yet

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

    # ---- objects and signals ---------------------------------------------------------------------------

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

    def _changed(self, path: str, iface: str, names: Sequence[str]) -> None:
        """g_dbus_emit_property_changed: queued; sent with the latest values once the loop is idle."""
        if not names:
            return
        if not self._pending_changes:
            self.loop.call_soon(self.flush_changes)
        self._pending_changes.setdefault((path, iface), set()).update(names)

    def flush_changes(self) -> None:
        """gdbus/object.c `process_changes`: one PropertiesChanged per object and interface."""
        pending, self._pending_changes = self._pending_changes, {}
        for (path, iface), names in pending.items():
            try:
                props = self._props_of(path, iface)
            except _Refusal:
                continue  # the object went away meanwhile
            changed = {k: props[k] for k in sorted(names) if k in props}
            invalidated = sorted(k for k in names if k not in props)
            self.bus.send(
                Message.new_signal(
                    path, PROPS, "PropertiesChanged", "sa{sv}as", [iface, changed, invalidated]
                )
            )

    def _object_signal(self, member: str, sig: str, body: list[Any]) -> None:
        """InterfacesAdded / InterfacesRemoved, after every property change queued before them."""
        self.flush_changes()
        self.bus.send(Message.new_signal("/", OM, member, sig, body))

    def _set_discovering(self, adapter: Adapter, value: bool) -> None:
        """adapter->discovering = value; g_dbus_emit_property_changed(... "Discovering")."""
        adapter.discovering = value
        self._changed(adapter.path, ADAPTER, ["Discovering"])

    # ---- the kernel and the controller -----------------------------------------------------------------

    def _later(self, delay: float, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        """A timer of the daemon's main loop (or a kernel answer): held back while the loop is wedged."""
        return self.loop.call_later(delay, self._run_or_hold, fn, args)

    def _run_or_hold(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.wedged:
            self._backlog.append((fn, args))
        else:
            fn(*args)

    def _mgmt(self, done: Callable[[], None]) -> None:
        """One mgmt command: the kernel answers after `mgmt_delay_s`."""
        self.mgmt_unanswered += 1

        def answer() -> None:
            self.mgmt_unanswered -= 1
            done()

        self._later(self.mgmt_delay_s, answer)

    def _kernel_start(self, adapter: Adapter, scan_type: int, cp: MergedFilter | None) -> None:
        """MGMT_OP_START_(SERVICE_)DISCOVERY -> command complete, then the Discovering event."""

        def done() -> None:
            kernel = adapter.kernel
            status = MGMT_OK
            if self.power_off_in_kernel_start:  # knob: the adapter powers off while the start is pending
                self.power_off_in_kernel_start = False
                self._set_powered(adapter, False)
            if not adapter.powered:
                status = MGMT_NOT_POWERED
            elif kernel.scanning:
                status = MGMT_BUSY
            elif self.fail_kernel_start is not None:
                status, self.fail_kernel_start = self.fail_kernel_start, None
            if status != MGMT_OK:
                self._start_discovery_complete(adapter, status, scan_type)
                return
            kernel.scanning, kernel.scan_type, kernel.filter = True, scan_type, cp
            kernel.reported = set()  # a new scan: the controller's duplicate filter starts empty
            self.scans_started += 1
            kernel.cycle = self._later(self.cycle_s, self._kernel_scan_ended, adapter)
            self._start_discovery_complete(adapter, MGMT_OK, scan_type)
            self._discovering_event(adapter, True, scan_type)

        self._mgmt(done)

    def _kernel_stop(self, adapter: Adapter, scan_type: int, complete: bool) -> None:
        """MGMT_OP_STOP_DISCOVERY; `complete`: bluetoothd waits for it (`stop_discovery_complete`)."""

        def done() -> None:
            kernel = adapter.kernel
            if self.reject_kernel_stop:  # the scan had just ended by itself: its event follows the refusal
                self.reject_kernel_stop = False
                self._halt(kernel)
                if complete:
                    self._stop_discovery_complete(adapter, MGMT_REJECTED)
                self._discovering_event(adapter, False, scan_type)
                return
            if not kernel.scanning:
                if complete:
                    self._stop_discovery_complete(adapter, MGMT_REJECTED)
                return
            self._halt(kernel)
            if complete:
                self._stop_discovery_complete(adapter, MGMT_OK)
            self._discovering_event(adapter, False, scan_type)

        self._mgmt(done)

    @staticmethod
    def _halt(kernel: Kernel) -> None:
        kernel.scanning = False
        if kernel.cycle is not None:
            kernel.cycle.cancel()
            kernel.cycle = None

    def _kernel_scan_ended(self, adapter: Adapter) -> None:
        """hci_sync.c `le_scan_disable` after DISCOV_LE_TIMEOUT (or the kernel stopped by itself)."""
        kernel = adapter.kernel
        if not kernel.scanning:
            return
        self._halt(kernel)
        self._discovering_event(adapter, False, kernel.scan_type)

    def _controller_passes(self, adapter: Adapter, address: str, adv: dict[str, Any], rssi: int) -> bool:
        """The controller's duplicate filter, then the kernel's result filter (mgmt.c `is_filter_match`)."""
        kernel = adapter.kernel
        bredr = adv.get("class") is not None
        if not kernel.scanning or not kernel.scan_type & (SCAN_TYPE_BREDR if bredr else SCAN_TYPE_LE):
            return False
        if self.duplicate_filter:
            if address in kernel.reported:
                return False
            kernel.reported.add(address)
        cp = kernel.filter
        if cp is None:
            return True
        if cp[1] != HCI_RSSI_INVALID and (rssi == HCI_RSSI_INVALID or rssi < cp[1]):
            return False
        return not cp[2] or bool(set(cp[2]) & set(_uuid_list(adv)))

    # ---- bluetoothd's discovery (adapter.c) ------------------------------------------------------------

    def _merged(self, adapter: Adapter) -> MergedFilter | None:
        """adapter.c `merge_discovery_filters` + `discovery_filter_to_mgmt_cp`; None: regular discovery."""
        regular = filtered = empty_uuid = False
        scan_type, rssi = 0, None
        uuids: set[str] = set()
        for sender in adapter.discovery_list():
            item = adapter.clients[sender].filter
            if item is None or _is_regular(item):
                regular = True
                continue
            filtered = True
            scan_type |= _scan_type(item)
            item_rssi, pathloss = item.get("RSSI"), item.get("Pathloss")
            if item_rssi is None:
                rssi = HCI_RSSI_INVALID
            elif rssi != HCI_RSSI_INVALID and (rssi is None or rssi >= item_rssi):
                rssi = item_rssi
            elif pathloss is not None:
                rssi = HCI_RSSI_INVALID
            if not item.get("UUIDs"):
                empty_uuid = True
            uuids.update(item.get("UUIDs") or ())
        rssi = HCI_RSSI_INVALID if rssi is None else rssi
        if empty_uuid:
            uuids = set()
        if regular:
            if not filtered:
                return None
            return (SCAN_TYPE_DUAL, HCI_RSSI_INVALID, ())
        return (scan_type, rssi, tuple(sorted(uuids)))

    def _update_discovery_filter(self, adapter: Adapter) -> bool:
        """adapter.c `update_discovery_filter`; True (-EINPROGRESS) when a scan (re)start was triggered."""
        merged = self._merged(adapter)
        if merged == adapter.current_filter and adapter.discovering:
            return False  # "filters were equal, deciding to not restart the scan."
        adapter.current_filter = merged
        self._trigger_start_discovery(adapter, 0)
        return True

    def _trigger_start_discovery(self, adapter: Adapter, delay: float) -> None:
        """adapter.c `trigger_start_discovery`."""
        if adapter.idle_timer is not None:
            adapter.idle_timer.cancel()
            adapter.idle_timer = None
        if not adapter.powered:
            return
        adapter.idle_timer = self._later(delay, self._start_discovery_timeout, adapter)

    def _start_discovery_timeout(self, adapter: Adapter) -> None:
        """adapter.c `start_discovery_timeout`: stop a running scan first, else start the merged one."""
        adapter.idle_timer = None
        adapter.no_scan_restart_delay = adapter.current_filter is not None
        if adapter.discovery_enable:
            regular = adapter.current_filter is None and not adapter.filtered_discovery
            if regular and adapter.discovery_type == SCAN_TYPE_DUAL:
                if not adapter.discovering:
                    self._set_discovering(adapter, True)
                return
            self._kernel_stop(adapter, adapter.discovery_type, complete=False)
            return
        cp = adapter.current_filter
        self._kernel_start(adapter, SCAN_TYPE_DUAL if cp is None else cp[0], cp)

    def _discovery_complete(self, adapter: Adapter, status: int) -> str | None:
        """adapter.c `discovery_complete`: answer the waiting call (InProgress on a kernel error)."""
        sender, adapter.pending = adapter.pending, None
        client = adapter.clients.get(sender or "")
        if client is None:
            return None
        if client.msg is not None:
            msg, client.msg = client.msg, None
            if status == MGMT_OK:
                self.bus.send(Message.new_method_return(msg))
            else:
                self.bus.send(Message.new_error(msg, *_BUSY))
        return sender

    def _start_discovery_complete(self, adapter: Adapter, status: int, scan_type: int) -> None:
        """adapter.c `start_discovery_complete`."""
        if not adapter.discovery_list():
            if status == MGMT_OK:
                self._kernel_stop(adapter, scan_type, complete=False)
            return
        if status == MGMT_OK:
            adapter.discovery_type, adapter.discovery_enable = scan_type, True
            adapter.filtered_discovery = adapter.current_filter is not None
            sender = self._discovery_complete(adapter, status)
            if not adapter.discovering:
                self._set_discovering(adapter, True)
            if sender is not None and self.power_off_on_start:  # knob: off right after the answer
                self.power_off_on_start = False
                self.loop.call_soon(self._set_powered, adapter, False)
            return
        sender = self._discovery_complete(adapter, status)
        if sender is not None:
            self._discovery_remove(adapter, sender)
            return
        self._trigger_start_discovery(adapter, self.idle_s * 2)

    def _stop_discovery_complete(self, adapter: Adapter, status: int) -> None:
        """adapter.c `stop_discovery_complete`: a rejected stop leaves `Discovering` as it was."""
        sender = self._discovery_complete(adapter, status)
        if sender is not None:
            self._discovery_remove(adapter, sender)
        if status != MGMT_OK:
            return
        adapter.discovery_type, adapter.discovery_enable = 0, False
        adapter.filtered_discovery = adapter.no_scan_restart_delay = False
        self._set_discovering(adapter, False)

    def _discovering_event(self, adapter: Adapter, discovering: bool, scan_type: int) -> None:
        """adapter.c `discovering_callback` (MGMT_EV_DISCOVERING)."""
        if adapter.discovery_enable == discovering:
            return
        adapter.discovery_type, adapter.discovery_enable = scan_type, discovering
        if not adapter.discovery_list():
            return
        if not discovering:
            self._trigger_start_discovery(adapter, 0 if adapter.no_scan_restart_delay else self.idle_s)
        elif adapter.idle_timer is not None:
            adapter.idle_timer.cancel()
            adapter.idle_timer = None

    def _discovery_remove(self, adapter: Adapter, sender: str) -> None:
        """adapter.c `discovery_remove`: a filter with its watch goes back to set_filter_list."""
        client = adapter.clients.get(sender)
        if client is None:
            return
        if adapter.pending == sender:
            adapter.pending = None
        client.discovering = False
        if not (client.watch and client.filter is not None):
            del adapter.clients[sender]
        if not adapter.discovery_list():
            self._discovery_cleanup(adapter)

    def _discovery_stop(self, adapter: Adapter, sender: str) -> bool:
        """adapter.c `discovery_stop`; True (-EINPROGRESS) when the kernel must stop first."""
        if len(adapter.discovery_list()) > 1:  # g_slist_next(adapter->discovery_list)
            self._discovery_remove(adapter, sender)
            self._update_discovery_filter(adapter)
            return False
        if not adapter.discovery_enable:  # the idle phase: nothing to stop
            self._discovery_remove(adapter, sender)
            self._set_discovering(adapter, False)
            return False
        adapter.pending = sender
        self._kernel_stop(adapter, adapter.discovery_type, complete=True)
        return True

    def _discovery_cleanup(self, adapter: Adapter) -> None:
        """adapter.c `discovery_cleanup`: found devices lose RSSI and TxPower; some temporary ones go."""
        if adapter.idle_timer is not None:
            adapter.idle_timer.cancel()
            adapter.idle_timer = None
        for device in list(self.devices.values()):
            if device.adapter != adapter.name:
                continue
            if device.found:
                device.found = False
                gone = [k for k in ("RSSI", "TxPower") if k in device.props]
                for key in gone:
                    del device.props[key]
                device.rssi, device.tx_power = 0, 127
                self._changed(device.path, DEVICE, gone)
            if device.temporary and not device.connectable and device.path in self.devices:
                self._remove_device(device.path)

    # ---- discovery methods -----------------------------------------------------------------------------

    def _set_filter(self, adapter: Adapter, msg: Message) -> None:
        """adapter.c `set_discovery_filter`."""
        if not adapter.powered:
            raise _Refusal(*_NOT_READY)
        parsed = _parse_filter(msg.body[0])
        sender = msg.sender or ""
        client = adapter.clients.get(sender)
        if client is not None:
            client.filter = parsed
            if client.discovering:
                self._update_discovery_filter(adapter)
            elif parsed is None:
                del adapter.clients[sender]  # "successfully cleared pre-set filter"
        elif parsed is not None:
            adapter.clients[sender] = Client(filter=parsed)  # pre-set, with its disconnect watch

    def _start(self, adapter: Adapter, msg: Message) -> bool | None:
        """adapter.c `start_discovery`: answered at once only when the merged filter is unchanged."""
        if not adapter.powered:
            raise _Refusal(*_NOT_READY)
        if self.fail_start is not None:
            raise _Refusal(self.fail_start, "injected")
        sender = msg.sender or ""
        client = adapter.clients.get(sender)
        if client is not None and (client.discovering or client.msg is not None):
            raise _Refusal(*_BUSY)
        if client is None:
            client = adapter.clients[sender] = Client()
        client.discovering = True
        if not self._update_discovery_filter(adapter):
            return None
        client.msg = msg
        adapter.pending = sender
        if self.wedge_after_start:  # the session exists, but the main loop hangs before the reply goes out
            self.wedge_after_start = False
            self.wedged = True
        return True

    def _stop(self, adapter: Adapter, msg: Message) -> bool | None:
        """adapter.c `stop_discovery`; the stall knob keeps the reply forever (the session stays too)."""
        if not adapter.powered:
            raise _Refusal(*_NOT_READY)
        sender = msg.sender or ""
        client = adapter.clients.get(sender)
        if client is None or not client.discovering:
            raise _Refusal("org.bluez.Error.Failed", "No discovery started")
        if client.msg is not None:
            raise _Refusal(*_BUSY)
        if self.stall_next_stop or sender in self.stall_senders:
            self.stall_next_stop = False
            self.stalled.append((sender, msg))
            return True
        if self.fail_stop is not None:
            raise _Refusal(*self.fail_stop)
        if not self._discovery_stop(adapter, sender):
            return None
        client.msg = msg
        return True

    def _client_gone(self, sender: str) -> None:
        """adapter.c `discovery_disconnect` -> `discovery_stop`, for a discovering or a filter-only client."""
        self.stall_senders.discard(sender)
        self.stalled = [(s, m) for s, m in self.stalled if s != sender]
        for adapter in self.adapters.values():
            client = adapter.clients.get(sender)
            if client is None:
                continue
            client.watch = False
            self._discovery_stop(adapter, sender)

    def _remove_device_call(self, adapter: Adapter, msg: Message) -> None:
        path = msg.body[0]
        if path not in self.devices:
            raise _Refusal("org.bluez.Error.DoesNotExist", "Does Not Exist")
        self._remove_device(path)

    def _remove_device(self, path: str) -> None:
        device = self.devices.pop(path, None)
        if device is not None and device.timer is not None:
            device.timer.cancel()
        self._object_signal("InterfacesRemoved", "oas", [path, [DEVICE]])

    def _set_powered(self, adapter: Adapter, powered: bool) -> None:
        """Powered on, or off: `remove_temporary_devices`, then `adapter_stop` (one signal for both)."""
        if adapter.powered == powered:
            return
        if not powered:
            for path in [p for p, d in self.devices.items() if d.adapter == adapter.name and d.temporary]:
                self._remove_device(path)
            pending = adapter.clients.get(adapter.pending or "")
            if pending is not None and pending.msg is not None:  # `discovery_free` of adapter->client
                self.bus.send(Message.new_error(pending.msg, *_BUSY))
            adapter.clients.clear()
            adapter.pending = None
            self._discovery_cleanup(adapter)
            self._halt(adapter.kernel)
            adapter.current_filter = None
            adapter.filtered_discovery = adapter.no_scan_restart_delay = False
            adapter.discovery_enable = False
            self._set_discovering(adapter, False)
        adapter.powered = powered
        self._changed(adapter.path, ADAPTER, ["Powered"])

    # ---- advertising reports (adapter.c `btd_adapter_device_found`) ------------------------------------

    def _bluetoothd_match(self, adapter: Adapter, adv: dict[str, Any]) -> bool:
        """adapter.c `is_filter_match`: the UUID lists only (src/eir.c puts service data elsewhere).

        Its proximity test passes whenever the client has no RSSI or no Pathloss, and
        `parse_discovery_filter_dict` never lets a client have both: the kernel's RSSI filter is the only one.
        """
        services = set(_uuid_list(adv))
        for sender in adapter.discovery_list():
            item = adapter.clients[sender].filter
            if item is None or not item.get("UUIDs") or services & set(item["UUIDs"]):
                return True
        return False

    def report(self, adapter_name: str, address: str, adv: dict[str, Any]) -> bool:
        """One advertising report on the air; True when bluetoothd passed it on to Device1."""
        adapter = self.adapters[adapter_name]
        rssi = int(adv["rssi"])
        if not self._controller_passes(adapter, address, adv, rssi):
            return False
        if not adapter.discovering:
            return False
        takers = adapter.discovery_list()
        path = f"{adapter.path}/dev_{address.replace(':', '_').upper()}"
        device = self.devices.get(path)
        new = device is None
        if device is None:
            device = self._new_device(adapter, path, address, adv)
        self._seen(device, adv)
        if adapter.filtered_discovery and not self._bluetoothd_match(adapter, adv):
            if new:
                self._object_signal("InterfacesAdded", "oa{sa{sv}}", [path, {DEVICE: dict(device.props)}])
            return False
        proximity = adapter.filtered_discovery and any(
            (f := adapter.clients[s].filter) is not None and ("RSSI" in f or "Pathloss" in f) for s in takers
        )
        duplicate = any(
            (f := adapter.clients[s].filter) is not None and f.get("DuplicateData") for s in takers
        )
        changed = self._merge(device, adv, rssi, proximity, duplicate)
        device.found = True
        if new:
            self._object_signal("InterfacesAdded", "oa{sa{sv}}", [path, {DEVICE: dict(device.props)}])
        else:
            self._changed(path, DEVICE, changed)
        return True

    def _new_device(self, adapter: Adapter, path: str, address: str, adv: dict[str, Any]) -> Device:
        """adapter.c `adapter_create_device`: before any filter, without RSSI."""
        bredr = adv.get("class") is not None
        props: dict[str, Variant] = {
            "Address": Variant("s", address),
            "AddressType": Variant("s", "public" if bredr else "random"),
            "Alias": Variant("s", address.replace(":", "-")),
            "Adapter": Variant("o", adapter.path),
            "Paired": Variant("b", False),
            "Bonded": Variant("b", False),
            "Trusted": Variant("b", False),
            "Blocked": Variant("b", False),
            "Connected": Variant("b", False),
            "LegacyPairing": Variant("b", False),
            "ServicesResolved": Variant("b", False),
            "UUIDs": Variant("as", []),
        }
        device = self.devices[path] = Device(path, adapter.name, props)
        return device

    def _seen(self, device: Device, adv: dict[str, Any]) -> None:
        """device.c `device_update_last_seen`: restart the temporary timer."""
        device.connectable = bool(adv.get("connectable", True))
        if not device.temporary:
            return
        if device.timer is not None:
            device.timer.cancel()
        device.timer = self._later(self.temporary_timeout_s, self._disappeared, device.path)

    def _disappeared(self, path: str) -> None:
        """device.c `device_disappeared`."""
        if path in self.devices:
            self.devices[path].timer = None
            self._remove_device(path)

    def _merge(
        self, device: Device, adv: dict[str, Any], rssi: int, proximity: bool, duplicate: bool
    ) -> list[str]:
        """One report into the device (`btd_adapter_device_found` from the RSSI on); the changed names."""
        changed: list[str] = []
        props = device.props
        # device.c `device_set_rssi_with_delta`: 0 dBm invalidates (dev_property_exists_rssi)
        threshold = 0 if proximity else RSSI_THRESHOLD
        if rssi == 0 or device.rssi == 0:
            if device.rssi != rssi:
                device.rssi = rssi
                changed.append("RSSI")
        elif abs(device.rssi - rssi) >= threshold:
            device.rssi = rssi
            changed.append("RSSI")
        if device.rssi == 0:
            props.pop("RSSI", None)
        else:
            props["RSSI"] = Variant("n", device.rssi)
        tx = adv.get("tx_power")
        if tx is not None and int(tx) != device.tx_power:  # device.c `device_set_tx_power`
            device.tx_power = int(tx)
            props["TxPower"] = Variant("n", int(tx))
            changed.append("TxPower")
        name = adv.get("name")
        if name is not None and _value(props.get("Name")) != name:
            props["Name"] = props["Alias"] = Variant("s", name)
            changed += ["Name", "Alias"]
        if adv.get("class") is not None and _value(props.get("Class")) != int(adv["class"]):
            props["Class"] = Variant("u", int(adv["class"]))  # device.c `device_set_class`
            changed.append("Class")
        uuids = list(_value(props["UUIDs"]))
        for uuid in _uuid_list(adv):  # device.c `device_add_eir_uuids`
            if uuid not in uuids:
                uuids.append(uuid)
        mfr = {int(k): bytes.fromhex(v) for k, v in (adv.get("mfr") or {}).items()}
        if mfr:  # device.c `device_set_manufacturer_data`, bt_ad_add_manufacturer_data per company
            if duplicate:
                device.mfr = {}
            if any(device.mfr.get(k) != v for k, v in mfr.items()):
                device.mfr.update(mfr)
                props["ManufacturerData"] = _bytes_dict("a{qv}", device.mfr)
                changed.append("ManufacturerData")
        sd = {u: bytes.fromhex(v) for k, v in (adv.get("sd") or {}).items() if (u := uuid128(k))}
        if sd:  # device.c `device_set_service_data` -> `add_service_data` (its UUID joins UUIDs)
            if duplicate:
                device.sd = {}
            if any(device.sd.get(k) != v for k, v in sd.items()):
                device.sd.update(sd)
                props["ServiceData"] = _bytes_dict("a{sv}", device.sd)
                changed.append("ServiceData")
            uuids += [u for u in sd if u not in uuids]
        if uuids != list(_value(props["UUIDs"])):
            props["UUIDs"] = Variant("as", uuids)
            changed.append("UUIDs")
        return changed

    # ---- control ---------------------------------------------------------------------------------------

    def _control(self, msg: Message) -> Message:
        try:
            request = json.loads(msg.body[0])
            result = getattr(self, "c_" + request.pop("op"))(**request)
        except Exception as exc:  # a test's mistake: tell it, keep running
            return Message.new_error(msg, "org.bluez.Emulator.Error", f"{type(exc).__name__}: {exc}")
        return Message.new_method_return(msg, "s", [json.dumps(result)])

    def c_configure(self, **knobs: Any) -> None:
        """Set knobs: duplicate_filter, cycle_s, idle_s, temporary_timeout_s, mgmt_delay_s."""
        for name, value in knobs.items():
            if name not in ("duplicate_filter", "cycle_s", "idle_s", "temporary_timeout_s", "mgmt_delay_s"):
                raise ValueError(f"no knob {name}")
            setattr(self, name, value)

    def c_add_adapter(self, name: str, powered: bool = True) -> str:
        adapter = self.adapters[name] = Adapter(name, powered)
        self._object_signal("InterfacesAdded", "oa{sa{sv}}", [adapter.path, {ADAPTER: adapter.props()}])
        return adapter.path

    def c_remove_adapter(self, name: str) -> None:
        adapter = self.adapters.pop(name)
        self._halt(adapter.kernel)
        if adapter.idle_timer is not None:
            adapter.idle_timer.cancel()
        for path in [p for p, d in self.devices.items() if d.adapter == name]:
            self._remove_device(path)
        self._object_signal("InterfacesRemoved", "oas", [adapter.path, [ADAPTER]])

    def c_set_powered(self, name: str, powered: bool) -> None:
        self._set_powered(self.adapters[name], powered)

    def c_report(self, adapter: str, address: str, adv: dict[str, Any]) -> bool:
        return self.report(adapter, address, adv)

    def c_reports(self, adapter: str, address: str, advs: list[dict[str, Any]]) -> int:
        return sum(self.report(adapter, address, adv) for adv in advs)

    def c_end_cycle(self, adapter: str) -> bool:
        """The kernel ends the running scan now (the LE discovery timeout, or a kernel stopping by itself)."""
        running = self.adapters[adapter].kernel.scanning
        self._kernel_scan_ended(self.adapters[adapter])
        return running

    def c_scanning(self, adapter: str) -> bool:
        """True while the kernel scans (whatever bluetoothd believes)."""
        return self.adapters[adapter].kernel.scanning

    def c_scans_started(self) -> int:
        """How many scans the kernel started so far (each one empties the duplicate filter)."""
        return self.scans_started

    def c_fail_kernel_start(self, status: int = 0x03) -> None:
        """The next kernel start fails (default MGMT_STATUS_FAILED)."""
        self.fail_kernel_start = status

    def c_reject_kernel_stop(self) -> None:
        """The next kernel stop is rejected: the scan had just ended by itself (bluez/bluez#807)."""
        self.reject_kernel_stop = True

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
                await asyncio.sleep(due - loop.time())  # real peer: the emulator's scripted report rate
            adv = {"rssi": rssi[i % len(rssi)], "uuids": [STREAM_UUID], "name": "bench"}
            self.report(adapter, addresses[i % len(addresses)], adv)
            self.stream_sent = i + 1

    def c_stop_streams(self) -> None:
        """Cancel every running stream."""
        for task in list(self._tasks):
            task.cancel()

    def c_streamed(self) -> int:
        """How many reports the current stream has emitted so far."""
        return self.stream_sent

    def c_add_cached(
        self, adapter: str, address: str, name: str | None = None, uuids: Sequence[str] = ()
    ) -> str:
        """A device BlueZ knows from before (paired, seen earlier): a Device1 without RSSI, not temporary."""
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
            "UUIDs": Variant("as", [u for u in map(uuid128, uuids) if u]),
        }
        if name is not None:
            props["Name"] = Variant("s", name)
        self.devices[path] = Device(path, adapter, props, temporary=False)
        self._object_signal("InterfacesAdded", "oa{sa{sv}}", [path, {DEVICE: props}])
        return path

    def c_set_device(self, path: str, props: dict[str, Any]) -> None:
        """Non-advertising Device1 properties change (Trusted, Connected, Alias, ServicesResolved, ...)."""
        device = self.devices[path]
        device.props.update({k: Variant("b" if isinstance(v, bool) else "s", v) for k, v in props.items()})
        self._changed(path, DEVICE, list(props))

    def c_remove_device(self, path: str) -> None:
        self._remove_device(path)

    def c_device_props(self, path: str) -> dict[str, Any] | None:
        device = self.devices.get(path)
        return None if device is None else {k: _plain(v.value) for k, v in device.props.items()}

    def c_settled(self) -> bool:
        """No mgmt command awaits the kernel's answer and no discovery (re)start is due on any adapter."""
        return self.mgmt_unanswered == 0 and all(a.idle_timer is None for a in self.adapters.values())

    def c_clients(self, adapter: str) -> list[str]:
        return sorted(self.adapters[adapter].discovery_list())

    def c_filters(self, adapter: str) -> dict[str, Any]:
        """Every client's filter, discovering or pre-set (None: regular discovery)."""
        return {s: c.filter for s, c in self.adapters[adapter].clients.items()}

    def c_presets(self, adapter: str) -> list[str]:
        """Senders whose filter waits in set_filter_list (pre-set or kept after StopDiscovery)."""
        return sorted(s for s, c in self.adapters[adapter].clients.items() if not c.discovering)

    def c_discovering(self, adapter: str) -> bool:
        """The Discovering property."""
        return self.adapters[adapter].discovering

    def c_calls(self, member: str) -> list[list[Any]]:
        return [[sender, path, args] for sender, path, m, args in self.calls if m == member]

    def c_stall_stop(self, sender: str | None = None) -> None:
        if sender is None:
            self.stall_next_stop = True
        else:
            self.stall_senders.add(sender)

    def c_release_stalled(self) -> int:
        """Serve every stalled StopDiscovery now."""
        stalled, self.stalled = self.stalled, []
        self.stall_senders.clear()
        self.stall_next_stop = False
        for sender, msg in stalled:
            adapter = self._adapter_at(msg.path)
            client = None if adapter is None else adapter.clients.get(sender)
            if adapter is None or client is None or not client.discovering:
                self.bus.send(Message.new_error(msg, "org.bluez.Error.Failed", "No discovery started"))
            elif self._discovery_stop(adapter, sender):
                client.msg = msg
            else:
                self.bus.send(Message.new_method_return(msg))
        return len(stalled)

    def c_fail_stop(self, error: str | None, message: str = "Operation failed") -> None:
        self.fail_stop = None if error is None else (error, message)

    def c_fail_start(self, error: str | None) -> None:
        self.fail_start = error

    def c_power_off_on_start(self) -> None:
        self.power_off_on_start = True

    def c_power_off_in_kernel_start(self) -> None:
        self.power_off_in_kernel_start = True

    def c_wedge_after_start(self) -> None:
        self.wedge_after_start = True

    def c_wedge(self) -> None:
        self.wedged = True

    def c_unwedge(self) -> None:
        """The main loop runs again: everything that queued up is served in order."""
        self.wedged = False
        backlog, self._backlog = self._backlog, []
        for item in backlog:
            if isinstance(item, tuple):
                item[0](*item[1])
                continue
            reply = self._serve(item)
            if isinstance(reply, Message):
                self.bus.send(reply)


class _Refusal(Exception):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name, self.text = name, text


def _flag(value: Variant, sig: str, check: Callable[[Any], bool] = lambda _: True) -> Any:
    """One `parse_*` of adapter.c: the D-Bus type must match and the value pass its check."""
    if value.signature != sig or not check(value.value):
        raise _Refusal(*_INVALID)
    return value.value


def _uuids(value: Variant) -> list[str]:
    """adapter.c `parse_uuids`: every entry a UUID, kept in its 128-bit form."""
    if value.signature != "as":
        raise _Refusal(*_INVALID)
    expanded = [uuid128(u) for u in value.value]
    if None in expanded:
        raise _Refusal(*_INVALID)
    return [u for u in expanded if u is not None]


_PARSERS: dict[str, Callable[[Variant], Any]] = {  # adapter.c `parsers[]`
    "UUIDs": _uuids,
    "RSSI": lambda v: _flag(v, "n", lambda x: -127 <= x <= 20),
    "Pathloss": lambda v: _flag(v, "q", lambda x: x <= PATHLOSS_MAX),
    "Transport": lambda v: _flag(v, "s", lambda x: x in ("bredr", "le", "auto")),
    "DuplicateData": lambda v: _flag(v, "b"),
    "Discoverable": lambda v: _flag(v, "b"),
    "Pattern": lambda v: _flag(v, "s"),
    "AutoConnect": lambda v: _flag(v, "b"),
}


def _parse_filter(raw: dict[str, Variant]) -> dict[str, Any] | None:
    """adapter.c `parse_discovery_filter_dict`; None for an empty dict (the filter is cleared)."""
    if not raw:
        return None
    parsed: dict[str, Any] = {}
    for key, variant in raw.items():
        parser = _PARSERS.get(key)
        if parser is None:  # "Unknown key parameter"
            raise _Refusal(*_INVALID)
        parsed[key] = parser(variant)
    if "RSSI" in parsed and "Pathloss" in parsed:  # "only pathlos or rssi can be set, never both"
        raise _Refusal(*_INVALID)
    return parsed


def _scan_type(item: dict[str, Any]) -> int:
    """adapter.c `parse_transport` over the default `get_scan_type` (a dual-mode adapter)."""
    return {"bredr": SCAN_TYPE_BREDR, "le": SCAN_TYPE_LE}.get(item.get("Transport", "auto"), SCAN_TYPE_DUAL)


def _is_regular(item: dict[str, Any]) -> bool:
    """`merge_discovery_filters`: a filter asking for nothing a kernel filter does counts as regular."""
    return (
        not item.get("UUIDs")
        and "RSSI" not in item
        and "Pathloss" not in item
        and _scan_type(item) == SCAN_TYPE_DUAL
        and not item.get("DuplicateData", False)
        and "Pattern" not in item
    )


def _uuid_list(adv: dict[str, Any]) -> list[str]:
    """The advert's UUID lists (src/eir.c `eir_parse` -> eir->services), 128-bit."""
    return [u for u in map(uuid128, adv.get("uuids", ())) if u is not None]


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
