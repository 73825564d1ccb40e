"""The BLE provider's start refusals, stop acknowledgement and mid-session failures against emulated BlueZ."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from dbus_fast import Message, MessageType

from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.errors import ProviderError, ProviderRestarted, ProviderUnavailable, StopUnconfirmed
from providers.base import StartUnconfirmed, StopOutcome
from providers.ble import BleProvider, BleSession, BusLink
from tests.providers.bluez_mock import BluezController, RecordingSink, bluez

__all__ = ["bluez"]  # the fixture, imported above

HEART = "0000180d-0000-1000-8000-00805f9b34fb"
DEV_A = "AA:BB:CC:00:00:01"


def ble_scope(*, adapter: str | None = None, cleanup_timeout_ms: int = 1000) -> DiscoveryScope:
    """An admitted BLE scope for heart-rate sensors."""
    return DiscoveryScope(
        transport="ble",
        window_seconds=10,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(service_uuids=(HEART,)),
        adapter=adapter,
        cleanup_timeout_ms=cleanup_timeout_ms,
    )


def assert_no_echo(error: Exception, *values: str) -> None:
    """The error message names no input value."""
    for value in values:
        assert value not in str(error)


# --------------------------------------------------------------------------------------------- start


@pytest.mark.asyncio
async def test_powered_off_adapter_is_unavailable_at_start(bluez: BluezController) -> None:
    bluez.set_powered(False)
    with pytest.raises(ProviderUnavailable) as caught:
        await BleProvider(adapter="hci0").start(ble_scope(), RecordingSink())
    assert caught.value.code == "provider-unavailable"
    assert bluez.method_calls("StartDiscovery") == []
    assert_no_echo(caught.value, "hci0")


@pytest.mark.asyncio
async def test_powered_off_default_adapter_is_unavailable_at_start(bluez: BluezController) -> None:
    bluez.set_powered(False)
    with pytest.raises(ProviderUnavailable):
        await BleProvider().start(ble_scope(), RecordingSink())
    assert bluez.method_calls("StartDiscovery") == []


@pytest.mark.asyncio
async def test_missing_adapter_is_unavailable_at_start(bluez: BluezController) -> None:
    with pytest.raises(ProviderUnavailable) as caught:
        await BleProvider().start(ble_scope(adapter="hci7"), RecordingSink())
    assert caught.value.code == "provider-unavailable"
    assert_no_echo(caught.value, "hci7")
    assert bluez.method_calls("StartDiscovery") == []


@pytest.mark.asyncio
async def test_no_adapter_at_all_is_unavailable_at_start(bluez: BluezController) -> None:
    bluez.remove_adapter()
    with pytest.raises(ProviderUnavailable):
        await BleProvider().start(ble_scope(), RecordingSink())


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["hci0/../x", "", "hci 0", "x" * 65])
async def test_adapter_names_that_are_no_object_path_are_unavailable(
    bluez: BluezController, name: str
) -> None:
    with pytest.raises(ProviderUnavailable) as caught:
        await BleProvider(adapter=name).start(ble_scope(), RecordingSink())
    if name:
        assert_no_echo(caught.value, name)


@pytest.mark.asyncio
async def test_bluetoothd_not_running_is_unavailable_at_start(bluez: BluezController) -> None:
    bluez.stop_bluetoothd()
    with pytest.raises(ProviderUnavailable):
        await BleProvider(adapter="hci0").start(ble_scope(), RecordingSink())


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("dbus_error", "expected_code"),
    [("org.bluez.Error.NotReady", "provider-unavailable"), ("org.bluez.Error.Failed", "provider-failure")],
)
async def test_start_discovery_refused_is_translated(
    bluez: BluezController, dbus_error: str, expected_code: str
) -> None:
    bluez.fail_start(dbus_error)
    with pytest.raises(ProviderError) as caught:
        await BleProvider().start(ble_scope(), RecordingSink())
    assert caught.value.code == expected_code
    assert caught.value.diagnostics == ({"code": "ble-backend", "message": dbus_error},)
    assert "injected" not in str(caught.value)


# ---------------------------------------------------------------------------------------------- stop


@pytest.mark.asyncio
async def test_stop_discovery_acknowledged_returns_and_is_idempotent(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(), sink)
    assert isinstance(session, BleSession) and session.worker_pid is not None
    worker = session.worker_pid
    assert bluez.discovering()
    await session.stop()
    assert not bluez.discovering()
    await session.stop()
    assert len(bluez.method_calls("StopDiscovery")) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # reaped with the stop: no process is left that could relay a later advert
    bluez.add_device(DEV_A, service_uuids=[HEART])
    bluez.update(DEV_A, rssi=-30)
    assert sink.observations == []


@pytest.mark.asyncio
async def test_stop_refused_by_bluez_is_proven_by_disconnecting_the_worker(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(), sink)
    assert isinstance(session, BleSession)
    name = session.unique_name
    bluez.fail_stop("org.bluez.Error.Failed", "Operation failed")
    bluez.add_device(DEV_A, service_uuids=[HEART])
    assert await session.stop() is StopOutcome.PROVEN
    # Killing the worker closed its connection: bluetoothd dropped its discovery session.
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert name not in bluez.clients() and not bluez.discovering()
    assert len(bluez.method_calls("StopDiscovery")) == 1
    assert await session.stop() is StopOutcome.PROVEN  # idempotent
    assert len(bluez.method_calls("StopDiscovery")) == 1
    assert all(o.address != DEV_A for o in sink.observations[1:])


@pytest.mark.asyncio
async def test_no_discovery_started_is_an_acknowledgement(bluez: BluezController) -> None:
    session = await BleProvider().start(ble_scope(), RecordingSink())
    # bluetoothd's answer when this D-Bus client holds no discovery session any more.
    bluez.fail_stop("org.bluez.Error.Failed", "No discovery started")
    assert await session.stop() is StopOutcome.ACKNOWLEDGED


@pytest.mark.asyncio
async def test_a_stop_never_answered_is_proven_within_the_bound_and_the_session_is_gone(
    bluez: BluezController,
) -> None:
    session = await BleProvider().start(ble_scope(cleanup_timeout_ms=300), RecordingSink())
    assert isinstance(session, BleSession)
    bluez.stall_stop(session.unique_name)
    started = time.monotonic()
    assert await session.stop() is StopOutcome.PROVEN
    # The stall is forever: returning at all shows the proof bound; only the lower bound is exact.
    assert time.monotonic() - started >= 0.29
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert bluez.clients() == [] and not bluez.discovering()


@pytest.mark.asyncio
async def test_a_wedged_bluetoothd_leaves_the_stop_unconfirmed_until_it_answers(
    bluez: BluezController,
) -> None:
    session = await BleProvider().start(ble_scope(cleanup_timeout_ms=300), RecordingSink())
    assert isinstance(session, BleSession)
    bluez.wedge()  # forever, until unwedged: raising at all shows the bound
    with pytest.raises(StopUnconfirmed) as caught:
        await session.stop()
    assert caught.value.code == "cleanup-unconfirmed"
    with pytest.raises(StopUnconfirmed):  # still wedged: the retry is bounded by the proof too
        await session.stop()
    bluez.unwedge()  # bluetoothd handles the disconnect, then answers the round trip
    assert await session.stop() is StopOutcome.PROVEN
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert bluez.clients() == []


@pytest.mark.asyncio
async def test_stop_cancelled_by_the_caller_keeps_waiting_for_bluez(bluez: BluezController) -> None:
    session = await BleProvider().start(ble_scope(cleanup_timeout_ms=2000), RecordingSink())
    bluez.stall_stop()
    stopping = asyncio.ensure_future(session.stop())
    await bluez.called("StopDiscovery", unless=stopping)
    assert not stopping.done()  # bluetoothd holds the StopDiscovery unanswered
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    bluez.release_stalled()
    assert await session.stop() is StopOutcome.ACKNOWLEDGED  # joined the StopDiscovery still waiting
    assert not bluez.discovering()
    assert len(bluez.method_calls("StopDiscovery")) == 1


@pytest.mark.asyncio
async def test_a_worker_crash_fails_only_its_session_and_its_end_is_proven(bluez: BluezController) -> None:
    provider = BleProvider()
    crashing, healthy = RecordingSink(), RecordingSink()
    doomed = await provider.start(ble_scope(), crashing)
    other = await provider.start(ble_scope(), healthy)
    assert isinstance(doomed, BleSession) and isinstance(other, BleSession)
    assert len(bluez.clients()) == 2
    assert doomed.worker_pid is not None
    os.kill(doomed.worker_pid, signal.SIGKILL)
    failure = await crashing.wait_for_failure()
    assert type(failure) is ProviderError and failure.code == "provider-failure"
    assert await doomed.stop() is StopOutcome.PROVEN
    assert bluez.clients() == [other.unique_name]
    bluez.add_device(DEV_A, service_uuids=[HEART])
    await healthy.wait_for(lambda o: o.address == DEV_A)
    assert healthy.failures == []
    assert await other.stop() is StopOutcome.ACKNOWLEDGED


# ------------------------------------------------------------------------------------ mid-session


@pytest.mark.asyncio
async def test_adapter_powered_off_mid_session_fails_the_session(bluez: BluezController) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(), sink)
    bluez.add_device(DEV_A, service_uuids=[HEART])
    await sink.wait_for(lambda o: o.address == DEV_A)
    bluez.set_powered(False)
    failure = await sink.wait_for_failure()
    assert isinstance(failure, ProviderRestarted)
    assert failure.code == "provider-restarted"
    seen = len(sink.observations)
    bluez.update(DEV_A, rssi=-20)
    await asyncio.sleep(0.05)  # real peer: a "gone" worker forwards nothing, not even a marker
    assert len(sink.observations) == seen
    await session.stop()
    assert len(sink.failures) == 1


@pytest.mark.asyncio
async def test_adapter_removed_mid_session_fails_the_session_and_stop_is_acknowledged(
    bluez: BluezController,
) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(), sink)
    bluez.remove_adapter()
    assert isinstance(await sink.wait_for_failure(), ProviderRestarted)
    # The adapter object is gone, and its discovery sessions with it.
    await session.stop()
    assert len(sink.failures) == 1


@pytest.mark.asyncio
async def test_bluetoothd_exit_mid_session_fails_the_session_and_stop_is_acknowledged(
    bluez: BluezController,
) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(), sink)
    bluez.stop_bluetoothd()
    assert isinstance(await sink.wait_for_failure(), ProviderRestarted)
    await session.stop()


@pytest.mark.asyncio
async def test_system_bus_lost_mid_session_fails_the_session_and_stop_is_unconfirmed(
    bluez: BluezController,
) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(cleanup_timeout_ms=300), sink)
    bluez.stop_system_bus()
    assert isinstance(await sink.wait_for_failure(), ProviderRestarted)
    # The worker's own bus being gone proves nothing about bluetoothd, and no proof can run without a bus.
    with pytest.raises(StopUnconfirmed) as caught:
        await session.stop()
    assert list(caught.value.diagnostics) == [{"code": "provider-stop", "message": "bus-disconnected"}]


@pytest.mark.asyncio
async def test_adapter_powered_off_while_starting_fails_the_session(bluez: BluezController) -> None:
    bluez.power_off_during_start()
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(), sink)
    assert isinstance(await sink.wait_for_failure(), ProviderRestarted)
    await session.stop()
    assert len(sink.failures) == 1


@pytest.mark.asyncio
async def test_another_adapter_going_away_does_not_touch_the_session(bluez: BluezController) -> None:
    bluez.add_adapter("hci1")
    sink = RecordingSink()
    session = await BleProvider(adapter="hci0").start(ble_scope(), sink)
    bluez.set_powered(False, "hci1")
    bluez.remove_adapter("hci1")
    bluez.add_device(DEV_A, service_uuids=[HEART])
    await sink.wait_for(lambda o: o.address == DEV_A)
    await session.stop()
    assert sink.failures == []


# ------------------------------------------------------------------------------------------- proof


@pytest.mark.asyncio
async def test_a_start_cut_off_after_start_discovery_hands_back_the_unproven_session(
    bluez: BluezController,
) -> None:
    bluez.wedge_after_start()
    start = asyncio.ensure_future(BleProvider().start(ble_scope(cleanup_timeout_ms=300), RecordingSink()))
    await bluez.called("StartDiscovery", unless=start)  # the session exists; its reply never comes
    start.cancel()  # what the connector's timeout does to the start
    with pytest.raises(StartUnconfirmed) as caught:
        await start
    session = caught.value.session
    assert isinstance(session, BleSession) and session.unique_name is not None
    assert bluez.clients() == [session.unique_name]  # wedged: the worker's discovery session stays
    with pytest.raises(StopUnconfirmed):
        await session.stop()
    bluez.unwedge()
    assert await session.stop() is StopOutcome.PROVEN
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert bluez.clients() == []


@pytest.mark.asyncio
async def test_a_start_cut_off_before_the_worker_reached_the_bus_leaves_nothing(
    bluez: BluezController,
) -> None:
    bluez.wedge()  # bleak's first GetManagedObjects hangs: no bus name reported, nothing asked of BlueZ
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await BleProvider().start(ble_scope(adapter="hci0"), RecordingSink())
    bluez.unwedge()
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert bluez.clients() == []


@pytest.mark.asyncio
async def test_the_proof_holds_after_the_connectors_bus_link_reconnected(bluez: BluezController) -> None:
    session = await BleProvider().start(ble_scope(cleanup_timeout_ms=300), RecordingSink())
    assert isinstance(session, BleSession)
    bluez.stall_stop(session.unique_name)
    # Our connection drops; the next call reconnects, without the match rule for the worker's name.
    session._link.close()
    assert await session.stop() is StopOutcome.PROVEN
    await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
    assert bluez.clients() == []


class _ScriptedLink(BusLink):
    """A link whose Introspect round trip gets the one scripted reply."""

    def __init__(self, reply: Message) -> None:
        super().__init__()
        self._reply = reply

    async def _call(self, msg: Message) -> Message:
        return self._reply


def _error_from(sender: str, name: str) -> Message:
    return Message(message_type=MessageType.ERROR, sender=sender, error_name=name, reply_serial=1)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("reply", "answered"),
    [
        (Message(message_type=MessageType.METHOD_RETURN, sender=":1.7", reply_serial=1), True),
        (_error_from(":1.7", "org.freedesktop.DBus.Error.UnknownMethod"), True),  # bluetoothd itself
        (_error_from("org.freedesktop.DBus", "org.freedesktop.DBus.Error.ServiceUnknown"), True),
        (_error_from("org.freedesktop.DBus", "org.freedesktop.DBus.Error.NameHasNoOwner"), True),
        (_error_from("org.freedesktop.DBus", "org.freedesktop.DBus.Error.NoReply"), False),
        (_error_from("org.freedesktop.DBus", "org.freedesktop.DBus.Error.LimitsExceeded"), False),
        (_error_from("org.freedesktop.DBus", "org.freedesktop.DBus.Error.AccessDenied"), False),
    ],
)
async def test_only_bluetoothd_or_its_absence_answers_the_round_trip(reply: Message, answered: bool) -> None:
    assert await _ScriptedLink(reply).bluez_answers() is answered


@pytest.mark.asyncio
async def test_a_frame_the_reader_cannot_handle_fails_the_session_with_fixed_text(
    bluez: BluezController, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = RecordingSink()
    session = await BleProvider().start(ble_scope(cleanup_timeout_ms=300), sink)
    assert isinstance(session, BleSession)

    async def broken(payload: bytes) -> None:
        raise ValueError(f"bad frame from {DEV_A}")

    monkeypatch.setattr(session, "_dispatch", broken)
    bluez.add_device(DEV_A, service_uuids=[HEART])
    failure = await sink.wait_for_failure()
    assert type(failure) is ProviderError and failure.code == "provider-failure"
    assert_no_echo(failure, DEV_A)
    assert session._reader is not None
    await asyncio.wait({session._reader})
    assert session._reader.exception() is None  # nothing left for asyncio to log
    assert await session.stop() is StopOutcome.PROVEN
