"""Real `comports()` against fake USB-serial ports, inside a private mount namespace.

The host's /dev and /sys stay untouched: the scenario runs as a child process under
`unshare --mount --propagation private`, which mounts a tmpfs holding a replacement /dev and
/sys/class/tty (the layout pyserial's sysfs reader expects). Ports are plain files: the provider must
never open one, and an audit hook reports any attempt.

Pytest side: `namespace_prefix()` and `run_scenario()`. Namespace side: `python serial_ns.py ROOT`, with
the scenario as JSON on stdin and the results as JSON on stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

WORKER_THREAD = "sensorium-usb-enumeration"
_UNSHARE_VARIANTS = (
    ["unshare", "--mount", "--propagation", "private"],
    ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"],
)


@dataclass(frozen=True)
class FakeUsb:
    """Sysfs identity of one fake USB device (one or more serial interfaces)."""

    bus_path: str  # the kernel's device name, e.g. `1-2` (bus 1, port 2)
    driver_subsystem: str  # "usb-serial" (ftdi_sio: a tty child per interface) or "usb" (cdc_acm)
    vid: int
    pid: int
    serial: str
    manufacturer: str
    product: str
    num_interfaces: int


@dataclass(frozen=True)
class FakePort:
    """One tty of a fake device: which interface it sits on, and that interface's string if it has one."""

    usb: FakeUsb
    interface_number: int
    interface_string: str | None
    by_id: str  # the name udev's 60-serial.rules gives it under /dev/serial/by-id


FT232R = FakeUsb("1-2", "usb-serial", 0x0403, 0x6001, "A50285BI", "FTDI", "FT232R USB UART", 1)
FT232R_B = FakeUsb("1-4", "usb-serial", 0x0403, 0x6001, "FT9XQ2B1", "FTDI", "FT232R USB UART", 1)
FT2232 = FakeUsb("1-5", "usb-serial", 0x0403, 0x6010, "FT2KZ7Q3", "FTDI", "Dual RS232-HS", 2)
UNO = FakeUsb("1-3", "usb", 0x2341, 0x0043, "85735313", "Arduino (www.arduino.cc)", "Arduino Uno", 2)

# None: a built-in UART with no USB identity, like the VM console.
DEVICES: Mapping[str, FakePort | None] = {
    "ttyS0": None,
    "ttyUSB0": FakePort(FT232R, 0, "FT232R USB UART", "usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"),
    "ttyUSB1": FakePort(FT232R_B, 0, "FT232R USB UART", "usb-FTDI_FT232R_USB_UART_FT9XQ2B1-if00-port0"),
    # An FT2232H with a blank EEPROM: two interfaces, no interface strings.
    "ttyUSB2": FakePort(FT2232, 0, None, "usb-FTDI_Dual_RS232-HS_FT2KZ7Q3-if00-port0"),
    "ttyUSB3": FakePort(FT2232, 1, None, "usb-FTDI_Dual_RS232-HS_FT2KZ7Q3-if01-port0"),
    # CDC-ACM: interface 0 (communications) owns the tty, interface 1 carries the data.
    "ttyACM0": FakePort(UNO, 0, None, "usb-Arduino__www.arduino.cc__0043_85735313-if00"),
    # The FT232R of ttyUSB0 plugged in again and given the next free node: the same by-id link name.
    "ttyUSB4": FakePort(FT232R, 0, "FT232R USB UART", "usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"),
}


# ---------------------------------------------------------------------------------------------------------
# Pytest side


def namespace_prefix() -> list[str] | None:
    """An `unshare` command line that may mount inside its namespace here, or None."""
    if shutil.which("unshare") is None:
        return None
    with tempfile.TemporaryDirectory() as probe_dir:
        for prefix in _UNSHARE_VARIANTS:
            probe = [*prefix, "mount", "-t", "tmpfs", "sensorium-probe", probe_dir]
            done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
            if done.returncode == 0:
                return list(prefix)
    return None


def run_scenario(prefix: Sequence[str], scenario: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """Run `scenario` in a fresh private mount namespace rooted at `root`; return its JSON results."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [*prefix, sys.executable, "-W", "error", str(Path(__file__).resolve()), str(root)]
    done = subprocess.run(
        command, input=json.dumps(scenario), capture_output=True, text=True, timeout=60, env=env, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"namespace scenario failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# ---------------------------------------------------------------------------------------------------------
# Namespace side


def _mount(*args: str | Path) -> None:
    subprocess.run(["mount", *map(str, args)], check=True, capture_output=True)


def build_fake_system(root: Path) -> None:
    """Mount a tmpfs at `root` and lay it over /dev and /sys/class/tty (this namespace only)."""
    _mount("-t", "tmpfs", "sensorium-fake", root)
    dev = root / "dev"
    dev.mkdir()
    for name in ("null", "zero", "full", "random", "urandom"):
        (dev / name).touch()
        _mount("--bind", f"/dev/{name}", dev / name)
    (dev / "fd").symlink_to("/proc/self/fd")
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        (dev / name).symlink_to(f"/proc/self/fd/{number}")
    (root / "sys" / "class" / "tty").mkdir(parents=True)
    _mount("--rbind", dev, "/dev")
    _mount("--bind", root / "sys" / "class" / "tty", "/sys/class/tty")


def _sysfs_device_dir(root: Path, name: str) -> Path:
    spec = DEVICES[name]
    if spec is None:
        return root / "sys" / "devices" / "pnp0" / "00:00" / "00:00:0" / "00:00:0.0"
    return root / "sys" / "devices" / "pci0000:00" / "0000:00:14.0" / "usb1" / spec.usb.bus_path


def _bus(root: Path, subsystem: str) -> Path:
    bus = root / "sys" / "bus" / subsystem
    bus.mkdir(parents=True, exist_ok=True)
    return bus


def add_device(root: Path, name: str) -> None:
    """Create the sysfs entries of a port first, then its /dev node and by-id link."""
    spec = DEVICES[name]
    device_dir = _sysfs_device_dir(root, name)
    class_dir = root / "sys" / "class" / "tty" / name
    class_dir.mkdir(parents=True)
    if spec is None:
        device_dir.mkdir(parents=True)
        (device_dir / "subsystem").symlink_to(_bus(root, "serial-base"))
        (class_dir / "device").symlink_to(device_dir)
    else:
        _add_usb_sysfs(root, name, spec, device_dir, class_dir)
    os.mknod(Path("/dev", name), 0o600 | stat.S_IFREG)  # mknod, not open: the audit hook stays quiet
    if spec is not None:
        by_id = Path("/dev/serial/by-id")
        by_id.mkdir(parents=True, exist_ok=True)
        (by_id / spec.by_id).symlink_to(f"../../{name}")


def _add_usb_sysfs(root: Path, name: str, spec: FakePort, device_dir: Path, class_dir: Path) -> None:
    """The layout pyserial 3.5 reads (`serial/tools/list_ports_linux.py`, line numbers in the comments)."""
    usb = spec.usb
    device_dir.mkdir(parents=True, exist_ok=True)  # a second port of one device shares it
    _write_device_attributes(device_dir, usb)
    # Interface directory: `<bus path>:<bConfigurationValue>.<bInterfaceNumber>` (line 56 uses its name).
    interface_dir = device_dir / f"{usb.bus_path}:1.{spec.interface_number}"
    interface_dir.mkdir()
    (interface_dir / "bInterfaceNumber").write_text(f"{spec.interface_number:02x}\n")
    if spec.interface_string is not None:  # line 62: `interface`, absent when iInterface is 0
        (interface_dir / "interface").write_text(spec.interface_string + "\n")
    if usb.driver_subsystem == "usb-serial":  # lines 37-38: the tty is a child of the interface
        tty_dir = interface_dir / name
        tty_dir.mkdir()
        (tty_dir / "subsystem").symlink_to(_bus(root, "usb-serial"))
        (class_dir / "device").symlink_to(tty_dir)  # lines 30-32: class/tty/<name>/device -> subsystem
    else:  # lines 39-40 (cdc_acm): the tty's device is the interface itself
        (interface_dir / "subsystem").symlink_to(_bus(root, "usb"))
        (class_dir / "device").symlink_to(interface_dir)


def _write_device_attributes(device_dir: Path, usb: FakeUsb) -> None:
    """Device-level attributes, formatted as the kernel's sysfs show() functions print them."""
    for attribute, value in (
        ("idVendor", f"{usb.vid:04x}"),  # line 52
        ("idProduct", f"{usb.pid:04x}"),  # line 53
        ("serial", usb.serial),  # line 54
        ("manufacturer", usb.manufacturer),  # line 60
        ("product", usb.product),  # line 61
        ("bNumInterfaces", f"{usb.num_interfaces:2d}"),  # line 48, "%2d" in drivers/usb/core/sysfs.c
    ):
        (device_dir / attribute).write_text(value + "\n")


def vanish_attributes(root: Path, name: str) -> None:
    """idVendor/idProduct disappear, as while the kernel tears the device down (pyserial#774)."""
    device_dir = _sysfs_device_dir(root, name)
    for attribute in ("idVendor", "idProduct"):
        (device_dir / attribute).unlink()


def restore_attributes(root: Path, name: str) -> None:
    """The attributes are back (the device settled)."""
    spec = DEVICES[name]
    assert spec is not None
    _write_device_attributes(_sysfs_device_dir(root, name), spec.usb)


def remove_device(root: Path, name: str) -> None:
    """Remove the /dev node and its link first, then its sysfs entries (the device dir with its last port)."""
    spec = DEVICES[name]
    Path("/dev", name).unlink()
    shutil.rmtree(root / "sys" / "class" / "tty" / name)
    if spec is None:
        shutil.rmtree(_sysfs_device_dir(root, name))
        return
    (Path("/dev/serial/by-id") / spec.by_id).unlink()
    device_dir = _sysfs_device_dir(root, name)
    shutil.rmtree(device_dir / f"{spec.usb.bus_path}:1.{spec.interface_number}")
    if not any(p.name.startswith(f"{spec.usb.bus_path}:") for p in device_dir.iterdir()):
        shutil.rmtree(device_dir)


class _JsonSink:
    """Records observations with their time and the thread that delivered them."""

    def __init__(self, t0: float) -> None:
        self._t0 = t0
        self.events: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.threads: set[int] = set()

    def observe(self, observation: Any) -> None:
        self.threads.add(threading.get_ident())
        self.events.append(
            {
                "t": round(time.monotonic() - self._t0, 3),
                "event": observation.event,
                "device": observation.device,
                "vid": observation.vid,
                "pid": observation.pid,
                "serial_number": observation.serial_number,
                "manufacturer": observation.manufacturer,
                "product": observation.product,
                "location": observation.location,
                "interface": observation.interface,
                "stable_path": observation.stable_path,
            }
        )

    def fail(self, error: Any) -> None:
        self.failures.append(error.code)


def _scope(spec: Mapping[str, Any]) -> Any:
    from connector.core.scope import DiscoveryScope, ScopeFilter

    def scope_filter(raw: Mapping[str, Any]) -> ScopeFilter:
        return ScopeFilter(
            vid_pid=tuple((vid, pid) for vid, pid in raw.get("vid_pid", ())),
            serial_numbers=tuple(raw.get("serial_numbers", ())),
        )

    exclusions = spec.get("exclusions")
    return DiscoveryScope(
        transport="usb-serial",
        window_seconds=10,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=scope_filter(spec.get("filters", {})),
        exclusions=None if exclusions is None else scope_filter(exclusions),
        cleanup_timeout_ms=spec.get("cleanup_timeout_ms", 2000),
    )


def _workers() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == WORKER_THREAD)


async def _play(root: Path, scenario: Mapping[str, Any], opened: list[str]) -> dict[str, Any]:
    """Start one session per scope, play the device steps, stop, and check that nothing follows."""
    import anyio
    from serial.tools import list_ports

    from providers.serial import SerialProvider

    passes = {"done": 0, "failed": 0}
    real_comports = list_ports.comports

    def counted_comports() -> Any:
        try:
            return real_comports()
        except TypeError:
            passes["failed"] += 1
            raise
        finally:
            passes["done"] += 1

    list_ports.comports = counted_comports  # providers.serial looks it up at every pass

    for name in scenario["initial"]:
        add_device(root, name)
    listed = sorted(port.device for port in list_ports.comports())
    provider = SerialProvider(poll_interval_s=scenario["poll_interval_s"])
    t0 = time.monotonic()
    sinks = {name: _JsonSink(t0) for name in scenario["sessions"]}
    sessions = {
        name: await provider.start(_scope(spec), sinks[name]) for name, spec in scenario["sessions"].items()
    }
    steps: list[dict[str, Any]] = []
    for step in scenario["steps"]:
        await anyio.sleep(max(0.0, t0 + step["at_s"] - time.monotonic()))  # real peer: scripted step time
        if step["action"] == "vanish":
            vanish_attributes(root, step["device"])
            steps.append({**step, "t": round(time.monotonic() - t0, 3)})
            # Until one whole pass (of every session's worker) ran into the missing attributes.
            seen = passes["done"]
            while passes["done"] < seen + 1 + len(sessions):
                await anyio.sleep(0.01)  # real peer: the workers' passes over the namespace's sysfs
            restore_attributes(root, step["device"])
            restored_at = round(time.monotonic() - t0, 3)
            steps.append({"action": "restore", "device": step["device"], "t": restored_at})
            continue
        (add_device if step["action"] == "add" else remove_device)(root, step["device"])
        steps.append({**step, "t": round(time.monotonic() - t0, 3)})
    await anyio.sleep(max(0.0, t0 + scenario["window_s"] - time.monotonic()))  # real peer: the window
    workers_during = _workers()
    stop_ms = {}
    for name, session in sessions.items():
        started = time.monotonic()
        await session.stop()
        stop_ms[name] = round((time.monotonic() - started) * 1000, 1)
        await session.stop()  # idempotent
    counts_at_stop = {name: len(sink.events) for name, sink in sinks.items()}
    # Stop joined the workers, which deliver on the loop and wait for it: with none left, nothing can follow.
    workers_after = _workers()
    for name in scenario["after_stop"]:
        (remove_device if Path("/dev", name).exists() else add_device)(root, name)
    opened_by_provider = list(opened)
    with open("/dev/ttyS0", "rb"):  # control: the audit hook does see an open
        hook_saw_control_open = opened[len(opened_by_provider) :] == ["/dev/ttyS0"]
    return {
        "listed": listed,
        "steps": steps,
        "sessions": {name: sink.events for name, sink in sinks.items()},
        "failures": {name: sink.failures for name, sink in sinks.items()},
        "delivered_on_loop_thread": all(sink.threads <= {threading.get_ident()} for sink in sinks.values()),
        "workers_during": workers_during,
        "workers_after": workers_after,
        "stop_ms": stop_ms,
        "late_events": {name: len(sink.events) - counts_at_stop[name] for name, sink in sinks.items()},
        "opened": opened_by_provider,
        "failed_passes": passes["failed"],
        "hook_saw_control_open": hook_saw_control_open,
    }


def _record_tty_opens(opened: list[str]) -> None:
    """Audit every open of a /dev/tty* path in this process (the provider must make none)."""

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args and isinstance(args[0], str | bytes):
            path = os.fsdecode(args[0])
            if path.startswith("/dev/tty"):
                opened.append(path)

    sys.addaudithook(hook)


def main(root: Path) -> None:
    """Namespace entry point."""
    import anyio

    scenario = json.load(sys.stdin)
    opened: list[str] = []
    _record_tty_opens(opened)
    build_fake_system(root)
    result = anyio.run(_play, root, scenario, opened)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
