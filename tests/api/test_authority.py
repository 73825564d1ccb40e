"""CONTRACT §8 and 9: who may use which route. Every CONTRACT §9 route against no token, a bad token, another
principal, an operator and a revoked grant; other principals' operations look exactly like unknown ones;
a revocation ends running sessions `grant-revoked` with confirmed cleanup and invalidates candidates."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.runtime.session import DiscoverySession
from connector.storage.principals import principals_path, revoke
from tests.api.support import (
    CANARY,
    SCAN,
    Harness,
    RecordingFactory,
    assert_error,
    assert_valid,
    candidates_of,
    harness,
    straps,
)
from tests.runtime.sessions import metadata_of, status_of, until_terminal
from tests.support.directives import scan_directive
from tests.support.waiting import wait_until

Call = Callable[[httpx.AsyncClient, dict[str, str]], Awaitable[httpx.Response]]


@dataclass(frozen=True)
class Fixture:
    """A completed operation of alice, one of its candidates and a binding of another one."""

    op_id: str
    ref: str
    binding_id: str


def _routes(f: Fixture) -> dict[str, Call]:
    """Every CONTRACT §9 connector route, aimed at alice's things."""
    op = f"/v1/operations/{f.op_id}"
    bind_body = {"candidate/ref": f.ref, "idempotency_key": "matrix"}
    return {
        "status": lambda c, h: c.get(op, headers=h),
        "long poll": lambda c, h: c.get(op, params={"wait_seconds": 25, "after_revision": 99}, headers=h),
        "cancel": lambda c, h: c.post(op + "/cancel", headers=h),
        "select": lambda c, h: c.post(op + "/selection", json={"candidate/ref": f.ref}, headers=h),
        "bind": lambda c, h: c.post(op + "/bindings", json=bind_body, headers=h),
        "forget": lambda c, h: c.delete(f"/v1/bindings/{f.binding_id}", headers=h),
        "catalog": lambda c, h: c.get("/v1/catalog", headers=h),
        "admin revoke": lambda c, h: c.post("/v1/admin/principals/bob/revoke", headers=h),
    }


OPERATION_ROUTES = ("status", "long poll", "cancel", "select", "bind")


async def _completed_with_binding(h: Harness) -> Fixture:
    accepted = await h.invoke("alice", scan_directive(1))
    polls = await h.poll("alice", accepted.headers["location"])
    refs = [c["candidate/ref"] for c in candidates_of(polls[-1])]
    assert polls[-1]["status"] == "completed" and len(refs) == 2
    body = {"candidate/ref": refs[1], "idempotency_key": "setup"}
    bound = await h.post("alice", accepted.headers["location"] + "/bindings", body)
    assert bound.status_code == 201
    return Fixture(accepted.json()["connector_operation/id"], refs[0], bound.json()["binding/id"])


async def _unknown_bodies(h: Harness, who: str) -> dict[str, bytes]:
    """What the operation routes answer `who` for an id nobody ever saw, and for an unknown binding."""
    ghost = Fixture(random_operation_id(OPERATION_KIND, os.urandom(16)), "ref", "no-such-binding")
    routes = _routes(ghost)
    bodies = {name: (await routes[name](h.client, h.auth(who))).content for name in OPERATION_ROUTES}
    bodies["forget"] = (await routes["forget"](h.client, h.auth(who))).content
    return bodies


@pytest.mark.asyncio
async def test_authority_matrix(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        f = await _completed_with_binding(h)
        routes = _routes(f)

        for headers in ({}, {"Authorization": f"Bearer {CANARY}"}, {"Authorization": "Basic abc"}):
            for name, call in routes.items():
                response = await call(h.client, headers)
                assert_error(response, 401, "unauthenticated")
                assert CANARY not in response.text, name

        unknown = await _unknown_bodies(h, "bob")
        for name in OPERATION_ROUTES:
            started = time.monotonic()
            response = await routes[name](h.client, h.auth("bob"))
            assert_error(response, 404, "unknown-operation")
            assert response.content == unknown[name], name  # no existence leak
            assert time.monotonic() - started < 10, name  # a refused long poll does not wait (W = 25 s)
        forget = await routes["forget"](h.client, h.auth("bob"))
        assert_error(forget, 404, "unknown-binding")
        assert forget.content == unknown["forget"]
        assert (await routes["catalog"](h.client, h.auth("bob"))).status_code == 200
        assert_error(await routes["admin revoke"](h.client, h.auth("bob")), 403, "forbidden")
        assert_error(await routes["admin revoke"](h.client, h.auth("alice")), 403, "forbidden")

        # Operators see no snapshots and cannot select or bind: the caller routes treat them as strangers.
        for name in OPERATION_ROUTES:
            assert_error(await routes[name](h.client, h.auth("root")), 404, "unknown-operation")

        # Nothing above changed alice's view.
        assert (await routes["status"](h.client, h.auth("alice"))).json()["status"] == "completed"
        assert (await routes["select"](h.client, h.auth("alice"))).status_code == 200


@pytest.mark.asyncio
async def test_a_revoked_grant_closes_every_route(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        f = await _completed_with_binding(h)
        routes = _routes(f)
        unknown = await _unknown_bodies(h, "alice")
        revoked = await h.client.post(
            f"/v1/admin/principals/alice/revoke?action_id={SCAN}", headers=h.auth("root")
        )
        assert revoked.status_code == 200
        assert revoked.json() == {
            "principal/id": "alice",
            "revoked": "grant",
            "action_id": SCAN,
            "revoked_actions": [SCAN],
        }
        for name in OPERATION_ROUTES:
            response = await routes[name](h.client, h.auth("alice"))
            assert_error(response, 404, "unknown-operation")
            assert response.content == unknown[name], name
        assert_error(await h.invoke("alice", scan_directive(1)), 403, "forbidden")
        assert (await routes["catalog"](h.client, h.auth("alice"))).status_code == 200
        assert_error(await routes["admin revoke"](h.client, h.auth("alice")), 403, "forbidden")
        # Erasing one's own binding needs no grant.
        assert (await routes["forget"](h.client, h.auth("alice"))).status_code == 204


@pytest.mark.asyncio
async def test_a_revoked_principal_authenticates_no_more(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        f = await _completed_with_binding(h)
        revoke(h.data_dir, "alice")  # `principals revoke` edits the file; the server picks it up
        for call in _routes(f).values():
            assert_error(await call(h.client, h.auth("alice")), 401, "unauthenticated")


@pytest.mark.asyncio
async def test_admin_revoke_answers_spec_codes(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory()) as h:
        for path in (
            f"/v1/admin/principals/{CANARY}/revoke",
            "/v1/admin/principals/bob/revoke?action_id=no.such.grant",
        ):
            response = await h.client.post(path, headers=h.auth("root"))
            assert_error(response, 404, "not-found")
            assert CANARY not in response.text
        assert (
            await h.client.post("/v1/admin/principals/bob/revoke", headers=h.auth("root"))
        ).status_code == 200
        assert_error(await h.client.get("/v1/catalog", headers=h.auth("bob")), 401, "unauthenticated")


async def _running_scan(h: Harness, who: str = "alice") -> tuple[str, str]:
    accepted = await h.invoke(who, scan_directive(20))
    location = accepted.headers["location"]
    await h.poll(who, location, lambda d: d["status"] == "running" and bool(candidates_of(d)))
    return accepted.json()["connector_operation/id"], location


async def _assert_ended_by_revocation(h: Harness, factory: RecordingFactory, op_id: str) -> None:
    await until_terminal(h.assembled.discovery, op_id, 5.0)
    metadata = metadata_of(h.assembled.discovery, op_id)
    assert metadata["status"] == "failed" and metadata["error_code"] == "grant-revoked"
    assert metadata["cleanup"] == {"state": "confirmed", "claim": "released"}
    assert factory.acknowledged_stops == 1
    # The exclusive claim was released: another principal's scan on the same transport is admitted.
    assert (await h.invoke("bob", scan_directive(1))).status_code == 202


@pytest.mark.asyncio
async def test_admin_revoke_ends_a_running_session_with_confirmed_cleanup(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(2), concurrent=False)
    async with harness(tmp_path, factory=factory) as h:
        op_id, location = await _running_scan(h)
        response = await h.client.post(
            f"/v1/admin/principals/alice/revoke?action_id={SCAN}", headers=h.auth("root")
        )
        assert response.status_code == 200
        assert_error(await h.get("alice", location), 404, "unknown-operation")
        await _assert_ended_by_revocation(h, factory, op_id)


@pytest.mark.asyncio
async def test_a_principals_file_reload_ends_a_running_session(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(2), concurrent=False)
    async with harness(tmp_path, factory=factory) as h:
        op_id, location = await _running_scan(h)
        revoke(h.data_dir, "alice", SCAN)
        # Any request makes the server notice the edited file; here it is someone else's.
        assert (await h.client.get("/v1/catalog", headers=h.auth("bob"))).status_code == 200
        assert_error(await h.get("alice", location), 404, "unknown-operation")
        await _assert_ended_by_revocation(h, factory, op_id)


@pytest.mark.asyncio
async def test_the_principals_watch_needs_no_request(tmp_path: Path) -> None:
    factory = RecordingFactory(straps(2), concurrent=False)
    async with harness(tmp_path, factory=factory) as h:
        op_id, _ = await _running_scan(h)
        async with anyio.create_task_group() as group:
            group.start_soon(h.assembled.service.watch_principals, 0.05)
            revoke(h.data_dir, "alice", SCAN)
            await wait_until(lambda: _session(h, op_id).status.value == "failed")
            group.cancel_scope.cancel()
        await _assert_ended_by_revocation(h, factory, op_id)


def _restore_grant(data_dir: Path, principal_id: str, action_id: str) -> None:
    """Give a grant back by editing the file (atomic replace, as every writer does)."""
    path = principals_path(data_dir)
    document = json.loads(path.read_text(encoding="utf-8"))
    for entry in document["principals"]:
        if entry["id"] == principal_id:
            entry["grants"].append({"action_id": action_id})
    temp = path.with_name(".restore.tmp")
    temp.write_text(json.dumps(document), encoding="utf-8")
    temp.replace(path)


@pytest.mark.asyncio
async def test_a_later_regrant_does_not_revive_old_candidates(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        f = await _completed_with_binding(h)
        revoke(h.data_dir, "alice", SCAN)
        assert (await h.client.get("/v1/catalog", headers=h.auth("alice"))).status_code == 200
        _restore_grant(h.data_dir, "alice", SCAN)
        routes = _routes(f)
        # The operation is visible again, but its result was erased by the revocation.
        status = (await routes["status"](h.client, h.auth("alice"))).json()
        assert status["status"] == "completed" and "progress" not in status
        assert status["result"]["candidates"] == [] and "erased_at" in status["result"]
        assert_valid("deferred-operation-status.v2", status)
        assert_error(await routes["select"](h.client, h.auth("alice")), 404, "unknown-candidate")
        assert_error(await routes["bind"](h.client, h.auth("alice")), 404, "unknown-candidate")
        # The grant itself is back: new work is admitted.
        assert (await h.invoke("alice", scan_directive(1))).status_code == 202


@pytest.mark.asyncio
async def test_a_revocation_erases_completed_candidates_in_the_runtime(tmp_path: Path) -> None:
    async with harness(tmp_path, factory=RecordingFactory(straps(2), concurrent=True)) as h:
        f = await _completed_with_binding(h)
        h.assembled.discovery.revoke_owner("alice", action_id=SCAN)
        assert candidates_of(await status_of(h.assembled.discovery, f.op_id)) == []
        assert _session(h, f.op_id).table.candidate_document(f.ref) is None


def _session(h: Harness, op_id: str) -> DiscoverySession:
    session = h.assembled.discovery.session(op_id)
    assert session is not None
    return session
