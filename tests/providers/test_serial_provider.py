"""The USB/serial provider in-process: the pass diff, the worker lifecycle, refusals and failures."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from serial.tools import list_ports

from connector.core.candidates import candidate_content
from connector.core.observations import Observation, UsbObservation
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.core.snapshot import transport_address
from connector.errors import ProviderError, StopUnconfirmed
from providers import base as providers_base
from providers import serial as serial_module
from providers.serial import (
    ByIdLinks,
    PortInfo,
    SerialProvider,
    enumeration_pass,
    port_observation,
    stable_links,
)
from tests.support.waiting import wait_until

WORKER = "sensorium-usb-enumeration"
FTDI, ARDUINO = (0x0403, 0x6001), (0x2341, 0x0043)


@dataclass
class Port:
    """A stand-in for pyserial's ListPortInfo."""

    device: str
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None
    manufacturer: str | None = None
    product: str | None = None
    location: str | None = None
    interface: str | None = None


CONSOLE = Port("/dev/ttyS0")
USB0 = Port("/dev/ttyUSB0", *FTDI, serial_number="A50285BI", product="FT232R USB UART", location="1-2")
ACM0 = Port("/dev/ttyACM0", *ARDUINO, serial_number="85735313", product="Arduino Uno", location="1-3")


def usb_scope(
    filters: ScopeFilter | None = None, exclusions: ScopeFilter | None = None, cleanup_timeout_ms: int = 2000
) -> DiscoveryScope:
    """An admitted usb-serial scope."""
    return DiscoveryScope(
        transport="usb-serial",
        window_seconds=5,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=filters or ScopeFilter(),
        exclusions=exclusions,
        cleanup_timeout_ms=cleanup_timeout_ms,
    )


class Sink:
    """Records observations, failures and the delivering thread."""

    def __init__(self) -> None:
        self.observations: list[UsbObservation] = []
        self.failures: list[ProviderError] = []
        self.threads: set[int] = set()

    def observe(self, observation: Observation) -> None:
        assert isinstance(observation, UsbObservation)
        self.threads.add(threading.get_ident())
        self.observations.append(observation)

    def fail(self, error: ProviderError) -> None:
        self.threads.add(threading.get_ident())
        self.failures.append(error)


def workers() -> int:
    """Enumeration worker threads alive now."""
    return sum(1 for thread in threading.enumerate() if thread.name == WORKER)


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    """Every test must leave no enumeration worker behind."""
    before = workers()
    yield
    assert workers() == before


# -- the pure diff ------------------------------------------------------------------------------------------


def test_port_without_usb_identity_is_no_observation() -> None:
    assert port_observation(CONSOLE) is None
    assert port_observation(Port("/dev/ttyUSB9", vid=0x0403)) is None


def test_pass_reports_present_ports_as_add_and_vanished_ones_as_remove() -> None:
    scope = usb_scope(ScopeFilter(vid_pid=(FTDI, ARDUINO)))
    first, state = enumeration_pass(scope, [CONSOLE, USB0, ACM0], {})
    assert [(o.event, o.device) for o in first] == [("add", "/dev/ttyUSB0"), ("add", "/dev/ttyACM0")]
    again, state = enumeration_pass(scope, [CONSOLE, USB0, ACM0], state)
    assert [(o.event, o.device) for o in again] == [("add", "/dev/ttyUSB0"), ("add", "/dev/ttyACM0")]
    after, state = enumeration_pass(scope, [CONSOLE, ACM0], state)
    assert [(o.event, o.device) for o in after] == [("add", "/dev/ttyACM0"), ("remove", "/dev/ttyUSB0")]
    removed = after[1]
    assert isinstance(removed, UsbObservation)
    assert (removed.vid, removed.pid, removed.serial_number) == (*FTDI, "A50285BI")
    quiet, state = enumeration_pass(scope, [CONSOLE, ACM0], state)
    assert [(o.event, o.device) for o in quiet] == [("add", "/dev/ttyACM0")]
    assert set(state) == {"/dev/ttyACM0"}


def test_pass_filters_before_anything_is_remembered() -> None:
    scope = usb_scope(ScopeFilter(vid_pid=(FTDI,)), exclusions=ScopeFilter(serial_numbers=("A50285BI",)))
    batch, state = enumeration_pass(scope, [CONSOLE, USB0, ACM0], {})
    assert batch == [] and state == {}


def test_unfiltered_pass_still_drops_the_console_port() -> None:
    batch, _ = enumeration_pass(usb_scope(), [CONSOLE, USB0], {})
    assert [o.device for o in batch] == ["/dev/ttyUSB0"]


def test_long_sysfs_strings_are_bounded_and_empty_ones_absent() -> None:
    observation = port_observation(Port("/dev/ttyUSB0", *FTDI, product="x" * 1000, manufacturer=""))
    assert observation is not None
    assert observation.product == "x" * 256
    assert observation.manufacturer is None


# -- the provider -------------------------------------------------------------------------------------------


def test_capabilities_declare_read_only_concurrent_enumeration() -> None:
    caps = SerialProvider().capabilities
    assert caps.transport == "usb-serial"
    assert caps.backend_filters == frozenset()
    assert caps.concurrent_sessions is True


@pytest.mark.parametrize("interval", [0.0, -1.0, 1.5])
def test_poll_interval_must_be_positive_and_at_most_one_second(interval: float) -> None:
    with pytest.raises(ValueError):
        SerialProvider(poll_interval_s=interval)


@pytest.mark.asyncio
async def test_start_refuses_a_scope_of_another_transport() -> None:
    scope = DiscoveryScope("mdns", 5, 64, 65536, ScopeFilter(service_types=("_http._tcp.local.",)))
    with pytest.raises(ProviderError):
        await SerialProvider().start(scope, Sink())
    assert workers() == 0


@pytest.mark.asyncio
async def test_session_polls_delivers_on_the_loop_thread_and_stop_joins_the_worker() -> None:
    ports: list[PortInfo] = [CONSOLE, USB0, ACM0]
    passes = 0

    def enumerate_ports() -> list[PortInfo]:
        nonlocal passes
        passes += 1
        return list(ports)

    sink = Sink()
    threads_before = threading.active_count()
    provider = SerialProvider(poll_interval_s=0.05, enumerate_ports=enumerate_ports)
    session = await provider.start(usb_scope(ScopeFilter(vid_pid=(FTDI,))), sink)
    await wait_until(lambda: len(sink.observations) >= 3)
    ports.remove(USB0)
    await wait_until(lambda: any(o.event == "remove" for o in sink.observations))
    await session.stop()
    delivered, polled = len(sink.observations), passes
    # The worker thread is gone once stop returned, so no later pass can add to what it saw.
    assert threading.active_count() == threads_before  # joined, and no helper thread left behind either
    assert (len(sink.observations), passes) == (delivered, polled)
    assert {o.device for o in sink.observations} == {"/dev/ttyUSB0"}
    assert sink.threads == {threading.get_ident()}
    await session.stop()  # idempotent


@pytest.mark.asyncio
async def test_stop_unconfirmed_while_the_worker_is_stuck_then_confirmed_on_retry() -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck_enumeration() -> list[PortInfo]:
        entered.set()
        release.wait(10)
        return []

    provider = SerialProvider(enumerate_ports=stuck_enumeration)
    session = await provider.start(usb_scope(cleanup_timeout_ms=200), Sink())
    await wait_until(entered.is_set)
    started = time.monotonic()
    with pytest.raises(StopUnconfirmed) as unconfirmed:
        await session.stop()
    assert 0.15 < time.monotonic() - started < 5  # cut at cleanup_timeout_ms, long before the release
    assert unconfirmed.value.code == "cleanup-unconfirmed"
    assert workers() == 1
    release.set()
    await session.stop()
    assert workers() == 0


@pytest.mark.asyncio
async def test_three_failed_passes_in_a_row_reach_the_sink_without_driver_text() -> None:
    canary = "/dev/ttyUSB7 serial CANARY-5c1f"
    passes = 0

    def broken() -> list[PortInfo]:
        nonlocal passes
        passes += 1
        raise TypeError(canary)  # what pyserial raises when idVendor vanished mid-read

    sink = Sink()
    session = await SerialProvider(poll_interval_s=0.05, enumerate_ports=broken).start(usb_scope(), sink)
    await wait_until(lambda: bool(sink.failures))
    await wait_until(lambda: workers() == 0)  # the worker ended by itself with the third failure
    await session.stop()
    assert passes == 3
    [failure] = sink.failures
    assert type(failure) is ProviderError
    assert failure.code == "provider-failure"
    assert "CANARY" not in str(failure) and failure.__cause__ is None and failure.__context__ is None
    assert sink.observations == []


@pytest.mark.asyncio
async def test_a_failed_pass_is_skipped_neither_refreshing_nor_dropping_a_device() -> None:
    script: list[list[PortInfo] | None] = [[USB0], None, None, [USB0], None, [USB0], [USB0]]
    outcomes: list[str] = []

    def flaky() -> list[PortInfo] | list[Port]:
        step = script.pop(0) if script else [USB0]
        outcomes.append("failed" if step is None else "ok")
        if step is None:
            raise TypeError("int() can't convert non-string with explicit base")
        return step

    sink = Sink()
    session = await SerialProvider(poll_interval_s=0.05, enumerate_ports=flaky).start(usb_scope(), sink)
    await wait_until(lambda: len(outcomes) >= 8)
    await session.stop()
    assert sink.failures == []
    assert {o.event for o in sink.observations} == {"add"}  # never removed by a failed pass
    # One add per successful pass (the last may race the stop), none for a failed one.
    assert outcomes.count("ok") - 1 <= len(sink.observations) <= outcomes.count("ok")


def test_a_port_carries_its_by_id_link_as_its_stable_path(tmp_path: Path) -> None:
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    node = tmp_path / "ttyUSB0"
    node.touch()
    (by_id / "usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0").symlink_to(node)
    (by_id / "zz-second-link").symlink_to(node)
    links = stable_links(str(by_id))
    observation = port_observation(Port(str(node), *FTDI, serial_number="A50285BI"), links)
    assert observation is not None
    assert observation.stable_path == str(by_id / "usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0")
    assert transport_address(observation) == observation.stable_path
    assert stable_links(str(tmp_path / "missing")) == {}
    plain = port_observation(Port("/dev/ttyUSB9", *FTDI), links)
    assert plain is not None and plain.stable_path is None
    assert transport_address(plain) == "/dev/ttyUSB9"


def test_by_id_links_are_read_again_only_when_the_directory_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real_read = serial_module.stable_links

    def counted(directory: str = serial_module.BY_ID_DIR) -> dict[str, str]:
        reads.append(directory)
        return real_read(directory)

    monkeypatch.setattr(serial_module, "stable_links", counted)
    by_id, first, second = tmp_path / "by-id", tmp_path / "ttyUSB0", tmp_path / "ttyUSB1"
    first.touch()
    second.touch()
    links = ByIdLinks(str(by_id))
    assert links() == {} and reads == []  # no directory yet: nothing to list
    by_id.mkdir()
    link = by_id / "usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"
    link.symlink_to(first)
    settled = time.time_ns() - 10_000_000_000
    os.utime(by_id, ns=(settled, settled))
    assert links() == {str(first): str(link)} and len(reads) == 1
    assert links() == {str(first): str(link)} and len(reads) == 1  # unchanged: not listed again
    # Replug: udev removes the link and makes it again, now pointing at the device's new node.
    link.unlink()
    link.symlink_to(second)
    assert links() == {str(second): str(link)} and len(reads) == 2
    assert links() == {str(second): str(link)} and len(reads) == 3  # changed just now: not trusted yet
    os.utime(by_id, ns=(settled + 1, settled + 1))
    links()
    assert links() == {str(second): str(link)} and len(reads) == 4
    link.unlink()
    by_id.rmdir()
    assert links() == {} and len(reads) == 4


def test_a_settled_directory_changed_within_one_timestamp_tick_is_still_read_again(tmp_path: Path) -> None:
    by_id, node = tmp_path / "by-id", tmp_path / "ttyUSB0"
    by_id.mkdir()
    node.touch()
    now = [time.time_ns()]
    links = ByIdLinks(str(by_id), clock_ns=lambda: now[0])
    mtime = by_id.stat().st_mtime_ns
    assert links() == {}
    (by_id / "late-link").symlink_to(node)
    os.utime(by_id, ns=(mtime, mtime))  # the change kept the mtime, as within one coarse tick
    now[0] += 10_000_000_000
    assert links() == {str(node): str(by_id / "late-link")}  # the first read was too fresh to keep


@pytest.mark.asyncio
async def test_a_pass_is_matched_against_the_scope_once_per_port(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real_matcher = providers_base.scope_matcher  # type: ignore[attr-defined]

    def counting_matcher(scope: DiscoveryScope) -> Callable[[Observation], bool]:
        rule = real_matcher(scope)

        def check(observation: Observation) -> bool:
            assert isinstance(observation, UsbObservation)
            checked.append(observation.device)
            return rule(observation)

        return check

    monkeypatch.setattr(providers_base, "scope_matcher", counting_matcher)
    sink = Sink()
    provider = SerialProvider(poll_interval_s=0.05, enumerate_ports=lambda: [CONSOLE, USB0, ACM0])
    session = await provider.start(usb_scope(ScopeFilter(vid_pid=(FTDI,))), sink)
    await wait_until(lambda: len(sink.observations) >= 3)
    await session.stop()
    assert {o.device for o in sink.observations} == {USB0.device}
    assert 2 * len(sink.observations) <= len(checked) <= 2 * len(sink.observations) + 2  # USB0, ACM0 once


@pytest.mark.parametrize(
    ("interface", "location", "expected"),
    [
        ("FT232R USB UART", "1-2", "FT232R USB UART"),  # single interface with its own string
        (None, "1-2", None),  # single interface, no string: nothing to tell apart
        (None, "1-4:1.1", "interface 1"),  # FT2232 port B: pyserial's interface-level location
        (None, "1-3.4:1.0", "interface 0"),  # CDC-ACM behind a hub
        ("x" * 80, "1-4:1.0", "x" * 64),
    ],
)
def test_usb_interface_is_the_string_else_the_interface_number_of_a_multi_interface_device(
    interface: str | None, location: str, expected: str | None
) -> None:
    observation = port_observation(Port("/dev/ttyUSB0", *FTDI, interface=interface, location=location))
    assert observation is not None
    assert candidate_content(observation)["usb"].get("interface") == expected


@pytest.mark.asyncio
async def test_real_host_enumeration_never_reports_ports_without_usb_identity() -> None:
    host_ports = list_ports.comports()
    passes = 0

    def host_enumeration() -> list[PortInfo]:
        nonlocal passes
        passes += 1
        return list(list_ports.comports())

    sink = Sink()
    session = await SerialProvider(poll_interval_s=0.05, enumerate_ports=host_enumeration).start(
        usb_scope(), sink
    )
    await wait_until(lambda: passes >= 3)  # the second pass was delivered before the third began
    await session.stop()
    reported = {o.device for o in sink.observations}
    assert not reported & {p.device for p in host_ports if p.vid is None}
    assert all(o.vid is not None for o in sink.observations)
    assert sink.failures == []
