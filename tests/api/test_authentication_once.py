"""Each HTTP request authenticates its bearer token once (CONTRACT §2 step 1, §8), whatever it calls below."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter

from connector.api.console import console_router
from connector.api.host_routes import host_router
from connector.assembly import Assembled, ConnectorConfig, assemble
from tests.api.console.conftest import csrf_of
from tests.api.support import assert_error, candidates_of
from tests.host.support import add_principals
from tests.support.directives import scan_directive
from tests.support.paths import HW_FIXTURES, REPO
from tests.support.principals import Tokens, bearer
from tests.support.waiting import poll

pytestmark = pytest.mark.asyncio
TERMINAL = frozenset({"completed", "failed", "timed-out", "cancelled", "expired", "unknown"})


@dataclass(slots=True)
class Edges:
    """The connector routes, the host routes and the console on one app, and who may call them."""

    assembled: Assembled
    client: httpx.AsyncClient
    tokens: Tokens

    async def once(self, request: Awaitable[httpx.Response]) -> httpx.Response:
        """The response of one request, which checked exactly one bearer token."""
        before = self.assembled.service.authentications
        response = await request
        assert self.assembled.service.authentications - before == 1, response.text
        return response

    async def until(self, who: str, path: str, done: Any) -> dict[str, Any]:
        """The first status of `path` for which `done` holds (the polls are not counted)."""

        async def get() -> dict[str, Any]:
            document: dict[str, Any] = (await self.client.get(path, headers=bearer(self.tokens[who]))).json()
            return document

        polls: list[dict[str, Any]] = await poll(get, done, timeout=15.0)
        return polls[-1]


@asynccontextmanager
async def edges(tmp_path: Path) -> AsyncIterator[Edges]:
    """An assembled connector with the host routes and the console, replaying the BLE lab fixture."""
    tokens = add_principals(tmp_path)
    config = ConnectorConfig(
        data_dir=tmp_path,
        catalog=REPO / "catalog" / "actions.json",
        trust_dir=REPO / "catalog" / "trust",
        replay={"ble": HW_FIXTURES / "ble-heart-rate-lab.jsonl"},
        replay_speed=20.0,
        host_poller=False,
    )

    def routers(assembled: Assembled) -> list[APIRouter]:
        console = console_router(assembled.host, authenticate=assembled.service.authenticate)
        return [host_router(assembled.host), console]

    async with assemble(config, routers=routers) as assembled:
        transport = httpx.ASGITransport(app=assembled.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8787") as client:
            yield Edges(assembled, client, tokens)


async def test_the_connector_routes_authenticate_once(tmp_path: Path) -> None:
    async with edges(tmp_path) as e:
        alice = bearer(e.tokens.alice)
        accepted = await e.once(e.client.post("/v1/directives", json=scan_directive(30), headers=alice))
        assert accepted.status_code == 202
        location = accepted.headers["location"]
        assert (await e.once(e.client.get(location, headers=alice))).status_code == 200
        waited = e.client.get(location, params={"wait_seconds": 5, "after_revision": 0}, headers=alice)
        assert (
            await e.once(waited)
        ).status_code == 200  # a long poll: its re-check after the wait is no login
        running = await e.until("alice", location, lambda d: bool(candidates_of(d)))
        ref = candidates_of(running)[0]["candidate/ref"]
        selection = {"candidate/ref": ref}
        selected = await e.once(e.client.post(location + "/selection", json=selection, headers=alice))
        assert selected.status_code == 200
        assert (await e.once(e.client.post(location + "/cancel", headers=alice))).status_code == 200
        assert (await e.once(e.client.get("/v1/catalog", headers=alice))).status_code == 200


async def test_binding_listing_forgetting_and_revoking_authenticate_once(tmp_path: Path) -> None:
    async with edges(tmp_path) as e:
        alice = bearer(e.tokens.alice)
        location = (await e.client.post("/v1/directives", json=scan_directive(1), headers=alice)).headers[
            "location"
        ]
        final = await e.until("alice", location, lambda d: d["status"] in TERMINAL)
        assert final["status"] == "completed"
        bind = {"candidate/ref": candidates_of(final)[0]["candidate/ref"], "idempotency_key": "once-1"}
        bound = await e.once(e.client.post(location + "/bindings", json=bind, headers=alice))
        assert bound.status_code == 201
        assert (await e.once(e.client.get("/v1/bindings", headers=alice))).status_code == 200
        binding = bound.json()["binding/id"]
        assert (await e.once(e.client.delete(f"/v1/bindings/{binding}", headers=alice))).status_code == 204
        revoke = e.client.post(
            "/v1/admin/principals/bob/revoke",
            params={"action_id": "sensorium.os.info"},
            headers=bearer(e.tokens.operator),
        )
        assert (await e.once(revoke)).status_code == 200


async def test_the_host_routes_and_the_admin_views_authenticate_once(tmp_path: Path) -> None:
    async with edges(tmp_path) as e:
        alice, operator = bearer(e.tokens.alice), bearer(e.tokens.operator)
        admitted = await e.once(e.client.post("/v1/host/directives", json=scan_directive(30), headers=alice))
        assert admitted.status_code == 202
        status_href, op_id = admitted.json()["status_href"], admitted.json()["operation/id"]
        assert (await e.once(e.client.get(status_href, headers=alice))).status_code == 200
        cancel = e.client.post(f"/v1/host/operations/{op_id}/cancel", headers=alice)
        assert (await e.once(cancel)).status_code == 200
        admin = "/v1/admin/deferred-operations"
        assert (await e.once(e.client.get(admin, headers=operator))).status_code == 200
        assert (await e.once(e.client.get(f"{admin}/{op_id}", headers=operator))).status_code == 200
        assert (await e.once(e.client.post(f"{admin}/{op_id}/poll", headers=operator))).status_code == 200
        assert (await e.once(e.client.post(f"{admin}/{op_id}/cancel", headers=operator))).status_code == 200


async def test_the_console_authenticates_once_per_page(tmp_path: Path) -> None:
    async with edges(tmp_path) as e:
        alice = bearer(e.tokens.alice)
        admitted = await e.client.post("/v1/host/directives", json=scan_directive(30), headers=alice)
        op_id = admitted.json()["operation/id"]
        form = await e.client.get("/admin/sign-in")
        sign_in = {"csrf_token": csrf_of(form.text), "token": e.tokens.operator}
        assert (await e.once(e.client.post("/admin/sign-in", data=sign_in))).status_code == 303
        listing = await e.once(e.client.get("/admin/deferred-operations"))
        assert listing.status_code == 200
        detail = await e.once(e.client.get(f"/admin/deferred-operations/{op_id}"))
        assert detail.status_code == 200
        poll_now = {"csrf_token": csrf_of(detail.text)}
        posted = e.client.post(f"/admin/deferred-operations/{op_id}/poll", data=poll_now)
        assert (await e.once(posted)).status_code == 303


async def test_a_refused_token_is_one_authentication_and_the_body_is_never_read(tmp_path: Path) -> None:
    async with edges(tmp_path) as e:
        wrong = bearer("not-a-token")
        for path in ("/v1/directives", "/v1/host/directives"):
            refused = await e.once(e.client.post(path, content=b"{not json", headers=wrong))
            assert_error(refused, 401, "unauthenticated")  # step 1 before the body: not `invalid-json`
        some = "deferred:sensorium.directive.invoke:" + "Q" * 26
        for path in (f"/v1/operations/{some}/selection", f"/v1/operations/{some}/bindings"):
            assert_error(
                await e.once(e.client.post(path, content=b"[", headers=wrong)), 401, "unauthenticated"
            )
