"""The BLE worker: one process per BLE session, running bleak on a D-Bus connection of its own.

Started by `providers.ble.BleSession` as `python -m providers.ble_worker`; it is one BlueZ discovery client
(SPEC 6.7), so BlueZ merges its filter with the other sessions' and drops its discovery session when the
process dies (src/adapter.c `discovery_disconnect`). Rules of this file:
- it dies with the connector: `PR_SET_PDEATHSIG` (SIGKILL) and exit on EOF of its stdin;
- logging is disabled and stderr goes nowhere: no handler can carry device data; nothing touches disk;
- only advertisement reports are observations (SPEC 6.5): bleak runs its callback on every Device1
  PropertiesChanged with the merged properties (bleak/backends/bluezdbus/manager.py `_parse_msg` ->
  `_run_advertisement_callbacks`), so the worker's manager marks the message being parsed and the callback
  keeps only those that carry a report;
- in-scope observations cross to the parent in batches, as `marshal` frames of plain tuples.

Frames on stdout (4-byte big-endian length + marshal): ("bus", unique_name), ("ready",),
("error", code, rule), ("o", [observation tuples]), ("gone",), ("stopped", refusal or None).
On stdin: a first frame with the pickled config, then one byte per command (b"S": stop discovery).
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

_LEN = struct.Struct(">I")
_as_observation = tuple.__new__
STOP = b"S"
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
# The Device1 properties whose change is an advertisement report (SPEC 6.5; src/adapter.c
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
        return bool(body[0] == DEVICE_IFACE and not REPORT_PROPERTIES.isdisjoint(body[1]))
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
    """stdin: stop commands; EOF (the connector closed it or died) ends the process at once."""

    def __init__(self, on_stop: Any) -> None:
        self._on_stop = on_stop

    def data_received(self, data: bytes) -> None:
        for _ in range(data.count(STOP)):
            self._on_stop()

    def eof_received(self) -> bool | None:
        os._exit(0)

    def connection_lost(self, exc: Exception | None) -> None:
        os._exit(0)


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

    def send(self, payload: Any) -> None:
        """Queue one frame to the parent."""
        assert self._out is not None
        self._out.write(frame(payload))

    async def run(self) -> None:
        """Connect, start discovery, then serve stop commands until stdin closes."""
        loop = asyncio.get_running_loop()
        self._out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", buffering=0))
        await loop.connect_read_pipe(lambda: _Commands(self._on_stop), os.fdopen(0, "rb", buffering=0))
        error = await self._start()
        if error is not None:
            self.send(("error", *error))
        else:
            self._open = True
            self.send(("ready",))
            if self._lost:  # the adapter went away while discovery was starting
                self._gone()
        await asyncio.Event().wait()  # until stdin closes (os._exit)

    async def _start(self) -> tuple[str, str] | None:
        """Start; None on success, else (error code, rule)."""
        from bleak.exc import BleakBluetoothNotAvailableError, BleakDBusError, BleakError
        from dbus_fast.errors import DBusFastError

        try:
            return await self._start_scanning()
        except BleakBluetoothNotAvailableError:
            return ("provider-unavailable", "no-adapter")
        except BleakDBusError as exc:
            code = "provider-unavailable" if exc.dbus_error in UNAVAILABLE_ERRORS else "provider-failure"
            return (code, exc.dbus_error)
        except BleakError:
            return ("provider-unavailable", "adapter-not-found")
        except (OSError, DBusFastError, EOFError):
            return ("provider-unavailable", "bus-unreachable")

    async def _start_scanning(self) -> tuple[str, str] | None:
        from bleak import BleakScanner
        from bleak.backends.bluezdbus import manager as bleak_manager
        from dbus_fast import Message, MessageType

        self._manager = _gated_manager(bleak_manager, self._on_signal)
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
        get = Message(
            destination=BLUEZ,
            path=self._adapter_path,
            interface=PROPERTIES_IFACE,
            member="Get",
            signature="ss",
            body=[ADAPTER_IFACE, "Powered"],
        )
        reply = await bus.call(get)
        if reply.message_type == MessageType.ERROR:
            return ("provider-unavailable", reply.error_name or "no-reply")
        if not reply.body[0].value:
            return ("provider-unavailable", "powered-off")
        self._scanner = BleakScanner(
            self._on_advert,
            bluez={"adapter": self._adapter_path.rsplit("/", 1)[1], "filters": cast(Any, self._filters)},
        )
        await self._scanner.start()
        return None

    async def _watch_disconnect(self, bus: Any) -> None:
        with contextlib.suppress(Exception):
            await bus.wait_for_disconnect()
        self._gone()

    def _on_signal(self, message: Any) -> None:
        """Adapter powered off or removed, bluetoothd gone: the session cannot go on."""
        member, body = message.member, message.body
        if member == "PropertiesChanged" and message.path == self._adapter_path:
            powered = body[1].get("Powered")
            lost = powered is not None and not powered.value
        elif member == "InterfacesRemoved":
            lost = body[0] == self._adapter_path and ADAPTER_IFACE in body[1]
        else:
            lost = member == "NameOwnerChanged" and body[0] == BLUEZ
        if lost:
            self._gone()

    def _gone(self) -> None:
        self._lost = True
        if self._open:
            self._open = False
            self.send(("gone",))

    def _on_advert(self, device: Any, adv: Any) -> None:
        if not (self._open and self._manager.report):
            return
        # The plain tuple crosses the pipe (marshal takes exact tuples); the observation view of the same
        # fields is built without NamedTuple's Python-level __new__: this runs for every report.
        address = device.address
        fields = (
            address,
            adv.rssi,
            adv.local_name,
            tuple(adv.service_uuids),
            adv.manufacturer_data,
            adv.service_data,
            adv.tx_power,
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


def _gated_manager(bleak_manager: Any, on_signal: Any) -> Any:
    """bleak's BlueZ manager, marking whether the message it parses is an advertisement report."""

    class ReportGate(bleak_manager.BlueZManager):  # type: ignore[misc]
        report = False

        def _parse_msg(self, message: Any) -> None:
            self.report = is_report(message)
            try:
                super()._parse_msg(message)
            finally:
                self.report = False
            on_signal(message)

    return ReportGate()


def main() -> None:
    """Entry point of the worker process."""
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    logging.disable(logging.CRITICAL)
    logging.getLogger().handlers.clear()
    config = _read_config()
    asyncio.run(Worker(config).run())


if __name__ == "__main__":
    main()
