"""`/lab` in-process (CONTRACT §8, §15): the console's sign-in, cookie and CSRF rules, the table, a forwarded
cancel and its audit line - over a recorded follower instead of NATS, with an injected clock."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.core.lab import LabTable, NodeInfo
from connector.lab.audit import AuditLog
from connector.lab.page import LabPage, lab_app
from connector.storage.principals import PrincipalDirectory, revoke
from tests.support.principals import Tokens, create_principals

pytestmark = pytest.mark.asyncio
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
BASE = "http://127.0.0.1:8788"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class RecordedFollower:
    """Answers `cancel` as a node would and records what it was asked."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    async def cancel(self, name: str, operation_id: str) -> dict[str, Any]:
        self.asked.append((name, operation_id))
        return self.answer


def _view(
    tmp_path: Path, answer: dict[str, Any]
) -> tuple[httpx.AsyncClient, RecordedFollower, Tokens, list[datetime]]:
    tokens = create_principals(tmp_path, callers={"carol": ["device.discovery.scan"]}, operators=["alice"])
    now = [T0]
    table = LabTable()
    table.answered(NodeInfo("b", "id-1", "0.1.0", "ble"), T0)
    table.listed(
        "b",
        [
            {
                "operation/id": "op-1",
                "status": "running",
                "capability_id": "device.discovery.scan",
                "created_at": "2026-01-01T11:59:00Z",
                "updated_at": "2026-01-01T11:59:00Z",
            }
        ],
    )
    follower = RecordedFollower(answer)
    page = LabPage(table, follower, PrincipalDirectory(tmp_path), AuditLog(tmp_path), lambda: now[0])
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=lab_app(page)), base_url=BASE)
    return client, follower, tokens, now


async def _sign_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await client.get("/lab/sign-in")
    nonce = _CSRF.search(form.text)
    assert nonce is not None
    return await client.post("/lab/sign-in", data={"csrf_token": nonce.group(1), "token": token})


async def test_sign_in_as_the_console_does(tmp_path: Path) -> None:
    client, _, tokens, _ = _view(tmp_path, {})
    async with client:
        alice = tokens["alice"]
        assert (await client.get("/lab")).headers["location"] == "/lab/sign-in"
        signed = await _sign_in(client, alice)
        assert signed.status_code == 303 and signed.headers["location"] == "/lab"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/lab" in cookie
        page = await client.get("/lab")
        assert page.status_code == 200 and 'data-operation="op-1"' in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]


async def test_callers_and_unknown_tokens_cannot_sign_in(tmp_path: Path) -> None:
    client, _, tokens, _ = _view(tmp_path, {})
    async with client:
        assert (await _sign_in(client, "not-a-token")).status_code == 401
        assert (await _sign_in(client, tokens["carol"])).status_code == 401  # a caller is no lab operator


async def test_a_cancel_needs_the_csrf_token_and_is_forwarded_and_audited(tmp_path: Path) -> None:
    answer = {
        "operation": {
            "operation/id": "op-1",
            "status": "running",
            "metadata": {"cancellation": {"state": "requested"}},
        }
    }
    client, follower, tokens, _ = _view(tmp_path, answer)
    async with client:
        await _sign_in(client, tokens["alice"])
        csrf = _CSRF.search((await client.get("/lab")).text)
        assert csrf is not None
        refused = await client.post("/lab/cancel", data={"node": "b", "operation": "op-1"})
        assert refused.status_code == 403 and follower.asked == []
        cross = await client.post(
            "/lab/cancel",
            data={"csrf_token": csrf.group(1), "node": "b", "operation": "op-1"},
            headers={"Origin": "http://evil.example"},
        )
        assert cross.status_code == 403 and follower.asked == []
        sent = await client.post(
            "/lab/cancel", data={"csrf_token": csrf.group(1), "node": "b", "operation": "op-1"}
        )
        assert sent.status_code == 303 and follower.asked == [("b", "op-1")]
        notice = (await client.get("/lab")).text
        assert "the node answered: status running, cancellation requested." in notice
    [line] = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert json.loads(line) == {
        "at": "2026-01-01T12:00:00Z",
        "operator": "alice",
        "node": "b",
        "operation/id": "op-1",
        "action": "cancel",
        "answer": "status running, cancellation requested",
    }
    assert oct((tmp_path / "audit.jsonl").stat().st_mode & 0o777) == "0o600"


async def test_a_revoked_lab_operator_loses_the_view_at_once(tmp_path: Path) -> None:
    client, _, tokens, _ = _view(tmp_path, {})
    async with client:
        await _sign_in(client, tokens["alice"])
        assert (await client.get("/lab")).status_code == 200
        revoke(tmp_path, "alice")
        assert (await client.get("/lab")).headers["location"] == "/lab/sign-in"


async def test_a_silent_node_is_shown_unreachable_on_the_injected_clock(tmp_path: Path) -> None:
    client, _, tokens, now = _view(tmp_path, {})
    async with client:
        await _sign_in(client, tokens["alice"])
        assert "unreachable" not in (await client.get("/lab")).text
        now[0] = T0 + timedelta(seconds=10)
        page = (await client.get("/lab")).text
        assert 'unreachable since <span class="mono">2026-01-01T12:00:00Z</span>' in page
        assert 'class="unreachable"' in page  # its row stays, marked
