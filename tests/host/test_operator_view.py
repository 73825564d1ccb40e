"""One operator view (CONTRACT §9, §11): the admin list holds every operation the console shows.

Scans and commands admitted on the connector routes (`POST /v1/directives`) are listed, shown and cancelled
by an operator exactly like the host's, newest first, a page at a time with a cursor, with the console's
columns; bad query parameters are refused naming the parameter, never its value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connector.core.clock import parse_time
from tests.host.support import add_principals, host_app, poll_until
from tests.support.directives import scan_directive
from tests.support.principals import bearer

pytestmark = pytest.mark.asyncio
ADMIN = "/v1/admin/deferred-operations"
COLUMNS = ("action", "transport", "window_seconds", "adapter", "outcome", "route")


async def _pages(client: Any, token: str, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of the listing, following `next_after` until it is absent."""
    pages, params = [], {"limit": str(limit)}
    while True:
        answer = await client.get(ADMIN, params=params, headers=bearer(token))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["operations"]) <= limit
        pages.append(body["operations"])
        if "next_after" not in body:
            return pages
        params = {"limit": str(limit), "after": body["next_after"]}


async def test_a_connector_route_scan_is_listed_shown_and_cancelled_by_an_operator(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (_, client):
        hosted = await client.post(
            "/v1/host/directives", json=scan_directive(30), headers=bearer(tokens.alice)
        )
        direct = await client.post("/v1/directives", json=scan_directive(30), headers=bearer(tokens.bob))
        assert hosted.status_code == 202 and direct.status_code == 202
        direct_id = direct.json()["connector_operation/id"]
        listing = (await client.get(ADMIN, headers=bearer(tokens.operator))).json()["operations"]
        by_id = {row["operation/id"]: row for row in listing}
        assert set(by_id) == {hosted.json()["operation/id"], direct_id}
        row = by_id[direct_id]
        assert row["route"] == "connector" and by_id[hosted.json()["operation/id"]]["route"] == "host"
        assert {key: row[key] for key in COLUMNS[:4]} == {
            "action": "device.discovery.scan",
            "transport": "ble",
            "window_seconds": 30,
            "adapter": "default",
        }
        assert row["cancelable"] is True and row["owner"] == "bob"
        assert listing[0]["created_at"] >= listing[1]["created_at"]  # newest first
        detail = await client.get(f"{ADMIN}/{direct_id}", headers=bearer(tokens.operator))
        assert detail.status_code == 200 and detail.json()["history"] == []
        cancel = await client.post(f"{ADMIN}/{direct_id}/cancel", headers=bearer(tokens.operator))
        assert cancel.status_code == 200, cancel.text
        ended = await poll_until(
            client,
            f"/v1/operations/{direct_id}",
            tokens.bob,
            lambda body: body["status"] not in ("pending", "running"),
        )
        assert ended[-1]["status"] == "cancelled"
        after = (await client.get(f"{ADMIN}/{direct_id}", headers=bearer(tokens.operator))).json()
        assert after["operation"]["status"] == "cancelled" and after["operation"]["cancelable"] is False
        text = json.dumps(listing)
        assert '"candidates"' not in text and '"progress"' not in text


async def test_the_listing_pages_newest_first_with_a_cursor(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (_, client):
        admitted = []
        for n in range(5):
            route = "/v1/host/directives" if n % 2 else "/v1/directives"
            answer = await client.post(route, json=scan_directive(30), headers=bearer(tokens.alice))
            assert answer.status_code == 202, answer.text
            body = answer.json()
            admitted.append(body.get("operation/id") or body["connector_operation/id"])
        pages = await _pages(client, tokens.operator, limit=2)
        assert [len(page) for page in pages] == [2, 2, 1]
        rows = [row for page in pages for row in page]
        assert sorted(row["operation/id"] for row in rows) == sorted(admitted)
        # By time, not by text: a connector route's created_at has whole seconds ("...:35Z" is older than
        # "...:35.098Z", yet sorts after it as a string); a run that crossed a second boundary showed it.
        keys = [(parse_time(row["created_at"]), row["operation/id"]) for row in rows]
        assert keys == sorted(keys, reverse=True)
        whole = await _pages(client, tokens.operator, limit=200)
        assert [row["operation/id"] for row in whole[0]] == [row["operation/id"] for row in rows]


@pytest.mark.parametrize(
    ("params", "path"),
    [({"limit": "201"}, "limit"), ({"limit": "0"}, "limit"), ({"after": "not-a-cursor!"}, "after")],
)
async def test_bad_query_parameters_are_refused_by_name(
    tmp_path: Path, params: dict[str, str], path: str
) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (_, client):
        answer = await client.get(ADMIN, params=params, headers=bearer(tokens.operator))
        assert answer.status_code == 422 and answer.json()["code"] == "invalid-input"
        assert any(path in d["message"] for d in answer.json()["diagnostics"])
        assert "not-a-cursor" not in answer.text
