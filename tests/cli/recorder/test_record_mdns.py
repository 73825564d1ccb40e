"""Recording from the real mDNS provider against a second AsyncZeroconf on 127.0.0.1, then replaying it."""

from __future__ import annotations

import asyncio
import ipaddress
import select
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from connector.cli.fixtures_cmd import find_service_types
from connector.cli.recorder import (
    FixtureHeader,
    Pseudonymiser,
    Recorder,
    RecordingOutcome,
    library_versions,
    recording_scope,
)
from connector.core.observations import MdnsObservation
from connector.core.scope import DiscoveryScope, ScopeFilter, mdns_instance
from connector.timer import VirtualTimer
from providers.mdns import MdnsProvider
from providers.replay import ReplayProvider
from tests.cli.recorder.support import (
    CLI_SCRIPT,
    TableSink,
    WatchedFixture,
    content,
    fixture_lines,
    spawn_cli,
)
from tests.providers.mdns_peer import LOOPBACK, Responder, run_instance, run_service_type
from tests.support.paths import REPO
from tests.support.waiting import wait_until

LAMPS = run_service_type("rlm")
KITCHEN = run_instance("Kitchen Lamp")
HALL = run_instance("Hall Lamp")


def lamps_scope() -> DiscoveryScope:
    return DiscoveryScope("mdns", 10, 64, 65536, ScopeFilter(service_types=(LAMPS,)), cleanup_timeout_ms=2000)


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[MdnsProvider]:
    """The real provider on loopback; its open sessions are stopped after the test."""
    mdns = MdnsProvider(interfaces=[LOOPBACK])
    try:
        yield mdns
    finally:
        await mdns.aclose()


class _Started:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def started(self, value: None = None) -> None:
        self.event.set()


async def play_story(responder: Responder, live: TableSink) -> None:
    """Two lamps appear and stay present for a presence pass; one leaves."""
    await responder.register(LAMPS, KITCHEN, {"fw": "1.0", "url": f"http://{KITCHEN}.local./"})
    hall = await responder.register(LAMPS, HALL, {"fw": "2.0"})
    await wait_for(live, lambda o: o.name.startswith(HALL))
    await wait_for(live, lambda o: o.event == "update" and o.name.startswith(KITCHEN))
    await responder.unregister(hall)
    await wait_for(live, lambda o: o.event == "remove")


async def wait_for(sink: TableSink, predicate: Callable[[MdnsObservation], bool]) -> None:
    """Until the sink holds an mDNS observation for which `predicate` holds."""
    await wait_until(lambda: any(isinstance(o, MdnsObservation) and predicate(o) for o in sink.observations))


async def record_alongside_live(
    provider: MdnsProvider, target: Path, *, keep: bool
) -> tuple[TableSink, object]:
    """A live scan and a recording, concurrent (each session has an engine of its own)."""
    live = TableSink(lamps_scope())
    session = await provider.start(lamps_scope(), live)
    header = FixtureHeader("mdns", "2026-11-30T10:00:00Z", None, library_versions(), "loopback")
    fixture = WatchedFixture(target)
    recorder = Recorder(provider, recording_scope("mdns", 30, service_types=[LAMPS]), fixture,
                        header, pseudonymiser=None if keep else Pseudonymiser())
    status = _Started()
    task = asyncio.ensure_future(recorder.run(30, task_status=status))
    try:
        await asyncio.wait_for(status.event.wait(), 5)
        async with Responder() as responder:
            await play_story(responder, live)
            await wait_until(lambda: fixture.holds(event="remove"))  # the recording saw the removal too
            # Both end while the kitchen lamp is still announced (closing the responder withdraws it).
            await session.stop()
            recorder.finish()
            result = await asyncio.wait_for(task, 5)
    finally:
        await session.stop()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return live, result


async def replay(target: Path) -> TableSink:
    sink = TableSink(lamps_scope())
    timer = VirtualTimer()
    session = await ReplayProvider(target, speed=8.0, timer=timer).start(lamps_scope(), sink)
    await timer.run_until(lambda: session.finished)
    await session.stop()
    return sink


@pytest.mark.asyncio
@pytest.mark.realtime  # python-zeroconf engines on loopback sockets
async def test_a_recording_with_kept_identities_replays_to_the_live_candidates(
    provider: MdnsProvider, tmp_path: Path
) -> None:
    target = tmp_path / "lamps.jsonl"
    live, result = await record_alongside_live(provider, target, keep=True)
    assert getattr(result, "outcome", None) is RecordingOutcome.RECORDED
    lines = fixture_lines(target)[1:]
    events = [line["event"] for line in lines]
    hall_events = [line["event"] for line in lines if line["name"] == f"{HALL}.{LAMPS}"]
    assert events.count("add") == 2 and "update" in events and hall_events[-1] == "remove"
    assert not any("txt" in line for line in lines)  # TXT values are never kept
    assert {line["name"] for line in lines} == {f"{KITCHEN}.{LAMPS}", f"{HALL}.{LAMPS}"}  # kept as seen
    assert all(line["addresses"] == [LOOPBACK] for line in lines)
    replayed = await replay(target)
    assert content(replayed.candidates()) == content(live.candidates())
    assert [c["label"] for c in replayed.candidates()] == [KITCHEN]


@pytest.mark.asyncio
@pytest.mark.realtime  # python-zeroconf engines on loopback sockets
async def test_mdns_identities_are_pseudonymised_and_the_type_suffix_kept(
    provider: MdnsProvider, tmp_path: Path
) -> None:
    target = tmp_path / "lamps.jsonl"
    live, _ = await record_alongside_live(provider, target, keep=False)
    text = target.read_text()
    header, *lines = fixture_lines(target)
    assert header["source"] == "recorded" and header["adapter"] is None
    assert KITCHEN.lower() not in text.lower() and HALL.lower() not in text.lower() and LOOPBACK not in text
    instances = {mdns_instance(line["name"], LAMPS) for line in lines}
    assert len(instances) == 2 and all(label.startswith("device-") for label in instances)
    assert all(line["name"].endswith("." + LAMPS) and line["service_type"] == LAMPS for line in lines)
    servers = {line["server"] for line in lines}
    assert len(servers) == 2 and all(s.startswith("host-") and s.endswith(".local.") for s in servers)
    for line in lines:
        for address in line["addresses"]:
            assert ipaddress.ip_address(address) in ipaddress.ip_network("198.18.0.0/15")
    assert not any("txt" in line for line in lines)
    # Candidates on replay: the same content except that the label is the pseudonymised instance.
    (live_candidate,), (replayed_candidate,) = live.candidates(), (await replay(target)).candidates()
    assert replayed_candidate["label"].startswith("device-")
    assert replayed_candidate["mdns"]["service_type"] == live_candidate["mdns"]["service_type"] == LAMPS


@pytest.mark.asyncio
@pytest.mark.realtime  # python-zeroconf engines on loopback sockets
async def test_service_types_are_learned_from_the_dns_sd_meta_query() -> None:
    async with Responder() as responder:
        await responder.register(LAMPS, KITCHEN, {})
        found = await find_service_types([LOOPBACK], 1.5)
    assert LAMPS in found
    assert all(t.endswith(("._tcp.local.", "._udp.local.")) for t in found)


@pytest.mark.realtime  # a CLI process
@pytest.mark.asyncio
async def test_the_cli_learns_the_types_and_records_them(tmp_path: Path) -> None:
    target = tmp_path / "lan.jsonl"
    async with Responder() as responder:
        await responder.register(LAMPS, KITCHEN, {"fw": "1.0"})
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLI_SCRIPT, "fixtures", "record", "--transport", "mdns", "--seconds", "3",
            "--types-seconds", "2", "--mdns-interfaces", LOOPBACK, "-o", str(target),
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 0, stderr.decode()
    header, *lines = fixture_lines(target)
    assert header["transport"] == "mdns" and header["source"] == "recorded"
    ours = [line for line in lines if line["service_type"] == LAMPS]
    assert ours and all(KITCHEN not in line["name"] for line in ours)
    assert target.stat().st_mode & 0o777 == 0o600


@pytest.mark.realtime  # a CLI process
def test_ctrl_c_while_learning_types_exits_130_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "lan.jsonl"
    child = spawn_cli(["fixtures", "record", "--transport", "mdns", "--seconds", "5", "--types-seconds", "30",
                       "--mdns-interfaces", LOOPBACK, "-o", str(target)])
    assert child.stderr is not None
    assert select.select([child.stderr], [], [], 15)[0], "the recorder said nothing in time"
    assert child.stderr.readline().startswith("fixtures record: learning the mdns service types")
    child.send_signal(signal.SIGINT)
    try:
        _, stderr = child.communicate(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, stderr
    assert "aborted; nothing was written" in stderr
    assert list(tmp_path.iterdir()) == []
