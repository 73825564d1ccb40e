"""USB/serial provider: a worker thread polls pyserial's `comports()` and diffs the passes.

Enumeration is read-only: a port is never opened. Only ports with USB identity (vid/pid) are USB-serial
devices; built-in UARTs such as the VM console `ttyS0` never leave the provider.

pyserial 3.5's `comports()` raises (TypeError from `int(None, 16)`, `list_ports_linux.py` lines 48-53) when a
device's sysfs attributes vanish mid-read, as they do during plug, unplug and board resets (pyserial#774,
#550). CONTRACT §6.5: such a pass is skipped - it neither refreshes nor drops a device - and only
`MAX_FAILED_PASSES` consecutive failures end the session `provider-failure`. Each pass also maps device
nodes to their udev `/dev/serial/by-id/` links, the address a binding reveals (CONTRACT §6.8); the map is read
again only when the directory changed (`ByIdLinks`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel
from serial.tools import list_ports

from connector.core.observations import Observation, UsbObservation
from connector.core.scope import DiscoveryScope, matches_scope
from connector.errors import ProviderError
from providers.base import BaseSession, ObservationSink, ProviderCapabilities

MAX_POLL_INTERVAL_S = 1.0  # CONTRACT §6.5: enumeration passes at most 1 s apart
MAX_FAILED_PASSES = 3  # CONTRACT §6.5: consecutive failed passes that end a session
BY_ID_DIR = "/dev/serial/by-id"
# A directory changed again within its timestamp granularity (a jiffy on tmpfs) keeps its mtime, so a
# listing is trusted only once the mtime it was read under is older than this.
_SETTLED_NS = 2_000_000_000
_MAX_TEXT = 256


class PortInfo(Protocol):
    """The fields of pyserial's `ListPortInfo` this provider reads."""

    device: str
    vid: int | None
    pid: int | None
    serial_number: str | None
    manufacturer: str | None
    product: str | None
    location: str | None
    interface: str | None


PortEnumerator = Callable[[], Iterable[PortInfo]]
StableLinks = Callable[[], Mapping[str, str]]


def _system_ports() -> list[PortInfo]:
    """The host's serial ports as pyserial enumerates them (sysfs only, nothing opened)."""
    ports: list[PortInfo] = list_ports.comports()
    return ports


def stable_links(directory: str = BY_ID_DIR) -> dict[str, str]:
    """Device node -> its udev by-id link (the first in name order when several point at one node)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:  # no such directory: no USB-serial device has been plugged since boot, or not udev
        return {}
    links: dict[str, str] = {}
    for name in names:
        link = os.path.join(directory, name)
        links.setdefault(os.path.realpath(link), link)
    return links


class ByIdLinks:
    """`stable_links(directory)`, listed and resolved again only when the directory changed (thread-safe).

    udev adds, removes and retargets a by-id link by creating, unlinking or renaming an entry, each of
    which moves the directory's mtime; a replug therefore always shows as a change.
    """

    def __init__(self, directory: str = BY_ID_DIR, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._directory = directory
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._links: dict[str, str] = {}

    def __call__(self) -> Mapping[str, str]:
        """The current map (read-only: shared between the sessions' workers)."""
        with self._lock:
            try:
                status = os.stat(self._directory)
            except OSError:
                self._key, self._links = None, {}
                return self._links
            key = (status.st_dev, status.st_ino, status.st_mtime_ns)
            if key != self._key:
                self._links = stable_links(self._directory)
                settled = self._clock_ns() - status.st_mtime_ns > _SETTLED_NS
                self._key = key if settled else None
            return self._links


def _text(value: str | None) -> str | None:
    """A sysfs string, bounded; empty strings count as absent."""
    return value[:_MAX_TEXT] if value else None


def port_observation(port: PortInfo, links: Mapping[str, str] | None = None) -> UsbObservation | None:
    """The `add` observation for a port, or None when it carries no USB identity."""
    if port.vid is None or port.pid is None:
        return None
    stable = (links or {}).get(os.path.realpath(port.device))
    return UsbObservation(
        event="add",
        device=port.device,
        vid=port.vid,
        pid=port.pid,
        serial_number=_text(port.serial_number),
        manufacturer=_text(port.manufacturer),
        product=_text(port.product),
        location=_text(port.location),
        interface=_text(port.interface),
        stable_path=stable[:_MAX_TEXT] if stable else None,
    )


def enumeration_pass(
    scope: DiscoveryScope,
    ports: Iterable[PortInfo],
    previous: Mapping[str, UsbObservation],
    links: Mapping[str, str] | None = None,
    in_scope: Callable[[Observation], bool] | None = None,
) -> tuple[list[UsbObservation], dict[str, UsbObservation]]:
    """One pass: every present in-scope port as `add`, every vanished one as `remove`, and the new state.

    `in_scope`: the scope's compiled rule (`providers.base.BaseSession`), else `matches_scope` is applied.
    """
    rule = in_scope or functools.partial(matches_scope, scope)
    present: dict[str, UsbObservation] = {}
    for port in ports:
        observation = port_observation(port, links)
        if observation is not None and rule(observation):
            present[observation.device] = observation
    removed = [replace(seen, event="remove") for device, seen in previous.items() if device not in present]
    return [*present.values(), *removed], present


class SerialProvider:
    """Polls `comports()` on a worker thread per session; sessions may run concurrently."""

    def __init__(
        self,
        poll_interval_s: float = 0.5,
        *,
        enumerate_ports: PortEnumerator | None = None,
        links: StableLinks | None = None,
    ) -> None:
        if not 0 < poll_interval_s <= MAX_POLL_INTERVAL_S:
            raise ValueError("poll_interval_s must be in (0, 1] seconds")
        self._poll_interval_s = poll_interval_s
        self._enumerate_ports = enumerate_ports or _system_ports
        self._links = links or ByIdLinks()

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Read-only enumeration: no backend filters, any number of sessions at once."""
        return ProviderCapabilities(transport="usb-serial", concurrent_sessions=True)

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> SerialSession:
        """Start the enumeration worker for `scope`."""
        if scope.transport != self.capabilities.transport:
            raise ProviderError("scope transport is not usb-serial")
        session = SerialSession(scope, sink, self._enumerate, self._poll_interval_s)
        session.start()
        return session

    def _enumerate(self) -> tuple[Iterable[PortInfo], Mapping[str, str]]:
        """One raw pass: the ports and the by-id links (worker thread)."""
        return list(self._enumerate_ports()), self._links()


Enumeration = Callable[[], tuple[Iterable[PortInfo], Mapping[str, str]]]


class SerialSession(BaseSession):
    """One enumeration worker; `stop()` returns once the worker thread has been joined."""

    def __init__(
        self, scope: DiscoveryScope, sink: ObservationSink, enumerate_ports: Enumeration, interval_s: float
    ) -> None:
        super().__init__(scope, sink)
        self._enumerate_ports = enumerate_ports
        self._interval_s = interval_s
        self._token = anyio.lowlevel.current_token()
        self._halt = threading.Event()
        self._exited = anyio.Event()
        self._thread = threading.Thread(target=self._run, name="sensorium-usb-enumeration", daemon=True)

    def start(self) -> None:
        """Launch the worker thread."""
        self.opened()
        self._thread.start()

    async def _stop_backend(self) -> str | None:
        """One attempt (the shape of the shared base's): signal the worker, None once its thread ended."""
        self._halt.set()
        await self._exited.wait()
        while self._thread.is_alive():  # setting `_exited` is the worker's last step
            await anyio.sleep(0.001)
        return None

    def _run(self) -> None:
        """Worker body: poll until halted, then tell the loop that the worker is done."""
        try:
            self._poll()
        finally:
            with contextlib.suppress(anyio.RunFinishedError):
                anyio.from_thread.run_sync(self._exited.set, token=self._token)

    def _poll(self) -> None:
        """Enumerate, deliver, wait; until halted. A failed pass is skipped; too many in a row fail."""
        previous: dict[str, UsbObservation] = {}
        failed = 0
        try:
            while not self._halt.is_set():
                batch = self._one_pass(previous)
                if batch is None:
                    failed += 1
                    if failed >= MAX_FAILED_PASSES:
                        self._report_failure()
                        return
                else:
                    failed = 0
                    observations, previous = batch
                    anyio.from_thread.run_sync(self._deliver, observations, token=self._token)
                self._halt.wait(self._interval_s)
        except anyio.RunFinishedError:
            return  # the event loop is gone; nobody is left to tell

    def _one_pass(
        self, previous: Mapping[str, UsbObservation]
    ) -> tuple[list[UsbObservation], dict[str, UsbObservation]] | None:
        """One enumeration pass diffed against `previous`, or None when the pass failed."""
        try:
            ports, links = self._enumerate_ports()
            return enumeration_pass(self.scope, ports, previous, links, self._in_scope)
        except Exception:  # dropped here with the driver's (device-bearing) text
            return None

    def _report_failure(self) -> None:
        """Tell the sink that enumeration failed (from the worker)."""
        error = ProviderError("usb enumeration failed")
        with contextlib.suppress(anyio.RunFinishedError):
            anyio.from_thread.run_sync(self.fail, error, token=self._token)

    def _deliver(self, batch: Sequence[UsbObservation]) -> None:
        """Hand one pass to the sink unless the session is stopping (loop thread); the pass filtered it."""
        for observation in batch:
            self.deliver_prefiltered(observation)
