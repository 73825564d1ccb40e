"""The BLE worker: one process per BLE session, running bleak on a D-Bus connection of its own.

Started by `providers.ble.BleSession` as `python -m providers.ble_worker`; it is one BlueZ discovery client
(CONTRACT §6.7), so BlueZ merges its filter with the other sessions' and drops its discovery session when the
process dies (src/adapter.c `discovery_disconnect`). Rules of this file:
- it dies with the connector: `PR_SET_PDEATHSIG` (SIGKILL) and exit on EOF of its stdin;
- logging is disabled and stderr goes nowhere: no handler can carry device data; nothing touches disk;
- only advertisement reports are observations (CONTRACT §6.5): bleak runs its callback on every Device1
  PropertiesChanged with the merged properties (bleak/backends/bluezdbus/manager.py `_parse_msg` ->
  `_run_advertisement_callbacks`), so the worker's manager marks the message being parsed and the callback
  keeps only those that carry a report;
- reports are read from bleak's manager as the merged Device1 properties it hands its advertisement
  callbacks: the worker tests the scope on them and builds nothing else per report (bleak's scanner would
  build an AdvertisementData and a BLEDevice for each, which nothing here reads);
- in-scope observations cross to the parent in batches, as `marshal` frames of plain tuples;
- on a real controller (CONTRACT §6.5; src/adapter.c): a session joining an adapter that is already
  discovering starts with a Pathloss-only filter and sends its own filter right behind StartDiscovery, so
  that the merged filter changes and bluetoothd restarts the scan (`update_discovery_filter`) before it
  answers; a failed or cut-off start clears its pre-set filter before the process goes (else its
  disconnect runs `discovery_stop` on the adapter: `discovery_disconnect`); `Discovering` false on a powered
  adapter is answered by a restart (the filter sent again) or the ("deaf",) frame; BR/EDR-only devices
  (`Class` without LE advertising flags) are dropped.

Frames on stdout (4-byte big-endian length + marshal): ("bus", unique_name), ("ready",),
("error", code, rule), ("o", [observation tuples]), ("gone",), ("deaf",), ("stopped", refusal or None).
On stdin: a first frame with the pickled config, then one byte per command (b"G": start discovery now,
b"S": stop discovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import marshal
import os
import pickle
import signal
import struct
import sys
from typing import Any, cast

from connector.core.observations import BleObservation
from connector.errors import Code

_LEN = struct.Struct(">I")
_as_observation = tuple.__new__
_NONE: dict[Any, bytes] = {}  # no manufacturer or service data (shared: never mutated)
STOP = b"S"
# The connector lets one worker per adapter start at a time: bluetoothd answers only the last of two starts
# whose kernel commands overlap (adapter.c `start_discovery` overwrites `adapter->client`).
GO = b"G"
# In-scope observations are batched this long (or up to _BATCH_MAX devices): one pipe write and one parent
# wake-up per batch. Within a batch only each device's latest in-scope report crosses: the parent stamps a
# batch with one arrival time and keeps only a device's latest advert, so earlier ones of the same batch
# would change nothing but the CPU spent (first-seen order is kept: dict insertion order).
BATCH_S = 0.05
_BATCH_MAX = 256
PR_SET_PDEATHSIG = 1

BLUEZ = "org.bluez"
DBUS = "org.freedesktop.DBus"
ADAPTER_IFACE = "org.bluez.Adapter1"
DEVICE_IFACE = "org.bluez.Device1"
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
# The Device1 properties whose change is an advertisement report (CONTRACT §6.5; src/adapter.c
# `btd_adapter_device_found` sets exactly these from a report).
REPORT_PROPERTIES = frozenset({"RSSI", "ManufacturerData", "ServiceData", "TxPower"})

# D-Bus errors meaning the adapter is off (NotReady) or gone (UnknownObject), or bluetoothd is not running.
# Answered to StopDiscovery they mean that BlueZ holds no discovery session of ours.
UNAVAILABLE_ERRORS = frozenset(
    {
        "org.bluez.Error.NotReady",
        "org.freedesktop.DBus.Error.UnknownObject",
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
    }
)
# bluetoothd's answer (org.bluez.Error.Failed) when this client has no discovery session (adapter.c
# `stop_discovery`).
NO_SESSION_TEXT = "No discovery started"
# A filter without RSSI: the merged RSSI is cleared (adapter.c `merge_discovery_filters`), while
# bluetoothd's own proximity test passes every report (`is_filter_match`) and RSSI is still signalled at
# every report (`discovery_filter_has_proximity`). PATHLOSS_MAX is the widest value `parse_pathloss` takes.
JOIN_FILTER: dict[str, Any] = {"Transport": "le", "DuplicateData": True, "Pathloss": 137}
IN_PROGRESS = "org.bluez.Error.InProgress"
# How long a restart after `Discovering` turned false may take, and a clear of the filter on the way out.
REDISCOVER_BOUND_S = 2.0
CLEAR_BOUND_S = 0.5


def frame(payload: Any) -> bytes:
    """One length-prefixed marshal frame."""
    body = marshal.dumps(payload)
    return _LEN.pack(len(body)) + body


def config_frame(config: dict[str, Any]) -> bytes:
    """The parent's first frame: pickled config (the parent is the only writer of this pipe)."""
    body = pickle.dumps(config)
    return _LEN.pack(len(body)) + body


def is_report(message: Any) -> bool:
    """True when a BlueZ signal carries an advertisement report (not a cache hit, not another property)."""
    member = message.member
    if member == "PropertiesChanged":
        body = message.body
        if body[0] != DEVICE_IFACE:
            return False
        # A 0 dBm report invalidates RSSI alone (device.c `dev_property_exists_rssi`); the end of a
        # discovery invalidates TxPower with it (adapter.c `invalidate_rssi_and_tx_power`).
        return not REPORT_PROPERTIES.isdisjoint(body[1]) or body[2] == ["RSSI"]
    if member == "InterfacesAdded":
        props = message.body[1].get(DEVICE_IFACE)
        return props is not None and "RSSI" in props
    return False


def session_gone(error_name: str | None, details: str | None) -> bool:
    """True when a StopDiscovery answer means BlueZ holds no session of ours."""
    if error_name in UNAVAILABLE_ERRORS:
        return True
    return error_name == "org.bluez.Error.Failed" and details == NO_SESSION_TEXT


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL when the parent dies (also after a SIGKILL of it); exit now if it is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def _read_config() -> dict[str, Any]:
    head = os.read(0, _LEN.size)
    if len(head) < _LEN.size:
        os._exit(0)
    (size,) = _LEN.unpack(head)
    body = b""
    while len(body) < size:
        chunk = os.read(0, size - len(body))
        if not chunk:
            os._exit(0)
        body += chunk
    config: dict[str, Any] = pickle.loads(body)
    return config


class _Commands(asyncio.Protocol):
    """stdin: stop commands; EOF (the connector closed it or died) ends the process (`on_eof`)."""

    def __init__(self, on_go: Any, on_stop: Any, on_eof: Any) -> None:
        self._on_go = on_go
        self._on_stop = on_stop
        self._on_eof = on_eof

    def data_received(self, data: bytes) -> None:
        if GO in data:
            self._on_go()
        for _ in range(data.count(STOP)):
            self._on_stop()

    def eof_received(self) -> bool | None:
        self._on_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_eof()


class Worker:
    """bleak's scanner for one session, wired to the parent's pipe."""

    def __init__(self, config: dict[str, Any]) -> None:
        from connector.core.scope import scope_matcher

        self._adapter_path: str = config["adapter_path"]
        self._filters: dict[str, Any] = config["filters"]
        self._in_scope = scope_matcher(config["scope"])
        self._out: asyncio.WriteTransport | None = None
        self._batch: dict[Any, tuple[Any, ...]] = {}
        # Without coalescing (recordings) every report is its own entry, keyed by its sequence number.
        self._coalesce: bool = config.get("coalesce", True)
        self._seq = 0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._open = False
        self._lost = False
        self._tasks: set[asyncio.Future[None]] = set()
        self._manager: Any = None
        self._scanner: Any = None
        self._starting = False  # a pre-set filter of ours may be in bluetoothd's set_filter_list
        self._discovering = asyncio.Event()
        self._rediscovering = False
        self._go = asyncio.Event()

    def send(self, payload: Any) -> None:
        """Queue one frame to the parent."""
        assert self._out is not None
        self._out.write(frame(payload))

    async def run(self) -> None:
        """Connect, start discovery, then serve stop commands until stdin closes."""
        loop = asyncio.get_running_loop()
        self._out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", buffering=0))
        await loop.connect_read_pipe(
            lambda: _Commands(self._go.set, self._on_stop, self._on_eof), os.fdopen(0, "rb", buffering=0)
        )
        error = await self._start()
        if error is not None:
            self.send(("error", *error))
        else:
            self._open = True
            self.send(("ready",))
            if self._lost:  # the adapter went away while discovery was starting
                self._gone()
        await asyncio.Event().wait()  # until stdin closes (os._exit)

    def _on_eof(self) -> None:
        """The connector closed the pipe (or died): go, after clearing a pre-set filter of a cut-off start."""
        if not self._starting or self._manager is None:
            os._exit(0)
        self._starting = False
        task = asyncio.ensure_future(self._leave())
        self._tasks.add(task)

    async def _leave(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLEAR_BOUND_S):
                await self._manager.clear_filter(self._adapter_path)
        os._exit(0)

    async def _start(self) -> tuple[str, str] | None:
        """Start; None on success, else (error code, rule)."""
        from bleak.exc import BleakBluetoothNotAvailableError, BleakDBusError, BleakError
        from dbus_fast.errors import DBusFastError

        try:
            return await self._start_scanning()
        except BleakBluetoothNotAvailableError:
            return (Code.PROVIDER_UNAVAILABLE.value, "no-adapter")
        except BleakDBusError as exc:
            if exc.dbus_error == IN_PROGRESS and not await self._still_powered():
                # adapter.c `start_discovery_complete`: InProgress also answers a start that the adapter's
                # power-off cut short
                return (Code.PROVIDER_UNAVAILABLE.value, "powered-off")
            unavailable = exc.dbus_error in UNAVAILABLE_ERRORS
            code = Code.PROVIDER_UNAVAILABLE if unavailable else Code.PROVIDER_FAILURE
            return (code.value, exc.dbus_error)
        except BleakError:
            return (Code.PROVIDER_UNAVAILABLE.value, "adapter-not-found")
        except (OSError, DBusFastError, EOFError):
            return (Code.PROVIDER_UNAVAILABLE.value, "bus-unreachable")

    async def _start_scanning(self) -> tuple[str, str] | None:
        from bleak import BleakScanner
        from bleak.backends.bluezdbus import manager as bleak_manager
        from dbus_fast import Message, MessageType

        self._manager = _gated_manager(bleak_manager, self._on_signal, self._on_preset, self._on_report)
        # bleak keeps one manager per event loop; ours is seeded first so that bleak's scanner uses it.
        bleak_manager._global_instances[asyncio.get_running_loop()] = self._manager
        await bleak_manager.get_global_bluez_manager()
        bus = self._manager._bus
        self.send(("bus", bus.unique_name))
        self._tasks.add(asyncio.ensure_future(self._watch_disconnect(bus)))
        rule = f"type='signal',sender='{DBUS}',interface='{DBUS}',member='NameOwnerChanged',arg0='{BLUEZ}'"
        await bus.call(
            Message(
                destination=DBUS,
                path="/org/freedesktop/DBus",
                interface=DBUS,
                member="AddMatch",
                signature="s",
                body=[rule],
            )
        )
        reply = await bus.call(self._powered_query())
        if reply.message_type == MessageType.ERROR:
            return (Code.PROVIDER_UNAVAILABLE.value, reply.error_name or "no-reply")
        if not reply.body[0].value:
            return (Code.PROVIDER_UNAVAILABLE.value, "powered-off")
        self._scanner = BleakScanner(
            None,  # reports reach `_on_report` from the manager (see `active_scan`)
            bluez={"adapter": self._adapter_path.rsplit("/", 1)[1], "filters": cast(Any, self._filters)},
        )
        await self._go.wait()
        await self._scanner.start()
        return None

    async def _still_powered(self) -> bool:
        """One Get of the adapter's Powered (True when it cannot be told)."""
        from dbus_fast import MessageType

        try:
            async with asyncio.timeout(CLEAR_BOUND_S):
                reply = await self._manager._bus.call(self._powered_query())
        except Exception:
            return True
        return reply.message_type == MessageType.ERROR or bool(reply.body[0].value)

    def _powered_query(self) -> Any:
        """The Properties.Get of this adapter's `Powered`."""
        from dbus_fast import Message

        return Message(
            destination=BLUEZ,
            path=self._adapter_path,
            interface=PROPERTIES_IFACE,
            member="Get",
            signature="ss",
            body=[ADAPTER_IFACE, "Powered"],
        )

    async def _watch_disconnect(self, bus: Any) -> None:
        with contextlib.suppress(Exception):
            await bus.wait_for_disconnect()
        self._gone()

    def _on_preset(self, preset: bool) -> None:
        """The manager set (True) or no longer holds (False) a filter that is not discovering yet."""
        self._starting = preset

    def _on_signal(self, message: Any) -> None:
        """Adapter powered off or removed, bluetoothd gone: the session cannot go on; deaf: restart."""
        member, body = message.member, message.body
        if member == "PropertiesChanged" and message.path == self._adapter_path:
            powered = body[1].get("Powered")
            lost = powered is not None and not powered.value
            discovering = body[1].get("Discovering")
            if discovering is not None and not lost:
                self._on_discovering(bool(discovering.value))
        elif member == "InterfacesRemoved":
            lost = body[0] == self._adapter_path and ADAPTER_IFACE in body[1]
        else:
            lost = member == "NameOwnerChanged" and body[0] == BLUEZ
        if lost:
            self._gone()

    def _on_discovering(self, value: bool) -> None:
        if value:
            self._discovering.set()
            return
        self._discovering.clear()
        if self._open and not self._rediscovering:
            self._rediscovering = True
            task = asyncio.ensure_future(self._rediscover())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _rediscover(self) -> None:
        """`Discovering` false on a powered adapter (CONTRACT §6.5): send the filter again, which restarts
        the scan while bluetoothd is not discovering (adapter.c `update_discovery_filter`), else "deaf"."""
        from dbus_fast import Message, MessageType

        try:
            bus = self._manager._bus
            get = Message(
                destination=BLUEZ,
                path=self._adapter_path,
                interface=PROPERTIES_IFACE,
                member="Get",
                signature="ss",
                body=[ADAPTER_IFACE, "Powered"],
            )
            async with asyncio.timeout(REDISCOVER_BOUND_S):
                reply = await bus.call(get)
                if reply.message_type == MessageType.ERROR or not reply.body[0].value:
                    self._gone()  # powered off (or gone): not deafness
                    return
                if not self._open:
                    return
                await self._manager.set_filter(self._adapter_path, self._filters)
                await self._discovering.wait()
        except Exception:
            if self._open:
                self._open = False
                self.send(("deaf",))
        finally:
            self._rediscovering = False

    def _gone(self) -> None:
        self._lost = True
        if self._open:
            self._open = False
            self.send(("gone",))

    def _on_report(self, path: str, props: dict[str, Any]) -> None:
        """One Device1 report, as the merged properties bleak's manager holds (a copy it made for us)."""
        if not (self._open and self._manager.report):
            return
        if "Class" in props and "AdvertisingFlags" not in props:
            return  # BR/EDR only: another program's plain discovery found it (CONTRACT §6.5)
        # The fields bleak's scanner would read (scanner.py `_handle_advertising_data`), as they are: the
        # manager replaces a changed value rather than mutating it, and D-Bus `ay` values are bytes already.
        # The plain tuple crosses the pipe (marshal takes exact tuples); the observation view of the same
        # fields is built without NamedTuple's Python-level __new__.
        get = props.get
        address = props["Address"]
        fields = (
            address,
            get("RSSI", 0),  # BlueZ holds no RSSI after a 0 dBm report
            get("Name"),
            tuple(get("UUIDs", ())),
            get("ManufacturerData", _NONE),
            get("ServiceData", _NONE),
            get("TxPower"),
            None,
        )
        if self._in_scope(_as_observation(BleObservation, fields)):
            batch = self._batch
            if not batch:
                self._flush_handle = asyncio.get_running_loop().call_later(BATCH_S, self._flush)
            if self._coalesce:
                batch[address] = fields
            else:
                self._seq += 1
                batch[self._seq] = fields
            if len(batch) >= _BATCH_MAX:
                self._flush()

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        batch, self._batch = self._batch, {}
        if batch and self._out is not None:
            self._out.write(frame(("o", list(batch.values()))))

    def _on_stop(self) -> None:
        self._open = False
        self._flush()
        task = asyncio.ensure_future(self._stop())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop(self) -> None:
        """The stop; answers ("stopped", None) when BlueZ acknowledged, else the refusing rule."""
        self.send(("stopped", await self._stop_attempt()))

    async def _stop_attempt(self) -> str | None:
        from bleak.exc import BleakDBusError

        bus = None if self._manager is None else self._manager._bus
        if self._scanner is None:
            return None
        try:
            await self._scanner.stop()
        except BleakDBusError as exc:
            return None if session_gone(exc.dbus_error, exc.dbus_error_details) else exc.dbus_error
        except Exception:
            # A disconnected bus of our own proves nothing about bluetoothd: the parent runs the proof.
            return "bus-disconnected" if bus is None or not bus.connected else "backend-error"
        return None


def _gated_manager(bleak_manager: Any, on_signal: Any, on_preset: Any, on_report: Any) -> Any:
    """bleak's BlueZ manager, marking whether the message it parses is an advertisement report, handing
    reports to `on_report` (path, properties) instead of the scanner's callback, and starting discovery as
    CONTRACT §6.5 asks (`active_scan`)."""
    from bleak.backends.bluezdbus.utils import assert_reply
    from bleak.exc import BleakDBusError
    from dbus_fast import Message, Variant

    def adapter_call(path: str, member: str, *filters: dict[str, Any]) -> Message:
        body = [
            {k: v if isinstance(v, Variant) else Variant(_SIGNATURES[k], v) for k, v in f.items()}
            for f in filters
        ]
        return Message(
            destination=BLUEZ,
            path=path,
            interface=ADAPTER_IFACE,
            member=member,
            signature="a{sv}" if filters else "",
            body=body,
        )

    class ReportGate(bleak_manager.BlueZManager):  # type: ignore[misc]
        report = False

        def _parse_msg(self, message: Any) -> None:
            self.report = is_report(message)
            try:
                super()._parse_msg(message)
            finally:
                self.report = False
            if message.member != "PropertiesChanged" or message.body[0] != DEVICE_IFACE:
                on_signal(message)  # a device's properties never end or restart the session

        async def set_filter(self, adapter_path: str, filters: dict[str, Any]) -> None:
            assert_reply(await self._bus.call(adapter_call(adapter_path, "SetDiscoveryFilter", filters)))

        async def clear_filter(self, adapter_path: str) -> None:
            assert_reply(await self._bus.call(adapter_call(adapter_path, "SetDiscoveryFilter", {})))

        async def active_scan(
            self, adapter_path: str, filters: dict[str, Any], on_advert: Any, on_removed: Any
        ) -> Any:
            """bleak's `active_scan` (same removal callback, same stop), with the start of CONTRACT §6.5;
            reports go to `on_report` rather than to the scanner's `on_advert`."""
            on_advert = on_report
            async with self._bus_lock:
                self._check_adapter(adapter_path)
                self._advertisement_callbacks[adapter_path].append(on_advert)
                removed = bleak_manager.DeviceRemovedCallbackAndState(on_removed, adapter_path)
                self._device_removed_callbacks.append(removed)
                try:
                    await self._start(adapter_path, filters)
                except BaseException:
                    self._advertisement_callbacks[adapter_path].remove(on_advert)
                    self._device_removed_callbacks.remove(removed)
                    raise

            async def stop() -> None:
                self._advertisement_callbacks[adapter_path].remove(on_advert)
                self._device_removed_callbacks.remove(removed)
                async with self._bus_lock:
                    await self._stop(adapter_path)

            return stop

        async def _start(self, adapter_path: str, filters: dict[str, Any]) -> None:
            adapter = self._properties.get(adapter_path, {}).get(ADAPTER_IFACE, {})
            joining = bool(adapter.get("Discovering"))
            on_preset(True)
            try:
                try:
                    await self._start_once(adapter_path, filters, joining)
                except BleakDBusError as exc:
                    if not joining or exc.dbus_error != IN_PROGRESS:
                        raise
                    # The kernel start of the forced restart failed: bluetoothd removed us and restarts
                    # nothing, so the clients already discovering are deaf (adapter.c
                    # `start_discovery_complete`). One more forced restart, for them and for us.
                    await self._start_once(adapter_path, filters, True)
            except BaseException:
                # bleak would leave the filter pre-set; its disconnect could stop the adapter
                # (adapter.c `discovery_disconnect` -> `discovery_stop`).
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CLEAR_BOUND_S):
                        await self.clear_filter(adapter_path)
                raise
            finally:
                on_preset(False)

        async def _start_once(self, adapter_path: str, filters: dict[str, Any], joining: bool) -> None:
            # Joining a running discovery: a Pathloss-only filter first, our own one right behind the
            # StartDiscovery (pipelined), so the merged filter changes and bluetoothd restarts the
            # scan before it answers the start (adapter.c `update_discovery_filter`, `start_discovery`).
            await self.set_filter(adapter_path, JOIN_FILTER if joining else filters)
            start = asyncio.ensure_future(self._bus.call(adapter_call(adapter_path, "StartDiscovery")))
            final = asyncio.ensure_future(self.set_filter(adapter_path, filters)) if joining else None
            try:
                assert_reply(await start)
            finally:
                if final is not None:
                    await final

        async def _stop(self, adapter_path: str) -> None:
            # bleak's stop: StopDiscovery (its recovery from a rejected stop), then the filter cleared.
            from bleak.backends.bluezdbus import defs
            from bleak.exc import BleakDBusError

            reply = await self._bus.call(adapter_call(adapter_path, "StopDiscovery"))
            if reply.error_name == defs.BLUEZ_ERROR_IN_PROGRESS:
                reply = await self._recover_from_rejected_stop(adapter_path)
                if reply is None:
                    return
            try:
                assert_reply(reply)
            except BleakDBusError as exc:
                if exc.dbus_error != defs.BLUEZ_ERROR_NOT_READY:
                    raise
            else:
                await self.clear_filter(adapter_path)

    return ReportGate()


# The D-Bus types of the filter keys the worker sends (adapter.c `parsers[]`).
_SIGNATURES = {"Transport": "s", "DuplicateData": "b", "RSSI": "n", "Pathloss": "q", "UUIDs": "as"}


def main() -> None:
    """Entry point of the worker process."""
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    logging.disable(logging.CRITICAL)
    logging.getLogger().handlers.clear()
    config = _read_config()
    asyncio.run(Worker(config).run())


if __name__ == "__main__":
    main()
