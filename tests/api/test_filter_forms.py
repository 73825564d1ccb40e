"""One filter language over HTTP (CONTRACT §6.1): short and upper-case UUIDs are one scope with their
canonical form, so a keyed repeat in another spelling joins the same operation and every view shows the
lowercase 128-bit UUID; an unknown filter key is named in the refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.host.support import add_principals, host_app
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.principals import bearer

pytestmark = pytest.mark.asyncio


async def test_a_short_uuid_is_admitted_as_its_canonical_form(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (_, client):
        first = await client.post(
            "/v1/directives",
            json=scan_directive(30, filters={"service_uuids": ["180D"]}, key="k-1"),
            headers=bearer(tokens.alice),
        )
        again = await client.post(
            "/v1/directives",
            json=scan_directive(30, filters={"service_uuids": [HEART_RATE.upper()]}, key="k-1"),
            headers=bearer(tokens.alice),
        )
        assert first.status_code == again.status_code == 202, again.text
        assert first.json() == again.json()
        op_id = first.json()["connector_operation/id"]
        detail = await client.get(f"/v1/admin/deferred-operations/{op_id}", headers=bearer(tokens.operator))
        scope = detail.json()["operation"]["metadata"]["scope"]
        assert scope["filters"]["service_uuids"] == [HEART_RATE]


async def test_an_unknown_filter_key_is_named(tmp_path: Path) -> None:
    tokens = add_principals(tmp_path)
    async with host_app(tmp_path, host_poller=False) as (_, client):
        refused = await client.post(
            "/v1/directives",
            json=scan_directive(5, filters={"service_uuid": ["180d"]}),
            headers=bearer(tokens.alice),
        )
        assert refused.status_code == 422 and refused.json()["code"] == "invalid-input"
        messages = [d["message"] for d in refused.json()["diagnostics"]]
        assert "/input/filters/service_uuid: unknown-key" in messages and "180d" not in refused.text
