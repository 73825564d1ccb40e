"""The Bus surface end to end: a real nats-server, the connector in-process (host, poller, Bus adapter)."""

from __future__ import annotations

import json
import logging
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from nats.errors import NoRespondersError

from connector.bus.client import BusRefused
from connector.core.clock import format_time, wall_clock
from connector.service.answers import Accepted
from connector.storage.registry import OperationRecord
from tests.bus.broker import NatsServer
from tests.bus.support import (
    FAIL,
    REDACT,
    SCAN,
    SLEEP,
    STUBBORN,
    CountingProviders,
    ble_scan,
    client,
    make_env,
    running_connector,
    spying,
    watch_states,
)
from tests.host.support import EndsBeforeTheHostLooks
from tests.support.clocks import OffsetClock
from tests.support.directives import command_directive, scan_directive
from tests.support.waiting import wait_until

pytestmark = pytest.mark.realtime  # every test runs a nats-server (or waits for one) and commands

TERMINAL = {"done", "failed", "cancelled", "lost"}
RETENTION_PASSED = timedelta(seconds=4.5)  # past the 4 s host retention of the retention test


async def _record(registry: Any, owner: str, op: str) -> OperationRecord:
    record = await registry.find_by_bus_op(owner, op)
    assert record is not None
    return record  # type: ignore[no-any-return]


def _heard(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """True once the connector logged a line containing `text`."""
    return any(text in record.getMessage() for record in caplog.records)


async def _terminal(registry: Any, owner: str, op: str, timeout: float = 15.0) -> OperationRecord:
    """Wait until the registry holds a terminal status for the handle."""
    with anyio.fail_after(timeout):
        while True:
            record = await registry.find_by_bus_op(owner, op)
            if record is not None and record.terminal:
                return record  # type: ignore[no-any-return]
            await anyio.sleep(0.05)  # real peer: the connector's tasks write the registry (commands, nats)


async def _terminal_by_id(registry: Any, operation_id: str, timeout: float = 15.0) -> OperationRecord:
    """Wait until the registry holds a terminal status for the operation id (the command runs for real)."""
    with anyio.fail_after(timeout):
        while True:
            record = await registry.get(operation_id)
            if record is not None and record.terminal:
                return record  # type: ignore[no-any-return]
            await anyio.sleep(0.05)  # real peer: the command runs in a subprocess


async def _answered(request: Any, timeout: float = 15.0) -> dict[str, Any]:
    """A request retried while nobody answers yet (a reconnecting service), as a caller would."""
    with anyio.fail_after(timeout):
        while True:
            try:
                return await request()  # type: ignore[no-any-return]
            except NoRespondersError:
                await anyio.sleep(0.1)  # real peer: the Bus service is reconnecting to the broker


def _no_private_keys(document: dict[str, Any]) -> None:
    for key in ("progress", "result", "snapshot", "candidates"):
        assert key not in document


@pytest.mark.asyncio
async def test_scan_start_get_done_and_retries_join_the_same_work(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    providers = CountingProviders(env.config(broker.url))
    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url, providers=providers) as assembled,
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        first = await bus.start(ble_scan(2), op="scan-1")
        assert first["op"] == "scan-1" and first["state"] in ("queued", "running")
        assert set(first) == {"op", "state"}
        # A retry after a lost reply - several at once, too - joins the same work.
        replies: list[dict[str, Any]] = []

        async def retry() -> None:
            replies.append(await bus.start(ble_scan(2), op="scan-1"))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(retry)
        assert {r["op"] for r in replies} == {"scan-1"} and all(r["state"] != "unknown" for r in replies)
        record = await _record(assembled.registry, "alice", "scan-1")
        assert record.capability_id == SCAN and record.bus_op == "scan-1"

        got = await bus.get("scan-1")
        assert got["op"] == "scan-1" and got["operation/id"] == record.operation_id
        assert got["action_id"] == SCAN and got["owner"] == "alice" and got["scope"]["transport"] == "ble"
        _no_private_keys(got)

        states = await watch_states(bus, "scan-1")
        assert states[-1] == "done" and set(states) <= {"queued", "running", "done"}
        final = await bus.get("scan-1")
        assert (final["state"], final["status"], final["reason"]) == ("done", "completed", "window-complete")
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        # Also after the end, the same handle joins: the finished work, never a second scan.
        assert await bus.start(ble_scan(2), op="scan-1") == {"op": "scan-1", "state": "done"}
        # The operation id is a handle too.
        assert (await bus.get(record.operation_id))["state"] == "done"
        await wait_until(lambda: spy.done("scan-1"))
        await anyio.sleep(0.5)  # real peer: a second op.done would have reached the spy by now
    assert providers.starts == 1
    [done] = spy.done("scan-1")
    assert (done["state"], done["reason"], done["operation/id"]) == (
        "done",
        "window-complete",
        record.operation_id,
    )
    assert "owner" not in done and "scope" not in done and "disclosed_count" not in done
    _no_private_keys(done)


@pytest.mark.asyncio
async def test_a_handle_is_bound_to_its_directive(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    providers = CountingProviders(env.config(broker.url))
    async with (
        running_connector(env, broker.url, providers=providers),
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        await bus.start(ble_scan(3), op="scan-2")
        with pytest.raises(BusRefused) as other_window:
            await bus.start(ble_scan(4), op="scan-2")
        assert other_window.value.code == "idempotency-conflict"
        assert other_window.value.reply["state"] in ("queued", "running")
        with pytest.raises(BusRefused) as other_action:
            await bus.start(command_directive(REDACT, input={"text": "x"}), op="scan-2")
        assert other_action.value.code == "idempotency-conflict"
        assert other_action.value.reply["op"] == "scan-2"
        assert (await bus.cancel("scan-2"))["cancelled"] is True
    assert providers.starts == 1


@pytest.mark.asyncio
async def test_command_actions_start_get_cancel_done(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url) as assembled,
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        redact = command_directive(REDACT, input={"text": "mail a@b.example"})
        started = await bus.start(redact, op="redact-1")
        assert started["op"] == "redact-1" and started["state"] in ("queued", "running")
        states = await watch_states(bus, "redact-1", poll_interval=0.2)
        assert states[-1] == "done" and set(states) <= {"queued", "running", "done"}
        got = await bus.get("redact-1")
        assert (got["state"], got["status"], got["action_id"]) == ("done", "completed", REDACT)
        _no_private_keys(got)

        await bus.start(command_directive(SLEEP), op="sleep-1")
        cancelled = await bus.cancel("sleep-1")
        assert cancelled == {"op": "sleep-1", "cancelled": True, "state": "cancelled"}
        assert await bus.cancel("sleep-1") == {"op": "sleep-1", "cancelled": False, "state": "cancelled"}
        assert (await bus.get("sleep-1"))["state"] == "cancelled"

        await bus.start(command_directive(FAIL), op="fail-1")
        assert (await watch_states(bus, "fail-1", poll_interval=0.2))[-1] == "failed"
        failed = await bus.get("fail-1")
        assert (failed["reason"], failed["error_code"]) == ("command-failed", "command-failed")
        assert (await bus.cancel("fail-1"))["cancelled"] is False

        await bus.start(command_directive(STUBBORN), op="stubborn-1")
        with pytest.raises(BusRefused) as refused:
            await bus.cancel("stubborn-1")
        assert refused.value.code == "not-cancelable"
        assert (
            refused.value.reply["state"] in ("queued", "running") and "cancelled" not in refused.value.reply
        )

        for op in ("redact-1", "sleep-1", "fail-1"):
            await _terminal(assembled.registry, "alice", op)
        await wait_until(lambda: all(spy.done(op) for op in ("redact-1", "sleep-1", "fail-1")))
        await anyio.sleep(0.5)  # real peer: a second op.done would have reached the spy by now
    assert [d["state"] for d in spy.done("redact-1")] == ["done"]
    assert [d["state"] for d in spy.done("sleep-1")] == ["cancelled"]
    assert [(d["state"], d["reason"]) for d in spy.done("fail-1")] == [("failed", "command-failed")]
    assert all("mail" not in str(reply) for reply in spy.replies())  # no result on the Bus


@pytest.mark.asyncio
async def test_scan_cancel_is_confirmed_and_announced_once(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url),
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        await bus.start(ble_scan(30), op="long-scan")
        with anyio.fail_after(10):
            while (await bus.get("long-scan"))["state"] != "running":
                await anyio.sleep(0.05)  # real peer: the scan runs on the wall clock
        first = await bus.cancel("long-scan")
        assert first["cancelled"] is True and first["state"] in ("running", "cancelled")
        second = await bus.cancel("long-scan")
        assert second["cancelled"] is False
        assert (await watch_states(bus, "long-scan", poll_interval=0.2))[-1] == "cancelled"
        final = await bus.get("long-scan")
        assert final["cancellation"]["state"] == "confirmed" and final["cleanup"]["claim"] == "released"
        await wait_until(lambda: spy.done("long-scan"))
        await anyio.sleep(0.5)  # real peer: a second op.done would have reached the spy by now
    assert [d["state"] for d in spy.done("long-scan")] == ["cancelled"]


@pytest.mark.asyncio
async def test_a_caller_that_was_away_catches_up(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    async with spying(broker.url) as spy, running_connector(env, broker.url) as assembled:
        async with client(broker.url, env.tokens["alice"]) as bus:
            await bus.start(ble_scan(1), op="away-1")
        # The caller is away while the scan ends and its op.done goes out (only the spy hears it).
        await _terminal(assembled.registry, "alice", "away-1")
        await wait_until(lambda: spy.done("away-1"))
        async with client(broker.url, env.tokens["alice"]) as bus:
            got = await bus.get("away-1")
            assert (got["state"], got["reason"]) == ("done", "window-complete")
            assert await watch_states(bus, "away-1", poll_interval=None) == ["done"]


@pytest.mark.asyncio
async def test_broker_restart_mid_operation_loses_no_outcome(
    tmp_path: Path, broker: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sensorium.bus")
    env = make_env(tmp_path)
    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url) as assembled,
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        await bus.start(ble_scan(2), op="outage-1")
        await bus.start(command_directive(SLEEP), op="outage-2")
        states: list[str] = []

        async def watch() -> None:
            async for change in bus.watch("outage-1", poll_interval=None):
                states.append(change["state"])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await wait_until(lambda: bool(states))
                broker.kill()
                # The scan ends while the broker is gone: its op.done cannot go out now.
                await _terminal(assembled.registry, "alice", "outage-1")
                await wait_until(lambda: _heard(caplog, "bus disconnected"))
                await anyio.to_thread.run_sync(broker.start)
        assert states[-1] == "done"
        # The connector answers again once it has reconnected: a cancel of the other operation works.
        assert (await _answered(lambda: bus.cancel("outage-2")))["cancelled"] is True
        await wait_until(lambda: spy.done("outage-1") and spy.done("outage-2"))
        await anyio.sleep(0.5)  # real peer: a second op.done would have reached the spy by now
    assert [d["state"] for d in spy.done("outage-1")] == ["done"]
    assert [d["state"] for d in spy.done("outage-2")] == ["cancelled"]


@pytest.mark.asyncio
async def test_interrupted_operations_are_lost_exactly_once_across_restarts(
    tmp_path: Path, broker: NatsServer
) -> None:
    env = make_env(tmp_path)
    async with running_connector(env, broker.url), client(broker.url, env.tokens["alice"]) as bus:
        await bus.start(ble_scan(30), op="cut-1")
        assert (await bus.get("cut-1"))["state"] in ("queued", "running")
    async with spying(broker.url) as spy:
        async with running_connector(env, broker.url), client(broker.url, env.tokens["alice"]) as bus:
            await wait_until(lambda: spy.done("cut-1"))
            got = await bus.get("cut-1")
            assert (got["state"], got["reason"], got["status"]) == (
                "lost",
                "interrupted-by-restart",
                "failed",
            )
            assert await watch_states(bus, "cut-1", poll_interval=None) == ["lost"]
        async with running_connector(env, broker.url):
            await anyio.sleep(1.0)  # real peer: the third start's sweep; nothing signals it owes none
    [lost] = spy.done("cut-1")
    assert (lost["state"], lost["reason"], lost["status"]) == ("lost", "interrupted-by-restart", "failed")


@pytest.mark.asyncio
async def test_outcomes_reached_while_the_bus_was_away_are_announced_within_retention(
    tmp_path: Path, broker: NatsServer
) -> None:
    env = make_env(tmp_path)
    # The command and the host's polls run in real time; retention ages by moving this clock, not by sleeps.
    clock = OffsetClock()
    async with running_connector(env, None, host_retention_seconds=4, clock=clock) as assembled:
        old = await assembled.host.admit(
            assembled.host.authenticate(env.tokens["alice"]), command_directive(REDACT, input={"text": "a"})
        )
        assert isinstance(old, Accepted)
        old_id = old.handle["operation/id"]
        await _terminal_by_id(assembled.registry, old_id)
        clock.offset += RETENTION_PASSED  # now older than the retention
        redact = command_directive(REDACT, input={"text": "b"})
        recent = await assembled.host.admit(assembled.host.authenticate(env.tokens["alice"]), redact)
        assert isinstance(recent, Accepted)
        recent_id = recent.handle["operation/id"]
        await _terminal_by_id(assembled.registry, recent_id)
    async with (
        spying(broker.url) as spy,
        running_connector(env, broker.url, host_retention_seconds=4, clock=clock),
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        await wait_until(lambda: spy.done(recent_id))
        assert (await bus.get(recent_id))["state"] == "done"
        assert await bus.get(old_id) == {"op": old_id, "state": "unknown"}
        clock.offset += RETENTION_PASSED
        assert await bus.get(recent_id) == {"op": recent_id, "state": "unknown"}  # past retention now
    assert len(spy.done(recent_id)) == 1 and spy.done(old_id) == []


@pytest.mark.asyncio
async def test_refused_requests_start_nothing(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    providers = CountingProviders(env.config(broker.url))
    sync = {**ble_scan(1), "timing": {"mode": "sync"}}
    bad_directive = {**ble_scan(1), "input": {"transport": "ble", "window_seconds": "soon"}}
    cases: list[tuple[str, dict[str, Any], str, str | None]] = [
        ("alice", sync, "execution-mode-not-supported", "r-1"),
        ("alice", {"schema": "sensorium-directive.v1"}, "invalid-directive", "r-2"),
        ("alice", {**ble_scan(1), "action_id": "no.such.action"}, "unknown-action", None),
        ("alice", bad_directive, "invalid-input", "r-3"),
        ("bob", command_directive(SLEEP), "forbidden", "r-4"),
        ("ops", ble_scan(1), "forbidden", "r-5"),
        ("nobody", ble_scan(1), "unauthenticated", "r-6"),
    ]
    async with running_connector(env, broker.url, providers=providers) as assembled:
        for who, directive, code, op in cases:
            async with client(broker.url, env.tokens.get(who, "not-a-token")) as bus:
                with pytest.raises(BusRefused) as refused:
                    await bus.start(directive, op=op)
                assert refused.value.code == code, who
                assert refused.value.reply["state"] == "unknown" and refused.value.reply["op"] == op
                if op is not None:
                    assert await assembled.registry.find_by_bus_op("alice", op) is None
        async with client(broker.url, env.tokens["alice"]) as bus:
            for subject, data, code in (
                (bus.subjects.start, b"{nope", "invalid-json"),
                (bus.subjects.start, b'{"op": "x y", "directive": {}}', "invalid-input"),
                (bus.subjects.get, b'{"op": "ok", "more": 1}', "invalid-input"),
                (bus.subjects.cancel, b"[]", "invalid-input"),
                # CONTRACT §1: strict JSON (issue D5), refused before anything is admitted.
                (bus.subjects.start, b'{"op": "s-1", "directive": {"x": NaN}}', "invalid-json"),
                (bus.subjects.start, b'{"op": "s-2", "op": "s-3", "directive": {}}', "invalid-json"),
                (bus.subjects.start, b'{"op": "s-4", "directive": {"a": "\\ud800"}}', "invalid-json"),
                (bus.subjects.start, _with_input(ble_scan(1), b"1e400"), "invalid-input"),
                (bus.subjects.start, _with_input(ble_scan(1), b"9007199254740993"), "invalid-input"),
                (bus.subjects.get, b'{"op": "ok", "op": "ok"}', "invalid-json"),
            ):
                headers = {"Authorization": f"Bearer {env.tokens['alice']}"}
                msg = await bus.nc.request(subject, data, timeout=5, headers=headers)
                body = json.loads(msg.data)
                assert body["error"]["code"] == code and body["state"] == "unknown"
            assert await bus.get("never-seen") == {"op": "never-seen", "state": "unknown"}
            assert await bus.cancel("never-seen") == {"op": "never-seen", "state": "unknown"}
    assert providers.starts == 0


@pytest.mark.asyncio
async def test_no_token_bad_token_and_other_principals_learn_nothing(
    tmp_path: Path, broker: NatsServer
) -> None:
    env = make_env(tmp_path)
    async with running_connector(env, broker.url) as assembled:
        async with client(broker.url, env.tokens["alice"]) as alice:
            await alice.start(ble_scan(30), op="mine")
            operation_id = (await alice.get("mine"))["operation/id"]

        async def raw(token: str | None, subject: str, op: str) -> bytes:
            async with client(broker.url, token) as bus:
                data = json.dumps({"op": op}).encode()
                headers = None if token is None else {"Authorization": f"Bearer {token}"}
                msg = await bus.nc.request(getattr(bus.subjects, subject), data, timeout=5, headers=headers)
                return bytes(msg.data)

        for subject in ("get", "cancel"):
            for token in (None, "not-a-token", env.tokens["ops"] + "x"):
                existing = await raw(token, subject, "mine")
                never = await raw(token, subject, "nope")
                assert existing == never.replace(b'"nope"', b'"mine"'), (subject, token)
                assert b"unauthenticated" in existing and b"running" not in existing
            for token in (env.tokens["bob"], env.tokens["ops"]):
                for op in ("mine", operation_id):
                    existing = await raw(token, subject, op)
                    assert json.loads(existing) == {"op": op, "state": "unknown"}, (subject, op)
        # Nobody else's cancel touched it, and bob's own "mine" is a different operation.
        async with client(broker.url, env.tokens["bob"]) as bob:
            await bob.start(ble_scan(1), op="mine")
            assert (await bob.get("mine"))["operation/id"] != operation_id
        async with client(broker.url, env.tokens["alice"]) as alice:
            assert (await alice.get("mine"))["state"] == "running"
            # A revoked grant hides the operation like any unknown one.
            assembled.service.principals.revoke_now("alice", SCAN)
            assert await alice.get("mine") == {"op": "mine", "state": "unknown"}


@pytest.mark.asyncio
async def test_healthz_waits_for_the_bus(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    server = NatsServer(tmp_path / "late-broker")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        server.port = probe.getsockname()[1]
    try:
        async with running_connector(env, server.url, wait_bus=False) as assembled:
            transport = httpx.ASGITransport(app=assembled.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                assert (await http.get("/healthz")).status_code == 503
                await anyio.to_thread.run_sync(server.start)
                await wait_until(lambda: assembled.readiness.bus_subscribed, timeout=15)
                assert (await http.get("/healthz")).status_code == 200
            async with client(server.url, env.tokens["alice"]) as bus:
                assert (await bus.start(ble_scan(1), op="late"))["state"] in ("queued", "running")
    finally:
        server.stop()


@pytest.mark.asyncio
async def test_a_retry_after_a_restart_joins_the_lost_operation(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    keyed = {**ble_scan(30), "idempotency_key": "key-1"}
    async with running_connector(env, broker.url), client(broker.url, env.tokens["alice"]) as bus:
        by_key = await bus.start(keyed)
        await bus.start(ble_scan(30), op="handle-1")
    providers = CountingProviders(env.config(broker.url))
    async with (
        running_connector(env, broker.url, providers=providers),
        client(broker.url, env.tokens["alice"]) as bus,
    ):
        # The connector forgot the scans; a retry must not start them again under the same ids.
        assert await bus.start(keyed) == {"op": by_key["op"], "state": "lost"}
        assert await bus.start(ble_scan(30), op="handle-1") == {"op": "handle-1", "state": "lost"}
        # A new key is new work.
        fresh = await bus.start({**ble_scan(1), "idempotency_key": "key-2"})
        assert fresh["state"] in ("queued", "running") and fresh["op"] != by_key["op"]
    assert providers.starts == 1


@pytest.mark.asyncio
async def test_an_unreachable_broker_delays_readiness_and_not_the_shutdown(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{probe.getsockname()[1]}"
    with anyio.fail_after(10):
        async with running_connector(env, url, wait_bus=False) as assembled:
            await anyio.sleep(1.5)  # real peer: a broker that never answers, retried meanwhile
            assert assembled.readiness.interrupted_marked and not assembled.readiness.bus_subscribed
            assert not assembled.readiness.ready
            # HTTP keeps working without the Bus.
            redact = command_directive(REDACT, input={"text": "a"})
            answer = await assembled.host.admit(assembled.host.authenticate(env.tokens["alice"]), redact)
            assert isinstance(answer, Accepted)


@pytest.mark.asyncio
async def test_a_handle_equal_to_an_http_idempotency_key_is_refused(
    tmp_path: Path, broker: NatsServer
) -> None:
    env = make_env(tmp_path)
    token = env.tokens["alice"]
    providers = CountingProviders(env.config(broker.url))
    async with (
        running_connector(env, broker.url, providers=providers) as assembled,
        client(broker.url, token) as bus,
    ):
        http = await assembled.host.admit(
            assembled.host.authenticate(token), {**ble_scan(30), "idempotency_key": "shared-1"}
        )
        assert isinstance(http, Accepted)
        with pytest.raises(BusRefused) as refused:
            await bus.start(ble_scan(30), op="shared-1")
        assert refused.value.code == "idempotency-conflict" and refused.value.reply["state"] == "running"
        assert await bus.get("shared-1") == {"op": "shared-1", "state": "unknown"}
    assert providers.starts == 1


def _with_input(directive: dict[str, Any], number: bytes) -> bytes:
    """An `op.start` request whose scan input carries `number` as written (not representable in Python)."""
    text = json.dumps({"op": "s-5", "directive": {**directive, "input": {**directive["input"], "n": 0}}})
    return text.replace('"n": 0', '"n": ' + number.decode()).encode()


@pytest.mark.asyncio
async def test_work_that_ended_during_admission_is_announced_once(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    deadline = format_time(wall_clock() + timedelta(seconds=5))  # cleanup 4 s + proof 1 s: no window
    no_window = scan_directive(30, timing={"deadline_at": deadline})
    async with spying(broker.url) as spy:
        async with (
            running_connector(env, broker.url) as assembled,
            client(broker.url, env.tokens["alice"]) as bus,
        ):
            assembled.host.port = EndsBeforeTheHostLooks(assembled.service)
            assert await bus.start(no_window, op="cut-1") == {"op": "cut-1", "state": "done"}
            failing = await bus.start(command_directive(FAIL), op="fail-1")
            assert failing == {"op": "fail-1", "state": "failed"}
            await wait_until(lambda: spy.done("cut-1") and spy.done("fail-1"))
            for op, status in (("cut-1", "completed"), ("fail-1", "failed")):
                record = await _record(assembled.registry, "alice", op)
                assert record.next_poll_at is None
                history = await assembled.registry.history(record.operation_id)
                assert [event.status for event in history] == ["pending", status]
        async with (
            running_connector(env, broker.url),
            client(broker.url, env.tokens["alice"]) as bus,
        ):
            # The restart's sweep runs before its announcer, so anything still owed would precede this one.
            await bus.start(command_directive(REDACT, input={"text": "x"}), op="marker-1")
            await wait_until(lambda: spy.done("marker-1"))
    assert [(d["state"], d["reason"]) for d in spy.done("cut-1")] == [("done", "deadline-reached")]
    assert [(d["state"], d["reason"]) for d in spy.done("fail-1")] == [("failed", "command-failed")]
