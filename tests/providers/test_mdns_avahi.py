"""The mDNS provider against a real responder: avahi-daemon 0.8 in private network namespaces.

Scans run through the real session runtime (`DiscoveryManager`, candidate table, revisions) inside the
lab's browser namespace (`mdns_ns_driver.py` under `ip netns exec`); avahi publishes, says goodbye or
vanishes from the outside. Without root or the Debian packages every test here skips with its reason.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.providers.avahi_lab import AvahiLab, unavailable_reason

DRIVER = Path(__file__).with_name("mdns_ns_driver.py")
AVAHI_TYPE = "_s11lab._tcp"  # what avahi-publish-service takes
TYPE = "_s11lab._tcp.local."

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


class Driver:
    """The driver process in the lab's browser namespace, and everything it printed."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.lines: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self._ids = 0

    @classmethod
    async def start(cls, lab: AvahiLab, interfaces: str = "default") -> Driver:
        process = await asyncio.create_subprocess_exec(
            *lab.netns_exec(lab.browser_ns),
            sys.executable,
            str(DRIVER),
            interfaces,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        driver = cls(process)
        await driver.wait(lambda line: line.get("ready") is True, 20)
        return driver

    async def _read(self) -> None:
        assert self._process.stdout is not None
        while line := await self._process.stdout.readline():
            self.lines.append(json.loads(line))
            self._changed.set()

    async def send(self, command: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(command) + "\n").encode())
        await self._process.stdin.drain()

    async def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
        """The first line matching `predicate`, waiting up to `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            while True:
                found = next((line for line in self.lines if predicate(line)), None)
                if found is not None:
                    return found
                if self._reader.done():
                    raise AssertionError("the driver exited")
                self._changed.clear()
                await self._changed.wait()

    async def scan(self, window_s: int, ttl_s: int = 30, **scope: Any) -> str:
        self._ids += 1
        scan_id = f"scan-{self._ids}"
        await self.send(
            {"cmd": "scan", "id": scan_id, "types": [TYPE], "window_s": window_s, "ttl_s": ttl_s, **scope}
        )
        return scan_id

    def statuses(self, scan_id: str) -> list[dict[str, Any]]:
        return [line["status"] for line in self.lines if line.get("id") == scan_id]

    async def final(self, scan_id: str, timeout_s: float) -> dict[str, Any]:
        line = await self.wait(
            lambda line: line.get("id") == scan_id and line["status"]["status"] not in ("pending", "running"),
            timeout_s,
        )
        status: dict[str, Any] = line["status"]
        return status

    async def close(self) -> None:
        if self._process.returncode is None:
            await self.send({"cmd": "quit"})
            try:
                async with asyncio.timeout(15):
                    await self._process.wait()
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        await self._reader


def candidates(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The candidates a status shows (snapshot while running, result when completed)."""
    if "result" in status:
        return list(status["result"]["candidates"])
    progress = status.get("progress")
    return list(progress["snapshot"]["candidates"]) if progress else []


def labels(status: dict[str, Any]) -> set[str]:
    return {c.get("label", "") for c in candidates(status)}


def has_label(scan_id: str, label: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: line.get("id") == scan_id and label in labels(line["status"])


def stamp(text: str) -> float:
    """Seconds of an RFC 3339 UTC time."""
    return time.mktime(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))


@pytest.fixture(scope="module")
def shared_lo_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AvahiLab]:
    """RECIPES 2b as written: one namespace, multicast on its loopback, avahi on `lo`."""
    lab = AvahiLab(tmp_path_factory.mktemp("avahi-lo"), "lo")
    try:
        yield lab.start()
    finally:
        lab.close()


@pytest.fixture
def lo_lab(shared_lo_lab: AvahiLab) -> Iterator[AvahiLab]:
    """The module's lab; what a test publishes on it is withdrawn after the test."""
    before = shared_lo_lab.published
    yield shared_lo_lab
    shared_lo_lab.withdraw_since(before)


@pytest.fixture
def fresh_lo_lab(tmp_path: Path) -> Iterator[AvahiLab]:
    """A lab of its own, for a test that kills the responder."""
    lab = AvahiLab(tmp_path / "lab", "lo")
    try:
        yield lab.start()
    finally:
        lab.close()


@pytest_asyncio.fixture
async def lo_driver(lo_lab: AvahiLab) -> AsyncIterator[Driver]:
    """A driver pinned to the lab's loopback (`--mdns-interfaces 127.0.0.1`, as the recipe says)."""
    driver = await Driver.start(lo_lab, lo_lab.pinned_interface)
    try:
        yield driver
    finally:
        await driver.close()


# -- one namespace, avahi on lo ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_published_service_appears_with_its_instance_name_as_label(
    lo_lab: AvahiLab, lo_driver: Driver
) -> None:
    lo_lab.publish("Hall Printer", AVAHI_TYPE, 631)
    scan_id = await lo_driver.scan(window_s=3)
    line = await lo_driver.wait(has_label(scan_id, "Hall Printer"), 10)
    [candidate] = [c for c in candidates(line["status"]) if c["label"] == "Hall Printer"]
    assert candidate["transport"] == "mdns"
    assert candidate["mdns"] == {"service_type": TYPE, "instance": "Hall Printer"}
    text = json.dumps(candidate)
    assert "127.0.0.1" not in text and "631" not in text and "canary" not in text  # no address, port or TXT
    final = await lo_driver.final(scan_id, 15)
    assert final["status"] == "completed" and "Hall Printer" in labels(final)


@pytest.mark.asyncio
async def test_a_goodbye_removes_the_candidate_at_the_next_revision(
    lo_lab: AvahiLab, lo_driver: Driver
) -> None:
    publication = lo_lab.publish("Leaving Sensor", AVAHI_TYPE, 8080)
    scan_id = await lo_driver.scan(window_s=8)
    await lo_driver.wait(has_label(scan_id, "Leaving Sensor"), 10)
    said_goodbye_at = len(lo_driver.statuses(scan_id))
    lo_lab.unpublish(publication)
    await lo_driver.wait(
        lambda line: (
            line.get("id") == scan_id
            and "progress" in line["status"]
            and "Leaving Sensor" not in labels(line["status"])
        ),
        5,
    )
    final = await lo_driver.final(scan_id, 15)
    later = lo_driver.statuses(scan_id)[said_goodbye_at:]
    gone = next(i for i, status in enumerate(later) if "Leaving Sensor" not in labels(status))
    assert all("Leaving Sensor" not in labels(status) for status in later[gone:])  # never comes back
    assert final["status"] == "completed"


@pytest.mark.asyncio
async def test_a_service_that_stays_published_is_present_for_three_candidate_ttls(
    lo_lab: AvahiLab, lo_driver: Driver
) -> None:
    lo_lab.publish("Steady Plug", AVAHI_TYPE, 9000)
    ttl_s = 3
    window_s = 3 * ttl_s + 1
    scan_id = await lo_driver.scan(window_s=window_s, ttl_s=ttl_s)
    final = await lo_driver.final(scan_id, window_s + 15)
    statuses = lo_driver.statuses(scan_id)
    first = next(i for i, status in enumerate(statuses) if "Steady Plug" in labels(status))
    assert all("Steady Plug" in labels(status) for status in statuses[first:])
    assert final["status"] == "completed" and final["result"]["reason"] == "window-complete"
    [steady] = [c for c in candidates(final) if c["label"] == "Steady Plug"]
    # Known-answer suppression keeps avahi quiet: only the presence passes advanced last_seen_at.
    assert stamp(steady["last_seen_at"]) - stamp(steady["first_seen_at"]) >= window_s - 3
    assert stamp(steady["expires_at"]) - stamp(steady["last_seen_at"]) == ttl_s


@pytest.mark.asyncio
async def test_a_responder_that_vanished_before_the_session_is_not_seen(fresh_lo_lab: AvahiLab) -> None:
    fresh_lo_lab.publish("Ghost Lamp", AVAHI_TYPE, 7000)
    driver = await Driver.start(fresh_lo_lab, fresh_lo_lab.pinned_interface)
    try:
        first = await driver.scan(window_s=2)
        assert "Ghost Lamp" in labels(await driver.final(first, 15))
        fresh_lo_lab.kill_responder()  # SIGKILL: no goodbye; its records would live 4,500 s in a cache
        second = await driver.scan(window_s=3)
        final = await driver.final(second, 15)
    finally:
        await driver.close()
    assert final["status"] == "completed" and candidates(final) == []
    assert all("Ghost Lamp" not in labels(status) for status in driver.statuses(second))


# -- two namespaces over veth, the connector on its default interface ----------------------------------------


@pytest.fixture
def veth_lab(tmp_path: Path) -> Iterator[AvahiLab]:
    lab = AvahiLab(tmp_path / "lab", "veth")
    try:
        yield lab.start()
    finally:
        lab.close()


@pytest.fixture
def ipv6_lab(tmp_path: Path) -> Iterator[AvahiLab]:
    lab = AvahiLab(tmp_path / "lab", "veth", ipv6_only=True)
    try:
        yield lab.start()
    finally:
        lab.close()


@pytest.mark.asyncio
async def test_out_of_scope_instances_are_never_resolved_on_the_wire(veth_lab: AvahiLab) -> None:
    # Hosts without address records: resolving an instance must ask the network for its host's A/AAAA.
    veth_lab.publish("keep-one", AVAHI_TYPE, 1001, host="keephost.local")
    veth_lab.publish("skip-one", AVAHI_TYPE, 1002, host="skiphost.local")
    veth_lab.publish("keep-excluded", AVAHI_TYPE, 1003, host="exhost.local")
    driver = await Driver.start(veth_lab)  # the default interface: the browser's default route
    try:
        await driver.send({"cmd": "sniff", "ifname": veth_lab.browser_link})
        await driver.wait(lambda line: line.get("sniffing") is True, 5)
        scan_id = await driver.scan(window_s=4, instance_prefix="keep", exclude_prefix="keep-ex")
        final = await driver.final(scan_id, 20)
        await driver.send({"cmd": "questions"})
        questions = (await driver.wait(lambda line: "questions" in line, 5))["questions"]
    finally:
        await driver.close()
    assert labels(final) == {"keep-one"}
    asked = {name for _, name in questions}
    assert any(name == "keephost.local." for name in asked)  # control: resolution does reach the wire
    for out_of_scope in ("skip-one.", "skiphost.local.", "keep-excluded.", "exhost.local."):
        assert not any(name.startswith(out_of_scope) for name in asked), out_of_scope
    srv_questions = [name for qtype, name in questions if qtype == 33]
    assert all(name.startswith("keep-one.") for name in srv_questions)


@pytest.mark.asyncio
async def test_an_ipv6_only_responder_is_seen_on_the_default_interface(ipv6_lab: AvahiLab) -> None:
    ipv6_lab.publish("Matter Bulb", AVAHI_TYPE, 5540)
    driver = await Driver.start(ipv6_lab)
    try:
        scan_id = await driver.scan(window_s=3)
        final = await driver.final(scan_id, 15)
    finally:
        await driver.close()
    assert final["status"] == "completed"
    assert labels(final) == {"Matter Bulb"}


@pytest.mark.asyncio
@pytest.mark.realtime  # avahi's lab namespace and a driver process
async def test_no_multicast_capable_interface_fails_provider_unavailable(tmp_path: Path) -> None:
    lab = AvahiLab(tmp_path / "bare", "lo")
    lab._add_namespace(lab.tag)  # only `lo`, without the multicast flag and without routes
    try:
        driver = await Driver.start(lab)
        try:
            final = await driver.final(await driver.scan(window_s=2), 10)
        finally:
            await driver.close()
    finally:
        lab.close()
    assert final["status"] == "failed"
    assert final["error"] == {
        "code": "provider-unavailable",
        "message": "no multicast-capable interface on the default route",
    }
    assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
