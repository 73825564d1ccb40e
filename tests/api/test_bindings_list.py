"""GET /v1/bindings (CONTRACT §9): a caller lists its own bindings with addresses; an operator every binding
with
its owner and without address; a forgotten binding leaves the list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.storage.state import Binding
from tests.api.support import Harness, RecordingFactory, assert_error, candidates_of, harness, straps
from tests.support.directives import scan_directive


async def _bound(h: Harness, who: str, key: str) -> dict[str, Any]:
    location = (await h.invoke(who, scan_directive(1))).headers["location"]
    final = (await h.poll(who, location))[-1]
    assert final["status"] == "completed"
    ref = candidates_of(final)[0]["candidate/ref"]
    answer = await h.post(who, location + "/bindings", {"candidate/ref": ref, "idempotency_key": key})
    assert answer.status_code == 201
    body: dict[str, Any] = answer.json()
    return body


@pytest.mark.asyncio
async def test_callers_see_their_own_bindings_with_addresses(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        assert (await h.get("alice", "/v1/bindings")).json() == {"bindings": []}
        alices = await _bound(h, "alice", "a1")
        bobs = await _bound(h, "bob", "b1")
        listed = (await h.get("alice", "/v1/bindings")).json()["bindings"]
        assert listed == [
            {
                "binding/id": alices["binding/id"],
                "transport": "ble",
                "bound_at": alices["bound_at"],
                "address": alices["address"],
            }
        ]
        assert [b["binding/id"] for b in (await h.get("bob", "/v1/bindings")).json()["bindings"]] == [
            bobs["binding/id"]
        ]
        # carol has a grant on mdns only, and no bindings: an empty list, not a refusal.
        assert (await h.get("carol", "/v1/bindings")).json() == {"bindings": []}


@pytest.mark.asyncio
async def test_an_operator_sees_every_binding_with_owner_and_without_address(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        alices = await _bound(h, "alice", "a1")
        bobs = await _bound(h, "bob", "b1")
        listed = (await h.get("root", "/v1/bindings")).json()["bindings"]
        assert {(b["binding/id"], b["owner"]) for b in listed} == {
            (alices["binding/id"], "alice"),
            (bobs["binding/id"], "bob"),
        }
        assert all("address" not in b for b in listed)
        assert alices["address"] not in (await h.get("root", "/v1/bindings")).text


@pytest.mark.asyncio
async def test_a_forgotten_binding_leaves_the_list(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2))) as h:
        bound = await _bound(h, "alice", "a1")
        forgotten = await h.client.delete(f"/v1/bindings/{bound['binding/id']}", headers=h.auth("alice"))
        assert forgotten.status_code == 204
        assert (await h.get("alice", "/v1/bindings")).json() == {"bindings": []}
        assert (await h.get("root", "/v1/bindings")).json() == {"bindings": []}


@pytest.mark.asyncio
async def test_listing_needs_a_token(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(1))) as h:
        assert_error(await h.client.get("/v1/bindings"), 401, "unauthenticated")
        assert_error(await h.get("nobody-token", "/v1/bindings"), 401, "unauthenticated")


@pytest.mark.asyncio
async def test_parallel_forgets_beside_readers_never_answer_500(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        state = h.assembled.state
        now = h.clock()
        ids = [f"binding-{i:02d}" for i in range(64)]
        for number, binding_id in enumerate(ids):
            address = f"02:00:5E:10:00:{number:02X}"
            await state.insert_binding(Binding(binding_id, "alice", "ble", address, now))
        answers: list[int] = []

        async def forget(binding_id: str) -> None:
            gone = await h.client.delete(f"/v1/bindings/{binding_id}", headers=h.auth("alice"))
            answers.append(gone.status_code)

        async def read() -> None:
            for _ in range(8):
                answers.append((await h.get("alice", "/v1/bindings")).status_code)

        async with anyio.create_task_group() as group:
            for binding_id in ids:
                group.start_soon(forget, binding_id)
                group.start_soon(read)
        assert sorted(set(answers)) == [200, 204] and answers.count(204) == len(ids)
        assert (await h.get("alice", "/v1/bindings")).json() == {"bindings": []}
