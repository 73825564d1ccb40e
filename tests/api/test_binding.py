"""CONTRACT §6.8 and 14: binding needs confirmed termination, consumes a candidate exactly once, and a
forgotten
binding is erased; the bindings table holds no candidate ref or label."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.errors import ProviderRestarted
from providers.faults import Fault
from tests.api.support import (
    HEART_RATE_LAB,
    REDACT,
    Harness,
    RecordingFactory,
    add_test_principals,
    assert_error,
    assert_valid,
    candidates_of,
    files_bytes,
    harness,
    query,
    straps,
)
from tests.support.clocks import OffsetClock
from tests.support.directives import command_directive, scan_directive
from tests.support.serving import serving


async def _completed(h: Harness, who: str = "alice", window: int = 1) -> tuple[str, list[dict[str, Any]]]:
    """A completed scan of `who`: its location and result candidates."""
    location = (await h.invoke(who, scan_directive(window))).headers["location"]
    final = (await h.poll(who, location))[-1]
    assert final["status"] == "completed"
    return location, candidates_of(final)


async def _bind(h: Harness, location: str, ref: str, key: str, who: str = "alice") -> Any:
    return await h.post(who, location + "/bindings", {"candidate/ref": ref, "idempotency_key": key})


@pytest.mark.asyncio
async def test_binding_waits_for_confirmed_termination(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        location = (await h.invoke("alice", scan_directive(20))).headers["location"]
        running = (await h.poll("alice", location, lambda d: bool(candidates_of(d))))[-1]
        ref = candidates_of(running)[0]["candidate/ref"]
        refused = await _bind(h, location, ref, "early")
        assert_error(refused, 409, "session-not-terminated")
        assert refused.headers["retry-after"] == "1"
        # A refusal consumed nothing: the candidate is still selectable.
        assert (await h.post("alice", location + "/selection", {"candidate/ref": ref})).status_code == 200
        cancelled = await h.post("alice", location + "/cancel")
        assert cancelled.status_code == 200
        final = (await h.poll("alice", location))[-1]
        assert final["status"] == "cancelled"
        assert_error(await _bind(h, location, ref, "late"), 409, "not-bindable")


@pytest.mark.asyncio
async def test_a_failed_session_is_never_bindable(tmp_path: Path) -> None:
    # The failure comes well after the first poll that shows the straps, however loaded the machine.
    fault = Fault(fail_at_ms=3000, fail_error=ProviderRestarted("adapter restarted"))
    async with harness(tmp_path, factory=RecordingFactory(straps(2), fault=fault)) as h:
        location = (await h.invoke("alice", scan_directive(5))).headers["location"]
        running = (await h.poll("alice", location, lambda d: bool(candidates_of(d))))[-1]
        ref = candidates_of(running)[0]["candidate/ref"]
        final = (await h.poll("alice", location))[-1]
        assert (final["status"], final["error"]["code"]) == ("failed", "provider-restarted")
        assert_error(await _bind(h, location, ref, "k"), 409, "not-bindable")


@pytest.mark.asyncio
async def test_an_expired_candidate_cannot_be_bound(tmp_path: Path) -> None:
    clock = OffsetClock()
    async with harness(tmp_path, factory=RecordingFactory(straps(2)), clock=clock) as h:
        location, candidates = await _completed(h)
        clock.offset = timedelta(seconds=31)  # past last_seen_at + candidate_ttl_seconds (30)
        assert_error(await _bind(h, location, candidates[0]["candidate/ref"], "k"), 410, "candidate-expired")
        clock.offset = timedelta()
        assert (await _bind(h, location, candidates[0]["candidate/ref"], "k")).status_code == 201


@pytest.mark.asyncio
async def test_unknown_consumed_and_conflicting_candidates(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        location, candidates = await _completed(h)
        first, second = (c["candidate/ref"] for c in candidates)
        assert_error(await _bind(h, location, "no-such-ref", "k0"), 404, "unknown-candidate")
        selection = await h.post("alice", location + "/selection", {"candidate/ref": "no-such-ref"})
        assert_error(selection, 404, "unknown-candidate")

        bound = await _bind(h, location, first, "k1")
        assert bound.status_code == 201
        assert_valid("sensorium-device-binding.v1", bound.json())
        retry = await _bind(h, location, first, "k1")
        assert (retry.status_code, retry.content) == (201, bound.content)
        assert_error(await _bind(h, location, first, "k2"), 409, "candidate-consumed")
        assert_error(await _bind(h, location, second, "k1"), 409, "idempotency-conflict")
        for body in (
            {"candidate/ref": first},
            {"idempotency_key": "k"},
            {"candidate/ref": first, "x": 1, "idempotency_key": "k"},
        ):
            assert_error(await h.post("alice", location + "/bindings", body), 422, "invalid-input")
        assert len(query(h.data_dir, "SELECT * FROM bindings")) == 1


@pytest.mark.asyncio
async def test_concurrent_binds_consume_exactly_once(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        location, candidates = await _completed(h)
        ref = candidates[0]["candidate/ref"]
        responses = await asyncio.gather(*(_bind(h, location, ref, f"key-{i}") for i in range(20)))
        codes = sorted(r.status_code for r in responses)
        assert codes == [201] + [409] * 19
        assert all(r.json()["code"] == "candidate-consumed" for r in responses if r.status_code == 409)
        # The same key from many callers at once: one binding, the same answer for all.
        other = candidates[1]["candidate/ref"]
        same_key = await asyncio.gather(*(_bind(h, location, other, "one-key") for _ in range(10)))
        assert {r.status_code for r in same_key} == {201}
        assert len({r.content for r in same_key}) == 1
        assert len(query(h.data_dir, "SELECT * FROM bindings")) == 2


@pytest.mark.asyncio
async def test_forget_erases_and_only_for_the_owner_or_an_operator(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        location, candidates = await _completed(h)
        mine = (await _bind(h, location, candidates[0]["candidate/ref"], "a")).json()
        other = (await _bind(h, location, candidates[1]["candidate/ref"], "b")).json()
        path = f"/v1/bindings/{mine['binding/id']}"
        assert_error(await h.client.delete(path, headers=h.auth("bob")), 404, "unknown-binding")
        assert (await h.client.delete(path, headers=h.auth("alice"))).status_code == 204
        assert_error(await h.client.delete(path, headers=h.auth("alice")), 404, "unknown-binding")
        # A retry of the first bind after forgetting does not bring the address back.
        replay = await _bind(h, location, candidates[0]["candidate/ref"], "a")
        assert_error(replay, 409, "candidate-consumed")
        assert mine["address"] not in replay.text
        operator = await h.client.delete(f"/v1/bindings/{other['binding/id']}", headers=h.auth("root"))
        assert operator.status_code == 204
        assert query(h.data_dir, "SELECT * FROM bindings") == []
        # Concurrent forgets of one binding: exactly one erases it.
        third_location, third = await _completed(h, "bob")
        bound = (await _bind(h, third_location, third[0]["candidate/ref"], "c", who="bob")).json()
        forgets = await asyncio.gather(
            *(h.client.delete(f"/v1/bindings/{bound['binding/id']}", headers=h.auth("bob")) for _ in range(5))
        )
        assert sorted(r.status_code for r in forgets) == [204, 404, 404, 404, 404]


@pytest.mark.asyncio
async def test_the_bindings_table_holds_no_ref_or_label(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        location, candidates = await _completed(h)
        candidate = candidates[0]
        binding = (await _bind(h, location, candidate["candidate/ref"], "k")).json()
        await h.assembled.state.checkpoint()
        rows = query(h.data_dir, "SELECT * FROM bindings")
        assert rows == [(binding["binding/id"], "alice", "ble", binding["address"], rows[0][4])]
        stored = files_bytes(h.data_dir)
        assert candidate["candidate/ref"].encode() not in stored
        assert candidate["label"].encode() not in stored
        assert binding["address"].encode() in stored  # the one durable exception, until forgotten
        forgotten = await h.client.delete(f"/v1/bindings/{binding['binding/id']}", headers=h.auth("alice"))
        assert forgotten.status_code == 204
        assert binding["address"].encode() not in files_bytes(h.data_dir)


@pytest.mark.asyncio
async def test_a_keyed_retry_after_a_restart_answers_the_same_binding(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        location, candidates = await _completed(h)
        ref, other_ref = candidates[0]["candidate/ref"], candidates[1]["candidate/ref"]
        first = await _bind(h, location, ref, "bind-1")
        assert first.status_code == 201
        tokens = h.tokens
    # The restart loses every in-memory book (a kill -9 loses them the same way); the binding row stays.
    async with harness(tmp_path, factory=RecordingFactory(), tokens=tokens) as h:
        retry = await _bind(h, location, ref, "bind-1")
        assert retry.status_code == 201, retry.text
        assert_valid("sensorium-device-binding.v1", retry.json())
        same = ("binding/id", "operation/id", "candidate/ref", "transport", "bound_at", "address")
        assert {k: retry.json()[k] for k in same} == {k: first.json()[k] for k in same}
        # Another key or another principal finds nothing: the candidates are gone.
        assert_error(await _bind(h, location, ref, "bind-2"), 404, "unknown-candidate")
        # The key alone finds the binding: no ref, nor any digest of one, is stored (CONTRACT §6.6), so the
        # retry is not compared with the first ref, as a keyed directive repeat after a restart is not
        # compared with the first directive (CONTRACT §4). It can bind nothing new: it answers that binding.
        reused = await _bind(h, location, other_ref, "bind-1")
        assert reused.status_code == 201 and reused.json()["binding/id"] == first.json()["binding/id"]
        assert_error(await _bind(h, location, ref, "bind-1", who="bob"), 404, "unknown-operation")
        assert len((await h.get("alice", "/v1/bindings")).json()["bindings"]) == 1
        # Forgotten, the binding takes its retry digest with it.
        gone = await h.client.delete(f"/v1/bindings/{first.json()['binding/id']}", headers=h.auth("alice"))
        assert gone.status_code == 204
        assert query(h.data_dir, "SELECT * FROM binding_replays") == []
        assert_error(await _bind(h, location, ref, "bind-1"), 404, "unknown-candidate")
        assert first.json()["address"].encode() not in files_bytes(h.data_dir)
        stored = files_bytes(h.data_dir)
        assert ref.encode() not in stored and other_ref.encode() not in stored


@pytest.mark.realtime  # a command subprocess
@pytest.mark.asyncio
async def test_command_operations_have_nothing_to_bind_or_select(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(), wall=True) as h:
        location = (await h.invoke("alice", command_directive(REDACT, "async", {"text": "x"}))).headers[
            "location"
        ]
        assert_error(await _bind(h, location, "ref", "k"), 409, "not-bindable")
        assert_error(
            await h.post("alice", location + "/selection", {"candidate/ref": "ref"}), 404, "unknown-candidate"
        )


def _bind_over_http(client: httpx.Client, location: str, ref: str) -> httpx.Response:
    return client.post(location + "/bindings", json={"candidate/ref": ref, "idempotency_key": "bind-k9"})


@pytest.mark.serve
@pytest.mark.realtime  # serve processes and kill -9
@pytest.mark.timeout(120)
def test_a_keyed_bind_retry_after_a_kill_9_answers_the_same_binding(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = add_test_principals(data)
    replay = ("--replay", f"ble={HEART_RATE_LAB}", "--replay-speed", "10")
    with serving("--data-dir", data, *replay, log=tmp_path / "first.log") as server:
        with server.client(tokens["alice"]) as client:
            location = client.post("/v1/directives", json=scan_directive(2)).headers["location"]
            deadline = time.monotonic() + 30
            while (final := client.get(location).json())["status"] in ("pending", "running"):
                assert time.monotonic() < deadline
                time.sleep(0.1)  # real peer: the scan runs on the server's own clock
            assert final["status"] == "completed"
            ref = candidates_of(final)[0]["candidate/ref"]
            first = _bind_over_http(client, location, ref)
            assert first.status_code == 201, first.text
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
    with (
        serving("--data-dir", data, *replay, log=tmp_path / "second.log") as again,
        again.client(tokens["alice"]) as client,
    ):
        retry = _bind_over_http(client, location, ref)
        assert retry.status_code == 201, retry.text
        assert retry.json()["binding/id"] == first.json()["binding/id"]
        assert retry.json()["address"] == first.json()["address"]
        listed = client.get("/v1/bindings").json()["bindings"]
        assert [b["binding/id"] for b in listed] == [first.json()["binding/id"]]
