"""Emulated BlueZ for tests: a private dbus-daemon as the system bus and `bluez_emu.py` as bluetoothd.

Real bleak talks to it unmodified. `BluezController` plays the radio and the operator: adapters appear,
power off or vanish; devices advertise (each call is one advert on the air, which the emulated controller
reports once per scan and bluetoothd passes on by its rules), cached devices change non-advertising
properties; StopDiscovery can fail, never answer, or the whole daemon can wedge; tests drive the
controller's scan cycle (`end_cycle`) or set its length and the daemon's timeouts (`configure`). Control
calls use blocking libdbus (dbus-python) on a private connection, so the controller works from any event
loop or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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

from providers.ble import close_links

ENV_VAR = "DBUS_SYSTEM_BUS_ADDRESS"
EMULATOR = Path(__file__).with_name("bluez_emu.py")
CONTROL_PATH = "/org/bluez/emulator"
CONTROL_IFACE = "org.bluez.Emulator"

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


def device_path(adapter: str, address: str) -> str:
    """The BlueZ object path of a device under an adapter."""
    return f"/org/bluez/{adapter}/dev_{address.replace(':', '_').upper()}"


def _advert(
    rssi: int,
    name: str | None,
    service_uuids: Sequence[str] | None,
    manufacturer_data: Mapping[int, bytes] | None,
    service_data: Mapping[str, bytes] | None,
    tx_power: int | None,
    device_class: int | None = None,
) -> dict[str, Any]:
    adv: dict[str, Any] = {"rssi": rssi, "uuids": list(service_uuids or ())}
    if device_class is not None:
        adv["class"] = device_class
    if name is not None:
        adv["name"] = name
    if manufacturer_data:
        adv["mfr"] = {str(k): v.hex() for k, v in manufacturer_data.items()}
    if service_data:
        adv["sd"] = {k: v.hex() for k, v in service_data.items()}
    if tx_power is not None:
        adv["tx_power"] = tx_power
    return adv


class BluezController:
    """Plays the radio and the operator against the emulated bluetoothd."""

    def __init__(self, emulator: BluezEmulator, adapter: str = "hci0") -> None:
        self._emulator = emulator
        self.adapter = adapter
        self._conn: Any = dbus.bus.BusConnection(emulator.address)
        # What each device advertised last: a real advertiser repeats its whole advert in every report.
        self._adverts: dict[str, dict[str, Any]] = {}

    @property
    def address(self) -> str:
        """The private system bus address (also in DBUS_SYSTEM_BUS_ADDRESS while the fixture runs)."""
        return self._emulator.address

    def control(self, op: str, **args: Any) -> Any:
        """One control call into the emulator."""
        request = json.dumps({"op": op, **args})
        answer = self._conn.call_blocking(
            "org.bluez", CONTROL_PATH, CONTROL_IFACE, "Control", "s", (request,)
        )
        return json.loads(str(answer))

    def adapter_path(self, adapter: str | None = None) -> str:
        """Object path of `adapter` (default: the controller's)."""
        return f"/org/bluez/{adapter or self.adapter}"

    def add_adapter(self, name: str | None = None, powered: bool = True) -> str:
        """Add an adapter (central role); returns its object path."""
        return str(self.control("add_adapter", name=name or self.adapter, powered=powered))

    def remove_adapter(self, name: str | None = None) -> None:
        """Remove an adapter and its devices (InterfacesRemoved), as when a dongle is unplugged."""
        self.control("remove_adapter", name=name or self.adapter)

    def set_powered(self, powered: bool, adapter: str | None = None) -> None:
        """Power the adapter on or off (off ends every discovery session on it)."""
        self.control("set_powered", name=adapter or self.adapter, powered=powered)

    def discovering(self, adapter: str | None = None) -> bool:
        """The adapter's Discovering property (bluetoothd's belief, not always the kernel's)."""
        return bool(self.control("discovering", adapter=adapter or self.adapter))

    def clients(self, adapter: str | None = None) -> list[str]:
        """Unique bus names holding a discovery session on the adapter."""
        return list(self.control("clients", adapter=adapter or self.adapter))

    def filters(self, adapter: str | None = None) -> dict[str, Any]:
        """Each client's discovery filter (None for regular discovery)."""
        return dict(self.control("filters", adapter=adapter or self.adapter))

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
        device_class: int | None = None,
        connectable: bool | None = None,
    ) -> str:
        """A device advertises (its first report creates the Device1 object); returns its object path."""
        self.advertise(
            address,
            rssi=rssi,
            name=name,
            service_uuids=service_uuids,
            manufacturer_data=manufacturer_data,
            service_data=service_data,
            tx_power=tx_power,
            adapter=adapter,
            device_class=device_class,
            connectable=connectable,
        )
        return device_path(adapter or self.adapter, address)

    def advertise(
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
        device_class: int | None = None,
        connectable: bool | None = None,
    ) -> bool:
        """One advert on the air (the device's last advert, with the given fields changed); True when the
        controller reported it and bluetoothd passed it on. `device_class`: a BR/EDR inquiry result."""
        last = self._adverts.get(address, {"rssi": -60, "uuids": []})
        adv = dict(last)
        adv.update(
            _advert(
                rssi if rssi is not None else last["rssi"],
                name,
                service_uuids,
                manufacturer_data,
                service_data,
                tx_power,
                device_class,
            )
        )
        if connectable is not None:
            adv["connectable"] = connectable
        if service_uuids is None:
            adv["uuids"] = last["uuids"]
        self._adverts[address] = adv
        return bool(self.control("report", adapter=adapter or self.adapter, address=address, adv=adv))

    def configure(
        self,
        *,
        duplicate_filter: bool | None = None,
        cycle_s: float | None = None,
        idle_s: float | None = None,
        temporary_timeout_s: float | None = None,
        mgmt_delay_s: float | None = None,
    ) -> None:
        """The controller's duplicate filter and scan cycle, bluetoothd's idle and temporary timeouts, the
        kernel's command latency (defaults: on, 10.24 s, 5 s, 30 s, 0 s)."""
        knobs = {
            "duplicate_filter": duplicate_filter,
            "cycle_s": cycle_s,
            "idle_s": idle_s,
            "temporary_timeout_s": temporary_timeout_s,
            "mgmt_delay_s": mgmt_delay_s,
        }
        self.control("configure", **{k: v for k, v in knobs.items() if v is not None})

    def end_cycle(self, adapter: str | None = None) -> bool:
        """The kernel ends the running scan now (its LE discovery timeout, or it stops by itself); True when
        a scan was running. bluetoothd restarts it by its rules."""
        return bool(self.control("end_cycle", adapter=adapter or self.adapter))

    def scanning(self, adapter: str | None = None) -> bool:
        """True while the kernel scans, whatever bluetoothd's Discovering says."""
        return bool(self.control("scanning", adapter=adapter or self.adapter))

    def scans_started(self) -> int:
        """Scans the kernel started so far (each empties the controller's duplicate filter)."""
        return int(self.control("scans_started"))

    def presets(self, adapter: str | None = None) -> list[str]:
        """Senders whose filter waits in bluetoothd's set_filter_list (pre-set, or kept after a stop)."""
        return list(self.control("presets", adapter=adapter or self.adapter))

    def fail_kernel_start(self, status: int = 0x03) -> None:
        """The next kernel start fails (MGMT_STATUS_FAILED by default)."""
        self.control("fail_kernel_start", status=status)

    def reject_kernel_stop(self) -> None:
        """The next kernel stop is rejected: the scan had just ended by itself (bluez/bluez#807)."""
        self.control("reject_kernel_stop")

    def forget_advert(self, address: str) -> None:
        """The device starts over (e.g. after it was removed): its next report is all that it sends."""
        self._adverts.pop(address, None)

    update = advertise

    def burst_rssi(self, address: str, values: Sequence[int], adapter: str | None = None) -> None:
        """Reports back to back, one per RSSI value (one control call)."""
        last = self._adverts.get(address, {"rssi": -60, "uuids": []})
        advs = [{**last, "rssi": v} for v in values]
        self.control("reports", adapter=adapter or self.adapter, address=address, advs=advs)

    def add_cached(
        self,
        address: str,
        *,
        name: str | None = None,
        service_uuids: Sequence[str] = (),
        adapter: str | None = None,
    ) -> str:
        """A device BlueZ knows from before (paired, or from an earlier scan): Device1 without RSSI."""
        return str(
            self.control(
                "add_cached",
                adapter=adapter or self.adapter,
                address=address,
                name=name,
                uuids=list(service_uuids),
            )
        )

    def set_device(self, address: str, adapter: str | None = None, **props: bool | str) -> None:
        """Non-advertising Device1 properties change (Trusted, Connected, Alias, ServicesResolved)."""
        self.control("set_device", path=device_path(adapter or self.adapter, address), props=props)

    def device_props(self, address: str, adapter: str | None = None) -> dict[str, Any] | None:
        """The Device1 properties BlueZ holds now (None once removed)."""
        result = self.control("device_props", path=device_path(adapter or self.adapter, address))
        return None if result is None else dict(result)

    def remove(self, address: str, adapter: str | None = None) -> None:
        """The device goes away (Adapter1.RemoveDevice: InterfacesRemoved)."""
        self.forget_advert(address)
        self.control("remove_device", path=device_path(adapter or self.adapter, address))

    def calls(self, method: str) -> list[list[Any]]:
        """[sender, path, args] of every call of `method` so far."""
        return [list(row) for row in self.control("calls", member=method)]

    async def settled(self, timeout: float = 10.0) -> None:
        """Return once the kernel answered every mgmt command and no discovery (re)start is due.

        bluetoothd answers a D-Bus call or handles a disconnect before the kernel answers the mgmt command
        it sent (adapter.c `discovery_stop` -> `stop_discovery_complete`; `update_discovery_filter` ->
        `start_discovery_timeout`): a client dropped by a disconnect stays listed, and a scan restarted for
        a joining filter is off the air, until then.
        """
        deadline = time.monotonic() + timeout
        while not self.control("settled"):
            if time.monotonic() > deadline:
                raise AssertionError("bluetoothd's kernel commands did not settle")
            await asyncio.sleep(0.005)  # real peer: the emulated kernel answers bluetoothd's mgmt commands

    async def called(self, method: str, unless: asyncio.Future[Any]) -> None:
        """Return once bluetoothd has received a call of `method`, or `unless` is done."""
        while not self.calls(method) and not unless.done():
            await asyncio.sleep(0.01)  # real peer: bluetoothd (the emulator) records the call

    def method_calls(self, method: str, adapter: str | None = None) -> list[list[Any]]:
        """Argument lists of every call of an adapter method so far."""
        path = self.adapter_path(adapter)
        return [row[2] for row in self.calls(method) if row[1] == path]

    def fail_stop(self, error: str = "org.bluez.Error.Failed", message: str = "Operation failed") -> None:
        """Make StopDiscovery answer with a D-Bus error until `clear_fail_stop()`."""
        self.control("fail_stop", error=error, message=message)

    def clear_fail_stop(self) -> None:
        """StopDiscovery succeeds again."""
        self.control("fail_stop", error=None)

    def stall_stop(self, sender: str | None = None) -> None:
        """The next StopDiscovery (or every one of `sender`) is never answered; its session stays."""
        self.control("stall_stop", sender=sender)

    def release_stalled(self) -> int:
        """Answer the stalled StopDiscovery calls now; returns how many there were."""
        return int(self.control("release_stalled"))

    def wedge(self) -> None:
        """bluetoothd's main loop hangs: no call is answered, no disconnect is handled, until `unwedge`."""
        self.control("wedge")

    def unwedge(self) -> None:
        """The main loop runs again and serves the backlog in order."""
        self.control("unwedge")

    def lift_stall(self) -> None:
        """End every stall (fixture teardown)."""
        self.unwedge()
        self.release_stalled()

    def fail_start(self, error: str | None = "org.bluez.Error.Failed") -> None:
        """Make StartDiscovery answer with a D-Bus error (None: succeed again)."""
        self.control("fail_start", error=error)

    def wedge_after_start(self) -> None:
        """The next StartDiscovery starts the session, then bluetoothd hangs before it replies (`wedge`)."""
        self.control("wedge_after_start")

    def power_off_during_start(self) -> None:
        """StartDiscovery succeeds, but the adapter powers off right after."""
        self.control("power_off_on_start")

    def power_off_during_kernel_start(self) -> None:
        """The adapter powers off while the next kernel start is pending: StartDiscovery says InProgress."""
        self.control("power_off_in_kernel_start")

    def stop_bluetoothd(self) -> None:
        """bluetoothd exits: org.bluez loses its owner (NameOwnerChanged)."""
        self._emulator.stop_mock()

    def start_bluetoothd(self) -> None:
        """A new bluetoothd takes org.bluez (NameOwnerChanged), with no adapter until `add_adapter`."""
        self._emulator.start_mock()

    def stop_system_bus(self) -> None:
        """The system bus goes away and every connection with it; the controller is of no use afterwards."""
        self._emulator.stop_bus()

    def close(self) -> None:
        """Close the control connection."""
        self._conn.close()


class BluezEmulator:
    """A private system bus with the emulated bluetoothd; DBUS_SYSTEM_BUS_ADDRESS points there while open."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"bluez-emu-{os.getpid()}-"))
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

    def start_mock(self) -> None:
        """Start the emulated bluetoothd (it takes org.bluez, then prints `ready`)."""
        self._start_mock()

    def _start_mock(self) -> None:
        self._mock = subprocess.Popen(
            [sys.executable, str(EMULATOR), self.address],
            stdout=subprocess.PIPE,
            stderr=self._stderr(),
        )
        assert self._mock.stdout is not None
        line = self._mock.stdout.readline()
        self._mock.stdout.close()
        if line.strip() != b"ready":
            raise RuntimeError("the emulated bluetoothd did not come up")

    @staticmethod
    def _stderr() -> Any:
        """DEVNULL, or BLUEZ_EMU_STDERR=PATH to keep the emulator's tracebacks (a test double's own bugs)."""
        path = os.environ.get("BLUEZ_EMU_STDERR")
        return subprocess.DEVNULL if not path else open(path, "ab")

    def stop_mock(self) -> None:
        """Terminate the emulated bluetoothd (its bus name vanishes)."""
        _terminate(self._mock)
        self._mock = None

    def stop_bus(self) -> None:
        """Terminate the private dbus-daemon."""
        _terminate(self._bus)
        self._bus = None

    def close(self) -> None:
        """Stop the emulator and the bus, restore the environment, remove the temp dir."""
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
            await asyncio.sleep(0.005)  # real peer: the BLE worker relays BlueZ's reports

    async def wait_for_failure(self, timeout: float = 3.0) -> Exception:
        """The first failure reported to the sink."""
        deadline = time.monotonic() + timeout
        while not self.failures:
            if time.monotonic() > deadline:
                raise AssertionError("expected failure was not reported")
            await asyncio.sleep(0.005)  # real peer: the BLE worker reports the failure
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
            with contextlib.suppress(dbus.exceptions.DBusException):
                controller.lift_stall()
            close_links()  # the connector's link outlives its sessions; the test's loop does not
            controller.close()


@pytest.fixture
def every_advert(bluez: BluezController) -> BluezController:
    """The emulated controller reports every advert, not once per scan: a controller without duplicate
    filtering, or with an advertisement monitor registered (hci_sync.c `hci_active_scan_sync`). For tests of
    what bluetoothd and the provider do with each report; the filter itself is tested on its own."""
    bluez.configure(duplicate_filter=False)
    return bluez
