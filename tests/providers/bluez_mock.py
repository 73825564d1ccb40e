"""Emulated BlueZ for tests: a private dbus-daemon as the system bus and python-dbusmock's bluez5 template.

Real bleak talks to it unmodified. `BluezController` plays bluetoothd: devices appear, advertise, vanish;
adapters power off or disappear; StopDiscovery can fail or stall. Control calls use blocking libdbus
(dbus-python) on a private connection, so the controller works from any event loop or none (asyncio,
anyio, a plain thread). Never drive the mock while a stop is stalled: the stall blocks its main loop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dbus
import dbus.bus
import dbus.exceptions
import pytest

ADAPTER_IFACE = "org.bluez.Adapter1"
DEVICE_IFACE = "org.bluez.Device1"
MOCK_IFACE = "org.freedesktop.DBus.Mock"
BLUEZ_MOCK_IFACE = "org.bluez.Mock"
OBJECT_MANAGER_IFACE = "org.freedesktop.DBus.ObjectManager"
ENV_VAR = "DBUS_SYSTEM_BUS_ADDRESS"

_BUS_CONF = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""

# Replaces the template's StopDiscovery once a fault is asked for. Flag files steer it, so that lifting a
# stall needs no D-Bus call into the (blocked) mock. The stall is bounded so a forgotten lift cannot hang CI.
_STOP_DISCOVERY_CODE = """
deadline = time.time() + {max_stall_s}
while os.path.exists({stall!r}) and time.time() < deadline:
    time.sleep(0.002)
if os.path.exists({fail!r}):
    with open({fail!r}) as f:
        name, _, text = f.read().partition("\\n")
    raise dbus.exceptions.DBusException(text, name=name)
self.UpdateProperties("org.bluez.Adapter1", {{"Discovering": dbus.Boolean(False)}})
"""

MAX_STALL_S = 20.0


def _byte_array(data: bytes) -> dbus.Array:
    return dbus.Array([dbus.Byte(b) for b in data], signature="y")


def manufacturer_variant(data: Mapping[int, bytes]) -> dbus.Dictionary:
    """BlueZ's `a{qv}` ManufacturerData (the template's own AddDevice gets this type wrong)."""
    return dbus.Dictionary({dbus.UInt16(k): _byte_array(v) for k, v in data.items()}, signature="qv")


def service_data_variant(data: Mapping[str, bytes]) -> dbus.Dictionary:
    """BlueZ's `a{sv}` ServiceData."""
    return dbus.Dictionary({dbus.String(k): _byte_array(v) for k, v in data.items()}, signature="sv")


def device_path(adapter: str, address: str) -> str:
    """The BlueZ object path of a device under an adapter."""
    return f"/org/bluez/{adapter}/dev_{address.replace(':', '_').upper()}"


class BluezController:
    """Plays bluetoothd through dbusmock: devices, adverts, adapter power and StopDiscovery faults."""

    def __init__(self, emulator: BluezEmulator, adapter: str = "hci0") -> None:
        self._emulator = emulator
        self.adapter = adapter
        self._conn: Any = dbus.bus.BusConnection(emulator.address)
        self._stop_overridden: set[str] = set()
        self._burst_installed = False

    @property
    def address(self) -> str:
        """The private system bus address (also in DBUS_SYSTEM_BUS_ADDRESS while the fixture runs)."""
        return self._emulator.address

    def _call(self, path: str, iface: str, member: str, signature: str = "", *args: Any) -> Any:
        return self._conn.call_blocking("org.bluez", path, iface, member, signature, args)

    def adapter_path(self, adapter: str | None = None) -> str:
        """Object path of `adapter` (default: the controller's)."""
        return f"/org/bluez/{adapter or self.adapter}"

    def add_adapter(self, name: str | None = None, alias: str = "ci-adapter") -> str:
        """Add an adapter (powered, central role); returns its object path."""
        return str(self._call("/", BLUEZ_MOCK_IFACE, "AddAdapter", "ss", name or self.adapter, alias))

    def remove_adapter(self, name: str | None = None) -> None:
        """Remove an adapter (InterfacesRemoved), as when a dongle is unplugged."""
        self._call("/", BLUEZ_MOCK_IFACE, "RemoveAdapter", "s", name or self.adapter)

    def set_powered(self, powered: bool, adapter: str | None = None) -> None:
        """Set Adapter1.Powered and emit PropertiesChanged."""
        props = {"Powered": dbus.Boolean(powered)}
        self._call(self.adapter_path(adapter), MOCK_IFACE, "UpdateProperties", "sa{sv}", ADAPTER_IFACE, props)

    def discovering(self, adapter: str | None = None) -> bool:
        """The adapter's Discovering property."""
        path = self.adapter_path(adapter)
        value = self._call(path, "org.freedesktop.DBus.Properties", "Get", "ss", ADAPTER_IFACE, "Discovering")
        return bool(value)

    def add_device(
        self,
        address: str,
        *,
        name: str | None = None,
        rssi: int = -60,
        service_uuids: Sequence[str] = (),
        manufacturer_data: Mapping[int, bytes] | None = None,
        service_data: Mapping[str, bytes] | None = None,
        tx_power: int | None = None,
        adapter: str | None = None,
    ) -> str:
        """A device appears while scanning (AddObject + InterfacesAdded); returns its object path."""
        adapter = adapter or self.adapter
        path = device_path(adapter, address)
        props: dict[str, Any] = {
            "Address": dbus.String(address),
            "AddressType": dbus.String("random"),
            # BlueZ uses the address with dashes as alias when the device sends no name.
            "Alias": dbus.String(name or address.replace(":", "-")),
            "Adapter": dbus.ObjectPath(self.adapter_path(adapter)),
            "Paired": dbus.Boolean(False),
            "Connected": dbus.Boolean(False),
            "Trusted": dbus.Boolean(False),
            "Blocked": dbus.Boolean(False),
            "UUIDs": dbus.Array([dbus.String(u) for u in service_uuids], signature="s"),
            "RSSI": dbus.Int16(rssi),
            "ManufacturerData": manufacturer_variant(manufacturer_data or {}),
            "ServiceData": service_data_variant(service_data or {}),
        }
        if name is not None:
            props["Name"] = dbus.String(name)
        if tx_power is not None:
            props["TxPower"] = dbus.Int16(tx_power)
        typed = dbus.Dictionary(props, signature="sv")
        self._call("/", MOCK_IFACE, "AddObject", "ssa{sv}a(ssss)", path, DEVICE_IFACE, typed, [])
        added = dbus.Dictionary({DEVICE_IFACE: typed}, signature="sa{sv}")
        self._call(
            "/",
            MOCK_IFACE,
            "EmitSignal",
            "sssav",
            OBJECT_MANAGER_IFACE,
            "InterfacesAdded",
            "oa{sa{sv}}",
            [dbus.ObjectPath(path), added],
        )
        return path

    def update(
        self,
        address: str,
        *,
        rssi: int | None = None,
        name: str | None = None,
        service_uuids: Sequence[str] | None = None,
        manufacturer_data: Mapping[int, bytes] | None = None,
        service_data: Mapping[str, bytes] | None = None,
        tx_power: int | None = None,
        adapter: str | None = None,
    ) -> None:
        """A new advert or RSSI reading: PropertiesChanged from the device object."""
        props: dict[str, Any] = {}
        if rssi is not None:
            props["RSSI"] = dbus.Int16(rssi)
        if name is not None:
            props["Name"] = dbus.String(name)
            props["Alias"] = dbus.String(name)
        if service_uuids is not None:
            props["UUIDs"] = dbus.Array([dbus.String(u) for u in service_uuids], signature="s")
        if manufacturer_data is not None:
            props["ManufacturerData"] = manufacturer_variant(manufacturer_data)
        if service_data is not None:
            props["ServiceData"] = service_data_variant(service_data)
        if tx_power is not None:
            props["TxPower"] = dbus.Int16(tx_power)
        path = device_path(adapter or self.adapter, address)
        for optional in ("Name", "TxPower"):  # absent until the device first sends them
            if optional in props:
                self._ensure_property(path, optional, props[optional])
        self._call(path, MOCK_IFACE, "UpdateProperties", "sa{sv}", DEVICE_IFACE, props)

    def _ensure_property(self, path: str, name: str, value: Any) -> None:
        try:
            self._call(path, MOCK_IFACE, "AddProperty", "ssv", DEVICE_IFACE, name, value)
        except dbus.exceptions.DBusException as exc:
            if not str(exc.get_dbus_name()).endswith(".PropertyExists"):
                raise

    def burst_rssi(self, address: str, values: Sequence[int], adapter: str | None = None) -> None:
        """bluetoothd emits one RSSI PropertiesChanged per value, back to back (a loop inside the mock)."""
        if not self._burst_installed:
            code = (
                "dev = objects[args[0]]\n"
                "for v in args[1]:\n"
                "    dev.UpdateProperties('org.bluez.Device1', {'RSSI': dbus.Int16(v)})\n"
            )
            self._call("/", MOCK_IFACE, "AddMethod", "sssss", BLUEZ_MOCK_IFACE, "BurstRssi", "san", "", code)
            self._burst_installed = True
        path = device_path(adapter or self.adapter, address)
        self._call("/", BLUEZ_MOCK_IFACE, "BurstRssi", "san", path, [dbus.Int16(v) for v in values])

    def remove(self, address: str, adapter: str | None = None) -> None:
        """The device goes away (Adapter1.RemoveDevice: RemoveObject + InterfacesRemoved)."""
        adapter = adapter or self.adapter
        path = dbus.ObjectPath(device_path(adapter, address))
        self._call(self.adapter_path(adapter), ADAPTER_IFACE, "RemoveDevice", "o", path)

    def method_calls(self, method: str, adapter: str | None = None) -> list[list[Any]]:
        """Argument lists of every call of an adapter method so far."""
        rows = self._call(self.adapter_path(adapter), MOCK_IFACE, "GetMethodCalls", "s", method)
        return [list(args) for _, args in rows]

    def _override_stop(self, adapter: str | None) -> None:
        path = self.adapter_path(adapter)
        if path in self._stop_overridden:
            return
        code = _STOP_DISCOVERY_CODE.format(
            stall=str(self._emulator.stall_flag), fail=str(self._emulator.fail_flag), max_stall_s=MAX_STALL_S
        )
        self._add_adapter_method("StopDiscovery", code, adapter)
        self._stop_overridden.add(path)

    def fail_stop(
        self,
        error: str = "org.bluez.Error.Failed",
        message: str = "Operation failed",
        adapter: str | None = None,
    ) -> None:
        """Make StopDiscovery answer with a D-Bus error until `clear_fail_stop()`."""
        self._override_stop(adapter)
        self._emulator.fail_flag.write_text(f"{error}\n{message}")

    def clear_fail_stop(self) -> None:
        """StopDiscovery succeeds again."""
        self._emulator.fail_flag.unlink(missing_ok=True)

    def stall_stop(self, adapter: str | None = None) -> None:
        """Make StopDiscovery hang (no reply) until `lift_stall()`; blocks the whole mock meanwhile."""
        self._override_stop(adapter)
        self._emulator.stall_flag.touch()

    def lift_stall(self) -> None:
        """Let a stalled StopDiscovery answer (needs no D-Bus call into the blocked mock)."""
        self._emulator.stall_flag.unlink(missing_ok=True)

    def fail_start(self, error: str = "org.bluez.Error.Failed", adapter: str | None = None) -> None:
        """Make StartDiscovery answer with a D-Bus error (for the rest of this mock's life)."""
        code = f"raise dbus.exceptions.DBusException('injected', name={error!r})"
        self._add_adapter_method("StartDiscovery", code, adapter)

    def _add_adapter_method(self, method: str, code: str, adapter: str | None) -> None:
        path = self.adapter_path(adapter)
        self._call(path, MOCK_IFACE, "AddMethod", "sssss", ADAPTER_IFACE, method, "", "", code)

    def power_off_during_start(self, adapter: str | None = None) -> None:
        """StartDiscovery succeeds, but the adapter reports Powered=False before the reply goes out."""
        code = "self.UpdateProperties('org.bluez.Adapter1', {'Powered': dbus.Boolean(False)})"
        self._add_adapter_method("StartDiscovery", code, adapter)

    def stop_bluetoothd(self) -> None:
        """bluetoothd exits: org.bluez loses its owner (NameOwnerChanged)."""
        self._emulator.stop_mock()

    def stop_system_bus(self) -> None:
        """The system bus goes away and every connection with it; the controller is of no use afterwards."""
        self._emulator.stop_bus()

    def close(self) -> None:
        """Close the control connection."""
        self._conn.close()


class BluezEmulator:
    """A private system bus with dbusmock's bluez5 on it; DBUS_SYSTEM_BUS_ADDRESS points there while open."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bluez-emu-"))
        self.stall_flag = self.dir / "stop.stall"
        self.fail_flag = self.dir / "stop.fail"
        self.address = ""
        self._bus: subprocess.Popen[bytes] | None = None
        self._mock: subprocess.Popen[bytes] | None = None
        self._saved_env: str | None = None

    def __enter__(self) -> BluezEmulator:
        try:
            self._start_bus()
            self._saved_env = os.environ.get(ENV_VAR)
            os.environ[ENV_VAR] = self.address
            self._start_mock()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_bus(self) -> None:
        socket = self.dir / "system_bus_socket"
        conf = self.dir / "bus.conf"
        conf.write_text(_BUS_CONF.format(socket=socket))
        self._bus = subprocess.Popen(
            ["dbus-daemon", f"--config-file={conf}", "--nofork", "--print-address=1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._bus.stdout is not None
        self.address = self._bus.stdout.readline().decode().strip()
        self._bus.stdout.close()
        if not self.address:
            raise RuntimeError("private dbus-daemon did not start")

    def _start_mock(self) -> None:
        env = dict(os.environ, **{ENV_VAR: self.address})
        # stdout to DEVNULL: the mock logs every call and blocks once a pipe nobody reads fills up.
        self._mock = subprocess.Popen(
            [sys.executable, "-m", "dbusmock", "--system", "-t", "bluez5"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        conn: Any = dbus.bus.BusConnection(self.address)
        try:
            deadline = time.monotonic() + 10
            while not conn.name_has_owner("org.bluez"):
                if time.monotonic() > deadline or self._mock.poll() is not None:
                    raise RuntimeError("dbusmock bluez5 did not come up")
                time.sleep(0.01)
        finally:
            conn.close()

    def stop_mock(self) -> None:
        """Terminate the fake bluetoothd (its bus name vanishes)."""
        self.stall_flag.unlink(missing_ok=True)
        _terminate(self._mock)
        self._mock = None

    def stop_bus(self) -> None:
        """Terminate the private dbus-daemon."""
        _terminate(self._bus)
        self._bus = None

    def close(self) -> None:
        """Stop the mock and the bus, restore the environment, remove the temp dir."""
        self.stop_mock()
        self.stop_bus()
        if self._saved_env is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = self._saved_env
        shutil.rmtree(self.dir, ignore_errors=True)


def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=3)


class RecordingSink:
    """An ObservationSink that records everything and lets a test await what it expects."""

    def __init__(self) -> None:
        self.observations: list[Any] = []
        self.failures: list[Exception] = []

    def observe(self, observation: Any) -> None:
        """Record one observation."""
        self.observations.append(observation)

    def fail(self, error: Exception) -> None:
        """Record a session failure."""
        self.failures.append(error)

    def addresses(self) -> list[str]:
        """Addresses of every observation, in arrival order."""
        return [o.address for o in self.observations]

    async def wait_for(self, predicate: Callable[[Any], bool], timeout: float = 3.0) -> Any:
        """The first observation (already seen or arriving) that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        while True:
            for observation in self.observations:
                if predicate(observation):
                    return observation
            if time.monotonic() > deadline:
                raise AssertionError("expected observation did not arrive")
            await asyncio.sleep(0.005)

    async def wait_for_failure(self, timeout: float = 3.0) -> Exception:
        """The first failure reported to the sink."""
        deadline = time.monotonic() + timeout
        while not self.failures:
            if time.monotonic() > deadline:
                raise AssertionError("expected failure was not reported")
            await asyncio.sleep(0.005)
        return self.failures[0]


def bluez_available() -> bool:
    """True when dbus-daemon is installed (the emulator needs it)."""
    return shutil.which("dbus-daemon") is not None


@pytest.fixture
def bluez() -> Iterator[BluezController]:
    """Emulated BlueZ with adapter hci0; yields the controller. Import this fixture into a test module."""
    if not bluez_available():
        pytest.skip("dbus-daemon is not installed")
    with BluezEmulator() as emulator:
        controller = BluezController(emulator)
        try:
            controller.add_adapter()
            yield controller
        finally:
            controller.lift_stall()
            controller.close()
