"""Write the synthesised `hw-fixtures/` sessions (CONTRACT §13), deterministically from a fixed seed.

Nothing here came from hardware: every header says `"source": "synthesised"`. Addresses are locally
administered random MACs, IPs come from the documentation ranges 192.0.2.0/24 and 198.51.100.0/24, and
serial numbers are fake. Run `python scripts/synth_fixtures.py [--out DIR]`; the same seed gives the same
bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 20261130
RECORDED_AT = "2026-11-30T09:00:00Z"
FORMAT = "sensorium-hw-fixture.v1"
GENERATOR = {"generator": "scripts/synth_fixtures.py", "seed": SEED, "format": 1}

APPLE = 0x004C
MICROSOFT = 0x0006
NORDIC = 0x0059
POLAR = 0x006B
GARMIN = 0x0087

Line = dict[str, Any]


def uuid16(short: int) -> str:
    """The 128-bit Bluetooth base UUID of a 16-bit short form."""
    return f"0000{short:04x}-0000-1000-8000-00805f9b34fb"


HEART_RATE = uuid16(0x180D)
BATTERY = uuid16(0x180F)
DEVICE_INFO = uuid16(0x180A)
ENVIRONMENTAL = uuid16(0x181A)
CYCLING_POWER = uuid16(0x1818)
CYCLING_CADENCE = uuid16(0x1816)
EDDYSTONE = uuid16(0xFEAA)
BTHOME = uuid16(0xFCD2)
XIAOMI = uuid16(0xFE95)
NUS = "6e400001-b5a3-f393-e0a9-e50e24dcca9e"


def header(transport: str, adapter: str | None, notes: str) -> Line:
    """The CONTRACT §13 header line of a synthesised session."""
    return {
        "fixture": FORMAT,
        "transport": transport,
        "source": "synthesised",
        "recorded_at": RECORDED_AT,
        "adapter": adapter,
        "versions": dict(GENERATOR),
        "notes": notes,
    }


def random_mac(rng: random.Random) -> str:
    """A locally administered, unicast MAC address (bit 1 of the first octet set, bit 0 clear)."""
    octets = [rng.randrange(256) for _ in range(6)]
    octets[0] = (octets[0] & 0xFC) | 0x02
    return ":".join(f"{octet:02X}" for octet in octets)


def hex_bytes(rng: random.Random, count: int) -> str:
    """`count` random bytes in hex."""
    return rng.randbytes(count).hex()


# ---- BLE ---------------------------------------------------------------------------------------------------


@dataclass
class Advertiser:
    """One synthetic BLE device: how it advertises and when it is in range."""

    address: str
    interval_ms: int
    rssi: int
    appear_ms: int
    leave_ms: int
    payload: Callable[[random.Random, int], Line]
    drift: int = 2
    rssi_floor: int = -100
    rssi_ceiling: int = -35
    state: dict[str, Any] = field(default_factory=dict)


def ble_lines(rng: random.Random, devices: list[Advertiser], duration_ms: int) -> list[Line]:
    """Every advert of every device in time order; RSSI drifts as a bounded random walk."""
    lines: list[tuple[int, int, Line]] = []
    for order, device in enumerate(devices):
        t_ms = device.appear_ms + rng.randrange(device.interval_ms)
        rssi = device.rssi
        seq = 0
        while t_ms < min(device.leave_ms, duration_ms):
            rssi = max(
                device.rssi_floor, min(device.rssi_ceiling, rssi + rng.randint(-device.drift, device.drift))
            )
            line: Line = {"t_ms": t_ms, "address": device.address, "rssi": rssi}
            line.update(device.payload(rng, seq))
            lines.append((t_ms, order, line))
            seq += 1
            jitter = device.interval_ms // 10
            t_ms += device.interval_ms + rng.randint(-jitter, jitter)
    lines.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in lines]


def apple_continuity(rng: random.Random) -> Callable[[random.Random, int], Line]:
    """Apple nearby-info / find-my style payloads that rotate bytes now and then; no name."""
    kind = rng.choice(["1005", "1006", "1219", "0c0e", "1007"])
    body = hex_bytes(rng, rng.choice([3, 4, 5, 8]))
    connectable = rng.random() < 0.4

    def payload(r: random.Random, seq: int) -> Line:
        nonlocal body
        if seq % 15 == 14:
            body = hex_bytes(r, len(body) // 2)
        return {"manufacturer_data": {str(APPLE): kind + body}, "connectable": connectable}

    return payload


def microsoft_cdp(rng: random.Random) -> Callable[[random.Random, int], Line]:
    """Microsoft Connected Devices Platform beacons: fixed header, rotating salt/hash; no name."""
    salt = hex_bytes(rng, 4)

    def payload(r: random.Random, seq: int) -> Line:
        nonlocal salt
        if seq % 20 == 19:
            salt = hex_bytes(r, 4)
        return {
            "manufacturer_data": {str(MICROSOFT): "01092022" + salt + "a1b2c3d4e5f6a7b8"},
            "connectable": False,
        }

    return payload


def ibeacon(rng: random.Random, major: int, minor: int) -> Callable[[random.Random, int], Line]:
    """An iBeacon frame: 0x02 0x15, proximity UUID, major, minor, measured power."""
    proximity = hex_bytes(rng, 16)
    frame = f"0215{proximity}{major:04x}{minor:04x}c5"

    def payload(_: random.Random, __: int) -> Line:
        return {"manufacturer_data": {str(APPLE): frame}, "connectable": False, "tx_power": -59}

    return payload


def eddystone(rng: random.Random, url: bool) -> Callable[[random.Random, int], Line]:
    """Eddystone UID or URL frames as service data of 0xFEAA."""
    frame = ("10ec03" + b"example".hex() + "07") if url else ("00ec" + hex_bytes(rng, 10) + hex_bytes(rng, 6))

    def payload(_: random.Random, __: int) -> Line:
        return {"service_uuids": [EDDYSTONE], "service_data": {EDDYSTONE: frame}, "connectable": False}

    return payload


def env_sensor(rng: random.Random, name: str | None, bthome: bool) -> Callable[[random.Random, int], Line]:
    """A temperature/humidity sensor whose service data changes with each reading."""
    temperature = rng.randint(1800, 2600)

    def payload(r: random.Random, seq: int) -> Line:
        nonlocal temperature
        temperature += r.randint(-3, 3)
        if bthome:
            data = {
                BTHOME: f"4002{temperature & 0xFFFF:04x}03{r.randint(3000, 6000):04x}"
                f"01{r.randint(60, 100):02x}"
            }
        else:
            data = {ENVIRONMENTAL: f"{temperature & 0xFFFF:04x}{r.randint(3000, 6000):04x}{seq & 0xFF:02x}"}
        line: Line = {"service_uuids": sorted(data), "service_data": data, "connectable": False}
        if name is not None:
            line["name"] = name
        return line

    return payload


def named_peripheral(
    name: str, uuids: list[str], company: int | None, rng: random.Random, tx_power: int | None = None
) -> Callable[[random.Random, int], Line]:
    """A connectable peripheral with a local name, services and maybe manufacturer data."""
    blob = hex_bytes(rng, 6)

    def payload(_: random.Random, __: int) -> Line:
        line: Line = {"name": name, "service_uuids": uuids, "connectable": True}
        if company is not None:
            line["manufacturer_data"] = {str(company): blob}
        if tx_power is not None:
            line["tx_power"] = tx_power
        return line

    return payload


def heart_rate_strap(name: str, company: int, rng: random.Random) -> Callable[[random.Random, int], Line]:
    """A heart-rate strap: 0x180D and battery, a vendor blob, constant tx power."""
    return named_peripheral(name, [HEART_RATE, BATTERY], company, rng, tx_power=0)


def presence(rng: random.Random, duration_ms: int) -> tuple[int, int]:
    """When a device is in range: mostly the whole session, some arrive late, some leave early."""
    roll = rng.random()
    if roll < 0.15:
        return rng.randrange(duration_ms // 6, duration_ms * 2 // 3), duration_ms
    if roll < 0.30:
        return 0, rng.randrange(duration_ms // 4, duration_ms * 5 // 6)
    return 0, duration_ms


def device(
    rng: random.Random,
    duration_ms: int,
    interval_ms: int,
    rssi: int,
    payload: Callable[[random.Random, int], Line],
    *,
    stay: bool = False,
) -> Advertiser:
    """An advertiser with a random address and presence window."""
    appear, leave = (0, duration_ms) if stay else presence(rng, duration_ms)
    return Advertiser(random_mac(rng), interval_ms, rssi, appear, leave, payload)


def ble_office_crowd(rng: random.Random) -> tuple[Line, list[Line]]:
    """A busy open-plan office: 200+ devices over 30 s, mostly nameless phone and laptop noise."""
    duration = 30_000
    devices: list[Advertiser] = []
    for _ in range(110):
        devices.append(
            device(rng, duration, rng.choice([700, 1000, 1200]), rng.randint(-95, -55), apple_continuity(rng))
        )
    for _ in range(42):
        devices.append(
            device(rng, duration, rng.choice([1000, 1500, 2000]), rng.randint(-98, -60), microsoft_cdp(rng))
        )
    for minor in range(10):
        devices.append(
            device(rng, duration, 1000, rng.randint(-90, -60), ibeacon(rng, 1001, minor), stay=True)
        )
    for index in range(8):
        devices.append(
            device(rng, duration, 1000, rng.randint(-92, -62), eddystone(rng, url=index % 3 == 0), stay=True)
        )
    for index in range(16):
        name = f"SYNTH-ENV-{index:02d}" if index % 2 == 0 else None
        devices.append(
            device(rng, duration, 2000, rng.randint(-90, -50), env_sensor(rng, name, index % 4 == 1))
        )
    peripherals = [
        ("SYNTH Buds Pro", [uuid16(0xFE2C)], 0x0075),
        ("SYNTH Keyboard K3", [uuid16(0x1812)], MICROSOFT),
        ("SYNTH Mouse M2", [uuid16(0x1812)], None),
        ("SYNTH Watch 4", [HEART_RATE, BATTERY], 0x0075),
        ("SYNTH Speaker", [uuid16(0x110B)], None),
        ("SYNTH Pen", [uuid16(0x1812)], MICROSOFT),
        ("SYNTH Tag", [uuid16(0xFD5A)], None),
        ("SYNTH Scale", [uuid16(0x181D)], None),
        ("SYNTH Lamp", [NUS], NORDIC),
        ("SYNTH Lock", [uuid16(0xFE78)], None),
        ("SYNTH Band 7", [HEART_RATE], GARMIN),
        ("SYNTH Headset", [uuid16(0x184E)], None),
        ("SYNTH Remote", [uuid16(0x1812)], None),
        ("SYNTH Thermostat", [ENVIRONMENTAL], NORDIC),
        ("SYNTH Projector", [], None),
        ("SYNTH Dongle", [NUS], NORDIC),
        ("SYNTH Glucose", [uuid16(0x1808)], None),
        ("SYNTH Cuff", [uuid16(0x1810)], None),
        ("SYNTH Kettle", [], None),
        ("SYNTH Plant", [ENVIRONMENTAL], None),
        ("SYNTH Trainer", [CYCLING_POWER], GARMIN),
        ("SYNTH Beacon Badge", [], NORDIC),
    ]
    for name, uuids, company in peripherals:
        devices.append(
            device(
                rng,
                duration,
                rng.choice([500, 1000, 1500]),
                rng.randint(-85, -45),
                named_peripheral(name, uuids, company, rng, tx_power=rng.choice([None, -4, 0, 4])),
            )
        )
    notes = (
        "Synthesised, not recorded: an open-plan office over 30 s with 208 advertisers - Apple continuity "
        "(0x004c) and Microsoft CDP (0x0006) background noise without names, "
        "10 iBeacons, 8 Eddystone beacons, "
        "16 environmental sensors with service data (half unnamed, some BTHome), 22 named peripherals. RSSI "
        "drifts as a bounded random walk; about 15% of devices arrive late and 15% leave early."
    )
    return header("ble", "hci0", notes), ble_lines(rng, devices, duration)


def ble_heart_rate_lab(rng: random.Random) -> tuple[Line, list[Line]]:
    """A sports lab: three heart-rate straps (0x180D), cycling sensors and a little phone noise."""
    duration = 20_000
    devices = [
        Advertiser(random_mac(rng), 1000, -52, 0, duration, heart_rate_strap("SYNTH HRM-A1", POLAR, rng)),
        Advertiser(random_mac(rng), 1000, -61, 0, 12_000, heart_rate_strap("SYNTH HRM-B2", POLAR, rng)),
        Advertiser(random_mac(rng), 800, -70, 4_000, duration, heart_rate_strap("SYNTH HRM-C3", GARMIN, rng)),
        Advertiser(
            random_mac(rng),
            1000,
            -66,
            0,
            duration,
            named_peripheral("SYNTH Power Meter", [CYCLING_POWER], GARMIN, rng, tx_power=4),
        ),
        Advertiser(
            random_mac(rng),
            1000,
            -73,
            0,
            duration,
            named_peripheral("SYNTH Cadence", [CYCLING_CADENCE, BATTERY], None, rng),
        ),
        Advertiser(
            random_mac(rng),
            1500,
            -80,
            2_000,
            duration,
            named_peripheral("SYNTH Bike Computer", [DEVICE_INFO], GARMIN, rng),
        ),
    ]
    for _ in range(6):
        devices.append(device(rng, duration, 1000, rng.randint(-95, -70), apple_continuity(rng)))
    notes = (
        "Synthesised, not recorded: a sports lab over 20 s - three heart-rate straps advertising 0x180d and "
        "0x180f (one leaves at 12 s, one arrives at 4 s), a power meter "
        "(0x1818), a cadence sensor (0x1816), a "
        "bike computer, and six nameless Apple continuity advertisers as background."
    )
    return header("ble", "hci0", notes), ble_lines(rng, devices, duration)


def ble_mixed_bench(rng: random.Random) -> tuple[Line, list[Line]]:
    """An electronics bench: dev boards with the Nordic UART service, sensors, beacons, a renamed device."""
    duration = 15_000
    renamed = Advertiser(
        random_mac(rng),
        500,
        -48,
        0,
        duration,
        lambda _r, seq: {
            "name": "SYNTH-DFU" if seq >= 14 else "SYNTH-Board-7",
            "service_uuids": [NUS],
            "manufacturer_data": {str(NORDIC): "0201" if seq >= 14 else "0100"},
            "connectable": True,
        },
    )
    devices = [
        renamed,
        Advertiser(
            random_mac(rng),
            300,
            -40,
            0,
            duration,
            named_peripheral("SYNTH-Board-1", [NUS], NORDIC, rng, tx_power=0),
        ),
        Advertiser(
            random_mac(rng),
            300,
            -44,
            3_000,
            11_000,
            named_peripheral("SYNTH-Board-2", [NUS], NORDIC, rng, tx_power=-8),
        ),
        Advertiser(random_mac(rng), 1000, -58, 0, duration, env_sensor(rng, "SYNTH-THERMO", bthome=True)),
        Advertiser(random_mac(rng), 1000, -63, 0, duration, env_sensor(rng, None, bthome=False)),
        Advertiser(random_mac(rng), 1000, -70, 0, duration, ibeacon(rng, 7, 1)),
        Advertiser(random_mac(rng), 1000, -75, 0, duration, eddystone(rng, url=True)),
        Advertiser(
            random_mac(rng),
            2000,
            -81,
            0,
            duration,
            lambda _r, _s: {
                "service_uuids": [XIAOMI],
                "service_data": {XIAOMI: "5020aa01" + "1a"},
                "connectable": False,
            },
        ),
    ]
    for _ in range(12):
        devices.append(device(rng, duration, 1000, rng.randint(-95, -65), apple_continuity(rng)))
    for _ in range(5):
        devices.append(device(rng, duration, 1500, rng.randint(-97, -70), microsoft_cdp(rng)))
    notes = (
        "Synthesised, not recorded: an electronics bench over 15 s - dev boards with the Nordic UART service "
        "(one renames itself to a DFU bootloader at 7 s, one is powered from 3 s to 11 s), BTHome and "
        "environmental sensors, an iBeacon, an Eddystone URL beacon, a Xiaomi 0xfe95 sensor, and Apple and "
        "Microsoft background noise."
    )
    return header("ble", "hci0", notes), ble_lines(rng, devices, duration)


# ---- USB / serial ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Port:
    """A serial port and its USB descriptor (empty for a built-in UART)."""

    device: str
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    manufacturer: str | None = None
    product: str | None = None
    location: str | None = None
    interface: str | None = None

    def line(self, t_ms: int, event: str) -> Line:
        """The fixture line for this port at `t_ms`."""
        line: Line = {"t_ms": t_ms, "event": event, "device": self.device}
        for key in ("vid", "pid", "serial_number", "manufacturer", "product", "location", "interface"):
            value = getattr(self, key)
            if value is not None:
                line[key] = value
        return line


def ftdi(device: str, serial: str, location: str) -> Port:
    """An FTDI FT232R (0403:6001)."""
    return Port(device, 0x0403, 0x6001, serial, "FTDI", "FT232R USB UART", location, "FT232R USB UART")


def cp210x(device: str, serial: str, location: str) -> Port:
    """A Silicon Labs CP2102 (10c4:ea60)."""
    return Port(
        device, 0x10C4, 0xEA60, serial, "Silicon Labs", "CP2102 USB to UART Bridge Controller", location
    )


def ch340(device: str, location: str) -> Port:
    """A WCH CH340 clone (1a86:7523): no serial number, as those chips have none."""
    return Port(device, 0x1A86, 0x7523, None, "QinHeng Electronics", "USB Serial", location)


def arduino(device: str, serial: str, location: str) -> Port:
    """An Arduino Uno R3 in CDC-ACM mode (2341:0043)."""
    return Port(device, 0x2341, 0x0043, serial, "Arduino (www.arduino.cc)", "Arduino Uno", location, "ACM")


CONSOLE = Port("/dev/ttyS0")


def usb_lines(
    schedule: list[tuple[Port, list[tuple[int, int]]]], duration_ms: int, pass_ms: int, rng: random.Random
) -> list[Line]:
    """Enumeration passes every `pass_ms`: present ports are re-reported as `add`, departures as `remove`."""
    lines: list[Line] = []
    offset = rng.randrange(50, 200)
    present: set[str] = set()
    for t_ms in range(offset, duration_ms, pass_ms):
        for port, spans in schedule:
            inside = any(start <= t_ms < end for start, end in spans)
            if inside:
                lines.append(port.line(t_ms, "add"))
                present.add(port.device)
            elif port.device in present:
                lines.append(port.line(t_ms, "remove"))
                present.discard(port.device)
    return lines


def usb_bench_hotplug(rng: random.Random) -> tuple[Line, list[Line]]:
    """A bench over 20 s: one adapter of each common chip plugged and unplugged, and the VM console."""
    duration = 20_000
    schedule = [
        (CONSOLE, [(0, duration)]),
        (ftdi("/dev/ttyUSB0", "SYNTHFT0001", "1-1.2"), [(0, duration)]),
        (arduino("/dev/ttyACM0", "SYNTH-ARD-0001", "1-1.4:1.0"), [(2_000, 16_000), (18_000, duration)]),
        (cp210x("/dev/ttyUSB1", "SYNTH-CP-0001", "1-1.3"), [(4_000, 13_000)]),
        (ch340("/dev/ttyUSB2", "1-1.1"), [(7_000, duration)]),
    ]
    notes = (
        "Synthesised, not recorded: enumeration passes every second over 20 s. ttyS0 is the built-in console "
        "with no USB descriptor; an FTDI 0403:6001 is attached throughout; an "
        "Arduino 2341:0043 arrives at 2 s, "
        "leaves at 16 s and returns at 18 s; a CP210x 10c4:ea60 is attached from 4 s to 13 s; a CH340 "
        "1a86:7523 (no serial number) arrives at 7 s. Serial numbers are fake."
    )
    return header("usb-serial", None, notes), usb_lines(schedule, duration, 1000, rng)


def usb_lab_rack(rng: random.Random) -> tuple[Line, list[Line]]:
    """A test rack over 30 s: several adapters of the same chip told apart by serial number."""
    duration = 30_000
    schedule = [
        (CONSOLE, [(0, duration)]),
        (Port("/dev/ttyS1"), [(0, duration)]),
        (ftdi("/dev/ttyUSB0", "SYNTHFT0101", "2-1.1"), [(0, duration)]),
        (ftdi("/dev/ttyUSB1", "SYNTHFT0102", "2-1.2"), [(0, duration)]),
        (ftdi("/dev/ttyUSB2", "SYNTHFT0103", "2-1.3"), [(0, 21_000)]),
        (cp210x("/dev/ttyUSB3", "SYNTH-CP-0101", "2-1.4"), [(0, duration)]),
        (cp210x("/dev/ttyUSB4", "SYNTH-CP-0102", "2-1.5"), [(9_000, duration)]),
        (arduino("/dev/ttyACM0", "SYNTH-ARD-0101", "2-1.6:1.0"), [(0, duration)]),
        (arduino("/dev/ttyACM1", "SYNTH-ARD-0102", "2-1.7:1.0"), [(0, 5_000), (6_000, duration)]),
    ]
    notes = (
        "Synthesised, not recorded: a test rack over 30 s with two built-in UARTs (ttyS0, ttyS1, no USB "
        "descriptor), three FTDI 0403:6001 (one unplugged at 21 s), two CP210x 10c4:ea60 (one plugged in at "
        "9 s) and two Arduino 2341:0043 (one resets between 5 s and 6 s). Serial numbers are fake."
    )
    return header("usb-serial", None, notes), usb_lines(schedule, duration, 1000, rng)


def usb_clone_reset(rng: random.Random) -> tuple[Line, list[Line]]:
    """A short session over 10 s: a CH340 clone board that resets twice, an Arduino and the console."""
    duration = 10_000
    schedule = [
        (CONSOLE, [(0, duration)]),
        (ch340("/dev/ttyUSB0", "3-2"), [(0, 3_000), (4_000, 7_000), (8_000, duration)]),
        (arduino("/dev/ttyACM0", "SYNTH-ARD-0201", "3-1:1.0"), [(1_000, duration)]),
    ]
    notes = (
        "Synthesised, not recorded: passes every 500 ms over 10 s. A CH340 "
        "1a86:7523 clone board resets twice "
        "(gone 3-4 s and 7-8 s), an Arduino 2341:0043 appears at 1 s, ttyS0 is the console without USB info."
    )
    return header("usb-serial", None, notes), usb_lines(schedule, duration, 500, rng)


# ---- mDNS --------------------------------------------------------------------------------------------------


@dataclass
class Service:
    """An mDNS service instance."""

    instance: str
    service_type: str
    server: str
    address: str
    port: int
    txt: dict[str, str]
    ttl: int = 120

    @property
    def name(self) -> str:
        """The full instance name, as zeroconf reports it."""
        return f"{self.instance}.{self.service_type}"

    def line(self, t_ms: int, event: str) -> Line:
        """The fixture line for an event on this service."""
        if event == "remove":
            return {"t_ms": t_ms, "event": event, "service_type": self.service_type, "name": self.name}
        return {
            "t_ms": t_ms,
            "event": event,
            "service_type": self.service_type,
            "name": self.name,
            "server": self.server,
            "addresses": [self.address],
            "port": self.port,
            "txt": dict(self.txt),
            "ttl": self.ttl,
        }


HTTP = "_http._tcp.local."
IPP = "_ipp._tcp.local."
IPPS = "_ipps._tcp.local."
PRINTER = "_printer._tcp.local."
HAP = "_hap._tcp.local."
GOOGLECAST = "_googlecast._tcp.local."
AIRPLAY = "_airplay._tcp.local."
SSH = "_ssh._tcp.local."
SMB = "_smb._tcp.local."
WORKSTATION = "_workstation._tcp.local."


def mdns_home(rng: random.Random) -> tuple[Line, list[Line]]:
    """A home network over 30 s: router, NAS, printer, HomeKit, cast targets; TXT updates and departures."""
    router = Service("SYNTH Router", HTTP, "synth-router.local.", "192.0.2.1", 80, {"path": "/"})
    nas = Service("SYNTH NAS", HTTP, "synth-nas.local.", "192.0.2.10", 5000, {"path": "/", "vendor": "synth"})
    nas_smb = Service("SYNTH NAS", SMB, "synth-nas.local.", "192.0.2.10", 445, {})
    printer = Service(
        "SYNTH Inkjet 3000",
        IPP,
        "synth-inkjet.local.",
        "192.0.2.20",
        631,
        {"rp": "ipp/print", "ty": "SYNTH Inkjet 3000", "printer-state": "3"},
    )
    bulb = Service(
        "SYNTH Bulb 1A2B",
        HAP,
        "synth-bulb.local.",
        "192.0.2.31",
        8080,
        {"c#": "1", "s#": "1", "ff": "0", "ci": "5", "sf": "0", "md": "SYNTH Bulb"},
    )
    plug = Service(
        "SYNTH Plug 3C4D",
        HAP,
        "synth-plug.local.",
        "192.0.2.32",
        8080,
        {"c#": "4", "s#": "1", "ff": "0", "ci": "7", "sf": "1", "md": "SYNTH Plug"},
    )
    tv = Service(
        "SYNTH Living Room TV",
        GOOGLECAST,
        "synth-tv.local.",
        "192.0.2.40",
        8009,
        {"fn": "Living Room TV", "md": "SYNTH Cast", "rs": "", "st": "0"},
    )
    speaker = Service(
        "SYNTH Kitchen Speaker",
        GOOGLECAST,
        "synth-speaker.local.",
        "192.0.2.41",
        8009,
        {"fn": "Kitchen Speaker", "md": "SYNTH Mini", "rs": "", "st": "0"},
    )
    airplay = Service(
        "SYNTH Lounge",
        AIRPLAY,
        "synth-lounge.local.",
        "192.0.2.42",
        7000,
        {"model": "SYNTH,1", "flags": "0x4"},
    )
    laptop = Service("synth-laptop", SSH, "synth-laptop.local.", "192.0.2.77", 22, {})
    events: list[tuple[int, Line]] = [
        (rng.randrange(50, 1500), service.line(0, "add"))
        for service in (router, nas, nas_smb, printer, bulb, plug, tv, speaker, airplay)
    ]
    story: list[tuple[int, Service, str, dict[str, str]]] = [
        (6_000, laptop, "add", {}),
        (8_000, tv, "update", {"rs": "Playing", "st": "1"}),
        (11_500, bulb, "update", {"c#": "2"}),
        (14_000, speaker, "remove", {}),
        (16_000, printer, "update", {"printer-state": "4"}),
        (21_000, printer, "update", {"printer-state": "3"}),
        (22_000, laptop, "remove", {}),
        (25_000, speaker, "add", {}),
        (27_500, tv, "update", {"rs": "", "st": "0"}),
    ]
    for t_ms, service, event, txt in story:
        service.txt = {**service.txt, **txt}
        events.append((t_ms, service.line(0, event)))
    notes = (
        "Synthesised, not recorded: a home network over 30 s on documentation addresses (192.0.2.0/24) - a "
        "router and a NAS (_http._tcp, _smb._tcp), an IPP printer whose "
        "printer-state TXT changes, two HomeKit "
        "accessories (_hap._tcp, one c# bump), two Cast targets (_googlecast._tcp; the TV starts and stops "
        "playing, the speaker leaves at 14 s and returns at 25 s), an AirPlay "
        "receiver, and a laptop's _ssh._tcp "
        "from 6 s to 22 s."
    )
    return header("mdns", "127.0.0.1", notes), timed(events)


def timed(events: list[tuple[int, Line]]) -> list[Line]:
    """Stamp each line with its time and sort."""
    stamped = []
    for order, (t_ms, line) in enumerate(events):
        line = dict(line)
        line["t_ms"] = t_ms
        stamped.append((t_ms, order, line))
    stamped.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in stamped]


def mdns_office_printers(rng: random.Random) -> tuple[Line, list[Line]]:
    """An office over 20 s: printers announced under several types, state changes and a printer going away."""
    printers = [
        Service(
            f"SYNTH Laser {floor}F",
            kind,
            f"synth-laser-{floor}f.local.",
            f"198.51.100.{10 + floor}",
            port,
            {
                "rp": "ipp/print",
                "ty": f"SYNTH Laser {floor}F",
                "printer-state": "3",
                "pdl": "application/pdf",
            },
        )
        for floor in (1, 2, 3)
        for kind, port in ((IPP, 631), (IPPS, 631), (PRINTER, 515))
    ]
    scanner = Service("SYNTH Scanner", HTTP, "synth-scanner.local.", "198.51.100.30", 80, {"path": "/eSCL"})
    events: list[tuple[int, Line]] = [
        (rng.randrange(40, 900), service.line(0, "add")) for service in printers
    ]
    events.append((2_500, scanner.line(0, "add")))
    second_floor = [service for service in printers if "2F" in service.instance]
    for t_ms, state in ((5_000, "4"), (9_000, "5"), (12_000, "3")):
        for service in second_floor[:2]:
            service.txt = {**service.txt, "printer-state": state}
            events.append((t_ms, service.line(0, "update")))
    third_floor = [service for service in printers if "3F" in service.instance]
    events.extend((15_000, service.line(0, "remove")) for service in third_floor)
    events.append((18_000, scanner.line(0, "remove")))
    notes = (
        "Synthesised, not recorded: an office over 20 s on documentation addresses (198.51.100.0/24) - three "
        "printers each announced as _ipp._tcp, _ipps._tcp and _printer._tcp; the 2nd-floor printer's "
        "printer-state TXT goes 4 -> 5 -> 3; the 3rd-floor printer leaves at 15 s; an eSCL scanner "
        "(_http._tcp) is present from 2.5 s to 18 s."
    )
    return header("mdns", "127.0.0.1", notes), timed(events)


def mdns_short_ttl(rng: random.Random) -> tuple[Line, list[Line]]:
    """Churn over 20 s: short-TTL records that are refreshed, updated, or left to expire without a goodbye."""
    hosts = [
        Service(
            f"synth-ws-{index:02d}",
            WORKSTATION,
            f"synth-ws-{index:02d}.local.",
            f"198.51.100.{100 + index}",
            9,
            {},
            ttl=rng.choice([2, 3, 5]),
        )
        for index in range(6)
    ]
    web = [
        Service(
            f"SYNTH Dashboard {index}",
            HTTP,
            f"synth-dash-{index}.local.",
            f"192.0.2.{150 + index}",
            8080 + index,
            {"path": "/", "v": "1"},
            ttl=4,
        )
        for index in range(4)
    ]
    ssh = Service("synth-build-box", SSH, "synth-build.local.", "192.0.2.200", 22, {}, ttl=120)
    events: list[tuple[int, Line]] = [(100, ssh.line(0, "add"))]
    for index, service in enumerate(hosts):
        last = 20_000 if index % 2 == 0 else 8_000 + 1_000 * index
        events.extend(
            (t_ms, service.line(0, "add")) for t_ms in range(200 + 50 * index, last, service.ttl * 800)
        )
    for index, service in enumerate(web):
        for t_ms in range(300 + 70 * index, 20_000, 3_000):
            if t_ms > 6_000 and index == 0:
                service.txt = {**service.txt, "v": str(t_ms // 3_000)}
                events.append((t_ms, service.line(0, "update")))
            else:
                events.append((t_ms, service.line(0, "add")))
    events.append((12_500, web[3].line(0, "remove")))
    web[3].txt = {**web[3].txt, "v": "2"}
    events.append((16_000, web[3].line(0, "add")))
    notes = (
        "Synthesised, not recorded: 20 s of short-TTL churn - six _workstation._tcp hosts with 2-5 s TTLs "
        "re-announced before expiry (three stop re-announcing and simply expire, no goodbye), four "
        "_http._tcp dashboards with 4 s TTLs (one bumps a TXT version every 3 "
        "s, one says goodbye at 12.5 s and "
        "returns at 16 s) and a long-TTL _ssh._tcp host. Documentation addresses only."
    )
    return header("mdns", "127.0.0.1", notes), timed(events)


# ---- writing -----------------------------------------------------------------------------------------------

BUILDERS: dict[str, Callable[[random.Random], tuple[Line, list[Line]]]] = {
    "ble-office-crowd.jsonl": ble_office_crowd,
    "ble-heart-rate-lab.jsonl": ble_heart_rate_lab,
    "ble-mixed-bench.jsonl": ble_mixed_bench,
    "usb-serial-bench-hotplug.jsonl": usb_bench_hotplug,
    "usb-serial-lab-rack.jsonl": usb_lab_rack,
    "usb-serial-clone-reset.jsonl": usb_clone_reset,
    "mdns-home-network.jsonl": mdns_home,
    "mdns-office-printers.jsonl": mdns_office_printers,
    "mdns-short-ttl-churn.jsonl": mdns_short_ttl,
}


def render(header_line: Line, lines: list[Line]) -> str:
    """JSON Lines: the header, then one observation a line."""
    dump = json.dumps
    body = [dump(header_line, separators=(",", ":"))]
    body.extend(dump(line, separators=(",", ":")) for line in lines)
    return "\n".join(body) + "\n"


def write_all(out_dir: Path) -> list[Path]:
    """Write every fixture into `out_dir`; each file gets its own seeded generator."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for index, (name, build) in enumerate(BUILDERS.items()):
        rng = random.Random(SEED + index)
        path = out_dir / name
        path.write_text(render(*build(rng)), encoding="utf-8")
        written.append(path)
    return written


def main() -> None:
    """Command-line entry."""
    parser = argparse.ArgumentParser(description=__doc__)
    default_out = Path(__file__).resolve().parent.parent / "hw-fixtures"
    parser.add_argument("--out", type=Path, default=default_out, help="output folder (default: hw-fixtures/)")
    args = parser.parse_args()
    for path in write_all(args.out):
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
