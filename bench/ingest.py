"""Ingest benchmark: the discovery session hot path against habluetooth's compiled remote-scanner paths.

A deterministic synthetic stream of BLE adverts (default 200,000 from 2,000 addresses over 10 s of simulated
time: ~40% identical repeats, ~45% RSSI-only changes, ~15% payload changes, one in ten of those structural -
a service UUID and the TX power change) is fed, in interleaved rounds, through:

- `session`: a session with the example catalog's profile whose scope is the heart-rate service (~2% of the
  devices): `CandidateTable.ingest` (scope filter, dedupe, candidate update) for every advert plus
  `CandidateTable.cut` at the profile's revision interval (250 ms) of simulated time;
- `session-all`: the same path with every device in scope and bounds widened to hold all 2,000 candidates
  (a stress case: the contract's lists stop at 64 items, so no admitted session can look like this);
- `session-64`: every device in scope with the catalog's bounds: the first 64 are kept, the rest refused;
- `hab-raw`: `BaseHaRemoteScanner._async_on_raw_advertisement` (raw AD bytes, the proxy path);
- `hab-parsed`: `BaseHaRemoteScanner._async_on_advertisement` (pre-parsed fields);
- `dict`: a plain dict keyed by address plus a list snapshot at the same interval (a floor, not a peer).

Every advert is a fresh object for every contender, built before its timed loop; the garbage collector is
off during every timed loop; each contender starts from empty state in every round. Usage:
`.venv/bin/python bench/ingest.py [--rounds 5] [--processes 3] [--no-memory]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import logging
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connector.core.observations import BleObservation
from connector.core.scope import DiscoveryProfile, parse_discovery_input
from connector.core.snapshot import CandidateTable

BASE_UUID = "0000{:04x}-0000-1000-8000-00805f9b34fb"
COMPANIES = (0x004C, 0x0006, 0x0075, 0x0059, 0x00E0)
UUID_SETS: tuple[tuple[int, ...], ...] = ((), (0x181A,), (0xFE9F,), (0x180F, 0x181A))
HEART_RATE = 0x180D  # ~2% of the devices advertise it: the scoped session's filter
START_MS = 1_796_040_000_000  # 2026-11-30T12:00:00Z
CATALOG_PROFILE = DiscoveryProfile(
    transports=("ble", "usb-serial", "mdns"),
    max_window_seconds=60,
    max_candidates=64,
    max_snapshot_bytes=65536,
    min_revision_interval_ms=250,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=2000,
)
# Same profile with bounds wide enough that all 2,000 devices are tracked, as habluetooth tracks them.
WIDE_PROFILE = DiscoveryProfile(
    transports=("ble",),
    max_window_seconds=60,
    max_candidates=4096,
    max_snapshot_bytes=4 * 1024 * 1024,
    min_revision_interval_ms=250,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=2000,
)
# Every device of the stream is in this scope (all five company ids).
ALL_INPUT = {"transport": "ble", "window_seconds": 60, "filters": {"manufacturer_ids": list(COMPANIES)}}
# The heart-rate straps only (~2% of the devices; fewer than the catalog's 64 candidates).
HEART_RATE_INPUT = {
    "transport": "ble",
    "window_seconds": 60,
    "filters": {"service_uuids": [BASE_UUID.format(HEART_RATE)]},
}
# name -> (scope input, profile); the session variants share one code path.
SESSIONS: dict[str, tuple[dict[str, Any], DiscoveryProfile]] = {
    "session": (HEART_RATE_INPUT, CATALOG_PROFILE),
    "session-all": (ALL_INPUT, WIDE_PROFILE),
    "session-64": (ALL_INPUT, CATALOG_PROFILE),
}


# ---------------------------------------------------------------------------------------------------------
# The stream


@dataclass(slots=True)
class DeviceState:
    """What one synthetic device currently advertises."""

    address: str
    rssi: int
    name: str | None
    uuids: tuple[int, ...]
    company: int
    payload: bytes
    tx_power: int | None


@dataclass(frozen=True, slots=True)
class Advert:
    """One advert of the stream, as plain values (each contender builds its own fresh objects from it)."""

    t_ms: int
    address: str
    rssi: int
    name: str | None
    uuids: tuple[int, ...]
    company: int
    payload: bytes
    tx_power: int | None


def _device(rng: random.Random, index: int) -> DeviceState:
    first = (rng.randrange(256) & 0xFC) | 0x02  # locally administered, unicast: obviously synthetic
    octets = [first, *(rng.randrange(256) for _ in range(5))]
    return DeviceState(
        address=":".join(f"{octet:02X}" for octet in octets),
        rssi=rng.randrange(-95, -40),
        name=f"SNS-{index:04d}" if rng.random() < 0.6 else None,
        uuids=(HEART_RATE,) if rng.random() < 0.02 else rng.choice(UUID_SETS),
        company=rng.choice(COMPANIES),
        payload=bytes(rng.randrange(256) for _ in range(rng.randrange(4, 20))),
        tx_power=rng.choice((None, -4, 0, 4)),
    )


def _change(rng: random.Random, device: DeviceState) -> str:
    """Mutate a device for its next advert; returns the kind of change."""
    roll = rng.random()
    if roll < 0.40:
        return "repeat"
    if roll < 0.85:
        device.rssi = max(-100, min(-20, device.rssi + rng.choice((-3, -2, -1, 1, 2, 3))))
        return "rssi"
    device.payload = bytes(rng.randrange(256) for _ in range(len(device.payload)))
    if rng.random() < 0.10:
        # Structural: the battery service comes or goes, and the TX power changes.
        toggled = set(device.uuids) ^ {0x180F}
        device.uuids = tuple(sorted(toggled))
        device.tx_power = rng.choice([power for power in (None, -4, 0, 4) if power != device.tx_power])
        return "structural"
    return "payload"


def build_stream(
    adverts: int, devices: int, seed: int, duration_ms: int
) -> tuple[list[Advert], dict[str, int]]:
    """The deterministic advert stream and the counts of each kind of change."""
    rng = random.Random(seed)
    states = [_device(rng, index) for index in range(devices)]
    seen: set[int] = set()
    kinds: dict[str, int] = {"first": 0, "repeat": 0, "rssi": 0, "payload": 0, "structural": 0}
    stream = []
    for index in range(adverts):
        number = rng.randrange(devices)
        device = states[number]
        kind = _change(rng, device) if number in seen else "first"
        seen.add(number)
        kinds[kind] += 1
        t_ms = START_MS + index * duration_ms // adverts
        stream.append(
            Advert(
                t_ms,
                device.address,
                device.rssi,
                device.name,
                device.uuids,
                device.company,
                device.payload,
                device.tx_power,
            )
        )
    return stream, kinds


def raw_bytes(advert: Advert) -> bytes:
    """The advert as raw AD structures (flags, 16-bit UUIDs, TX power, name, manufacturer data)."""
    parts = bytearray(b"\x02\x01\x06")
    if advert.uuids:
        body = b"".join(uuid.to_bytes(2, "little") for uuid in advert.uuids)
        parts += bytes((len(body) + 1, 0x03)) + body
    if advert.tx_power is not None:
        parts += bytes((2, 0x0A, advert.tx_power & 0xFF))
    if advert.name is not None:
        encoded = advert.name.encode()
        parts += bytes((len(encoded) + 1, 0x09)) + encoded
    body = advert.company.to_bytes(2, "little") + advert.payload
    parts += bytes((len(body) + 1, 0xFF)) + body
    return bytes(parts)


def observations(stream: list[Advert]) -> list[BleObservation]:
    """Fresh BleObservation objects, one per advert."""
    return [
        BleObservation(
            address=a.address,
            rssi=a.rssi,
            name=a.name,
            service_uuids=tuple(BASE_UUID.format(uuid) for uuid in a.uuids),
            manufacturer_data={a.company: bytes(a.payload)},
            tx_power=a.tx_power,
            connectable=True,
        )
        for a in stream
    ]


# ---------------------------------------------------------------------------------------------------------
# Contenders: each returns (seconds, detail)


def _timed(loop: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        detail = loop()
        return time.perf_counter() - started, detail
    finally:
        gc.enable()


def run_session(
    stream: list[Advert], raw_input: dict[str, Any], profile: DiscoveryProfile
) -> tuple[float, Any]:
    """The session hot path: ingest every advert, cut at the revision interval of simulated time."""
    items = list(zip(observations(stream), [a.t_ms for a in stream], strict=True))
    scope = parse_discovery_input(raw_input, profile)
    counter = itertools.count()
    table = CandidateTable(scope, profile, generation="bench-gen", new_ref=lambda: f"ref-{next(counter):08d}")
    interval = profile.min_revision_interval_ms

    def loop() -> dict[str, Any]:
        ingest, cut = table.ingest, table.cut
        next_cut = START_MS
        revisions = 0
        for observation, t_ms in items:
            ingest(observation, t_ms)
            if t_ms >= next_cut:
                if cut(t_ms) is not None:
                    revisions += 1
                next_cut = t_ms + interval
        if cut(items[-1][1], final=True) is not None:
            revisions += 1
        latest = table.latest
        candidates = len(latest.candidates) if latest else 0
        detail: dict[str, Any] = {"revisions": revisions, "candidates": candidates}
        detail["limit"] = table.limit_reason or "-"
        return detail

    return _timed(loop)


def run_dict(stream: list[Advert], interval: int) -> tuple[float, Any]:
    """Floor: a dict keyed by address plus a list snapshot at the same interval."""
    items = list(zip(observations(stream), [a.t_ms for a in stream], strict=True))

    def loop() -> dict[str, int]:
        latest: dict[str, BleObservation] = {}
        snapshot: list[BleObservation] = []
        next_cut = START_MS
        for observation, t_ms in items:
            latest[observation.address] = observation
            if t_ms >= next_cut:
                snapshot = list(latest.values())
                next_cut = t_ms + interval
        return {"candidates": len(snapshot)}

    return _timed(loop)


class _FakeAdapters:
    """Adapter discovery stand-in, as habluetooth's own tests use (no D-Bus, no hardware)."""

    adapters: ClassVar[dict[str, Any]] = {}
    default_adapter = "hci0"
    history: ClassVar[dict[str, Any]] = {}

    async def refresh(self) -> None:
        """Nothing to refresh."""


class _MockBleakClient:
    pass


async def _hab_scanner() -> tuple[Any, Callable[[], None]]:
    """A fresh manager and registered BaseHaRemoteScanner, set up the way habluetooth's tests do."""
    from bleak_retry_connector import BleakSlotManager
    from bluetooth_adapters import BluetoothAdapters
    from habluetooth import BaseHaRemoteScanner, BluetoothManager, HaBluetoothConnector, set_manager

    class FakeBluetoothAdapters(_FakeAdapters, BluetoothAdapters):
        pass

    manager = BluetoothManager(FakeBluetoothAdapters(), BleakSlotManager())
    set_manager(manager)
    await manager.async_setup()
    connector = HaBluetoothConnector(_MockBleakClient, "mock_bleak_client", lambda: False)  # type: ignore[arg-type]
    scanner = BaseHaRemoteScanner("esp32", "esp32", connector, True)
    unsetup = scanner.async_setup()
    cancel = manager.async_register_scanner(scanner)

    def close() -> None:
        cancel()
        unsetup()
        manager.async_stop()

    return scanner, close


async def run_hab_raw(stream: list[Advert]) -> tuple[float, Any]:
    """habluetooth's raw proxy path."""
    items: list[tuple[Any, ...]] = [(a.address, a.rssi, raw_bytes(a), {}, a.t_ms / 1000.0) for a in stream]
    scanner, close = await _hab_scanner()

    def loop() -> dict[str, int]:
        on_raw = scanner._async_on_raw_advertisement
        for address, rssi, raw, details, at in items:
            on_raw(address, rssi, raw, details, at)
        return {"devices": len(scanner.discovered_addresses)}

    try:
        return _timed(loop)
    finally:
        close()


async def run_hab_parsed(stream: list[Advert]) -> tuple[float, Any]:
    """habluetooth's pre-parsed path."""
    items: list[tuple[Any, ...]] = [
        (
            a.address,
            a.rssi,
            a.name,
            [BASE_UUID.format(uuid) for uuid in a.uuids],
            {},
            {a.company: bytes(a.payload)},
            a.tx_power,
            {"scanner_specific_data": "bench"},
            a.t_ms / 1000.0,
        )
        for a in stream
    ]
    scanner, close = await _hab_scanner()

    def loop() -> dict[str, int]:
        on_adv = scanner._async_on_advertisement
        for address, rssi, name, uuids, service_data, manufacturer, tx_power, details, at in items:
            on_adv(address, rssi, name, uuids, service_data, manufacturer, tx_power, details, at)
        return {"devices": len(scanner.discovered_addresses)}

    try:
        return _timed(loop)
    finally:
        close()


# ---------------------------------------------------------------------------------------------------------
# Rounds, processes, memory


CONTENDERS = (*SESSIONS, "hab-raw", "hab-parsed", "dict")


async def _run_one(name: str, stream: list[Advert]) -> tuple[float, Any]:
    if name in SESSIONS:
        return run_session(stream, *SESSIONS[name])
    if name == "hab-raw":
        return await run_hab_raw(stream)
    if name == "hab-parsed":
        return await run_hab_parsed(stream)
    return run_dict(stream, WIDE_PROFILE.min_revision_interval_ms)


async def run_rounds(stream: list[Advert], rounds: int) -> dict[str, Any]:
    """Interleaved rounds (the order rotates each round); medians of adverts per second."""
    rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    details: dict[str, Any] = {}
    for number in range(rounds):
        shift = number % len(CONTENDERS)
        for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
            seconds, detail = await _run_one(name, stream)
            rates[name].append(len(stream) / seconds)
            details[name] = detail
    medians = {name: statistics.median(values) for name, values in rates.items()}
    return {"rates": rates, "median": medians, "details": details}


def ratios(medians: dict[str, float]) -> dict[str, float]:
    """The session's rate over each other contender's."""
    result = {f"{name}/hab-raw": medians[name] / medians["hab-raw"] for name in SESSIONS}
    result.update({f"{name}/hab-parsed": medians[name] / medians["hab-parsed"] for name in SESSIONS})
    result["session/dict"] = medians["session"] / medians["dict"]
    return result


def _flood(count: int, cycling: bool) -> Iterator[tuple[BleObservation, int]]:
    """A flood generated lazily (so that only the session's own memory is measured)."""
    for index in range(count):
        if cycling:
            # A new set of 30 devices every 40 s; the even ones (15) are in scope, the odd ones are not.
            in_scope = index % 2 == 0
            device = (index // 40_000) * 30 + index % 30
        else:
            # Every advert from a new address, all in scope: the table fills, then refuses.
            in_scope, device = True, index
        company = COMPANIES[0] if in_scope else 0x0FFF
        observation = BleObservation(
            address=f"02:{device >> 24 & 255:02X}:{device >> 16 & 255:02X}:{device >> 8 & 255:02X}:"
            f"{device & 255:02X}:00",
            rssi=-40 - index % 50,
            name=f"flood-{device}",
            manufacturer_data={company: index.to_bytes(4, "little")},
        )
        yield observation, START_MS + index


def flood_peak(count: int, cycling: bool) -> dict[str, Any]:
    """Peak traced bytes of one session (catalog bounds) under a flood, and its constant overhead."""
    scope = parse_discovery_input(ALL_INPUT, CATALOG_PROFILE)
    counter = itertools.count()
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    table = CandidateTable(
        scope, CATALOG_PROFILE, generation="flood", new_ref=lambda: f"r{next(counter):08d}"
    )
    empty, _ = tracemalloc.get_traced_memory()
    next_cut = START_MS
    for observation, t_ms in _flood(count, cycling):
        table.ingest(observation, t_ms)
        if t_ms >= next_cut:
            table.cut(t_ms)
            next_cut = t_ms + CATALOG_PROFILE.min_revision_interval_ms
    end, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "observations": count,
        "empty_table_bytes": empty - base,
        "peak_bytes": peak - base,
        "retained_bytes": end - base,
        "candidates": len(table),
        "limit_reason": table.limit_reason or "",
    }


def memory_report() -> list[dict[str, Any]]:
    """Floods of 100k and 1M observations, both kinds, to show the peak does not grow with the flood."""
    return [
        {"flood": "new-address" if not cycling else "cycling", **flood_peak(count, cycling)}
        for cycling in (False, True)
        for count in (100_000, 1_000_000)
    ]


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One process: build the stream, run the interleaved rounds."""
    logging.getLogger("habluetooth").setLevel(logging.ERROR)
    stream, kinds = build_stream(args.adverts, args.devices, args.seed, args.duration_ms)
    result = asyncio.run(run_rounds(stream, args.rounds))
    result["ratios"] = ratios(result["median"])
    result["kinds"] = kinds
    return result


def _print_process(result: dict[str, Any]) -> None:
    for name in CONTENDERS:
        rounds = ", ".join(f"{rate / 1000:.0f}k" for rate in result["rates"][name])
        detail = result["details"][name]
        print(f"  {name:<11} median {result['median'][name]:>10,.0f} adverts/s   rounds: {rounds}   {detail}")
    for name, value in result["ratios"].items():
        print(f"  {name:<22} {value:.2f}x")


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run one worker or several processes, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adverts", type=int, default=200_000)
    parser.add_argument("--devices", type=int, default=2_000)
    parser.add_argument("--duration-ms", type=int, default=10_000, help="simulated time the stream spans")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=1, help="run N processes one after another")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc flood")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    print(f"python {platform.python_version()} on {platform.machine()}, {_versions()}")
    _stream, kinds = build_stream(args.adverts, args.devices, args.seed, args.duration_ms)
    print(
        f"stream: {args.adverts} adverts, {args.devices} addresses, {args.duration_ms} ms simulated; {kinds}"
    )
    results = [_spawn(args) for _ in range(args.processes)]
    for number, result in enumerate(results, start=1):
        print(f"process {number}:")
        _print_process(result)
    if args.processes > 1:
        print(f"median over {args.processes} processes:")
        for name in CONTENDERS:
            print(f"  {name:<11} {statistics.median(r['median'][name] for r in results):>10,.0f} adverts/s")
        for name in results[0]["ratios"]:
            print(f"  {name:<22} {statistics.median(r['ratios'][name] for r in results):.2f}x")
    if not args.no_memory:
        print("memory (tracemalloc, one session with the catalog bounds):")
        for row in memory_report():
            print("  " + ", ".join(f"{key}={value}" for key, value in row.items()))
    return 0


def _spawn(args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        "--adverts",
        str(args.adverts),
        "--devices",
        str(args.devices),
        "--duration-ms",
        str(args.duration_ms),
        "--seed",
        str(args.seed),
        "--rounds",
        str(args.rounds),
    ]
    completed = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def _versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("habluetooth", "bleak", "bluetooth-data-tools"))


if __name__ == "__main__":
    sys.exit(main())
