"""What a console page may show: whitelisted scalar fields, escaped, whatever the operator view carries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from connector.api.console import console_router, operation_view
from connector.core.authority import Principal
from connector.errors import SensoriumError
from connector.service.answers import Done

OP_ID = "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA"
CANARY = "CANARYview0f3a9"
OPERATOR = Principal("operator-1", "operator", "0" * 64)


def hostile_record(**changes: Any) -> dict[str, Any]:
    """An operator view with every field filled, plus fields and shapes a console must never render."""
    record: dict[str, Any] = {
        "operation/id": OP_ID,
        "operation/kind": "sensorium.directive.invoke",
        "owner_module_id": "sensorium-os",
        "capability_id": "whisper.redaction.prepare",
        "owner": "<script>alert(1)</script>",
        "status": "running",
        "retry_after_seconds": 5,
        "next_poll_at": "2026-11-30T09:00:05Z",
        "expires_at": "2026-11-30T09:15:00Z",
        "attempts": 3,
        "cancelable": False,
        "cancel/unavailable-reason": "this action's command cannot be interrupted once started",
        "correlation/id": {"nested": CANARY},
        "continuation_digest": CANARY + "digest",
        "diagnostics_digest": CANARY + "diag",
        "last_error": None,
        "created_at": "2026-11-30T09:00:00Z",
        "updated_at": "2026-11-30T09:00:04Z",
        "bus_op": CANARY + "busop",
        "metadata": {
            "status": "running",
            "disclosed_count": 2,
            "scope": {"transport": "ble", "filters": {"name_prefix": CANARY}},
            "cleanup": {"state": "pending", "claim": "held"},
        },
        "route": "host",
        "action": "whisper.redaction.prepare",
        "transport": "ble",
        "window_seconds": None,
        "adapter": "default",
        "outcome": None,
        "progress": {"snapshot": {"candidates": [{"label": CANARY}]}},
        "result": {"json": CANARY},
        "continuation": {"context": CANARY},
    }
    record.update(changes)
    return record


@dataclass(slots=True)
class ScriptedViews:
    """Operator views answering fixed documents, recording every call."""

    record: Mapping[str, Any]
    calls: list[tuple[str, str | None]] = field(default_factory=list)

    async def operator_list(
        self, operator: Principal, status: str | None = None, *, after: str | None = None, limit: int = 50
    ) -> Done:
        self.calls.append(("list", status))
        return Done({"operations": [self.record, "not-a-record", 7]})

    async def operator_detail(self, operator: Principal, op_id: str) -> Done:
        self.calls.append(("detail", op_id))
        history = [{"seq": 1, "at": "2026-11-30T09:00:00Z", "status": "running", "digest": "ab" * 32}]
        return Done({"operation": self.record, "history": history, "receipt": {"x": CANARY}})

    async def operator_poll(self, operator: Principal, op_id: str) -> Done:
        self.calls.append(("poll", op_id))
        return await self.operator_detail(operator, op_id)

    async def operator_cancel(self, operator: Principal, op_id: str) -> Done:
        self.calls.append(("cancel", op_id))
        raise SensoriumError("not cancelable " + CANARY, code="not-cancelable")


def authenticate(token: str | None) -> Principal:
    if token != "operator-token":
        raise SensoriumError("unknown", code="unauthenticated")
    return OPERATOR


@asynccontextmanager
async def console_over(views: ScriptedViews) -> AsyncIterator[httpx.AsyncClient]:
    """A signed-in browser on an app holding only the console."""
    app = FastAPI()
    app.include_router(console_router(views, authenticate=authenticate))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8787") as client:
        form = await client.get("/admin/sign-in")
        nonce = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        signed = await client.post("/admin/sign-in", data={"csrf_token": nonce, "token": "operator-token"})
        assert signed.status_code == 303
        yield client


@pytest.mark.asyncio
async def test_pages_render_only_whitelisted_scalars_escaped() -> None:
    views = ScriptedViews(hostile_record())
    async with console_over(views) as client:
        listing = await client.get("/admin/deferred-operations")
        detail = await client.get(f"/admin/deferred-operations/{OP_ID}")
    for page in (listing, detail):
        assert page.status_code == 200
        assert CANARY not in page.text
        assert "<script>alert(1)</script>" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "whisper.redaction.prepare" in listing.text and OP_ID in listing.text.replace("<wbr>", "")
    assert "ab" * 32 in detail.text and "5 s" in detail.text and "2026-11-30T09:00:05Z" in detail.text
    assert "<dd>3</dd>" in detail.text and "pending, claim held" in detail.text
    assert ("list", None) in views.calls and ("detail", OP_ID) in views.calls


@pytest.mark.asyncio
async def test_a_non_cancelable_operation_shows_its_reason_and_a_disabled_button() -> None:
    views = ScriptedViews(hostile_record())
    async with console_over(views) as client:
        detail = await client.get(f"/admin/deferred-operations/{OP_ID}")
        assert "no: this action&#39;s command cannot be interrupted once started" in detail.text
        assert 'id="cancel" disabled' in detail.text
        token = detail.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        refused = await client.post(f"/admin/deferred-operations/{OP_ID}/cancel", data={"csrf_token": token})
        assert refused.status_code == 303
        shown = await client.get(refused.headers["location"])
    assert "Cancel refused: not-cancelable." in shown.text
    assert CANARY not in shown.text
    assert ("cancel", OP_ID) in views.calls


@pytest.mark.asyncio
async def test_a_list_filter_is_passed_through_only_when_it_is_a_status() -> None:
    views = ScriptedViews(hostile_record())
    async with console_over(views) as client:
        await client.get("/admin/deferred-operations", params={"status": "timed-out"})
        bad = await client.get("/admin/deferred-operations", params={"status": "nope"})
    assert bad.status_code == 400
    assert views.calls == [("list", "timed-out")]


def test_the_status_badge_names_a_requested_cancellation() -> None:
    requested = {"state": "requested", "requested_at": "2026-11-30T09:00:03Z"}
    view = operation_view(hostile_record(metadata={"cancellation": requested}))
    assert (view.status_text, view.status_class) == ("running, cancellation requested", "cancelling")
    assert view.cancellation == "cancellation requested at 2026-11-30T09:00:03Z"
    assert not view.terminal


def test_terminal_statuses_and_outcomes() -> None:
    failed = operation_view(
        hostile_record(
            status="failed",
            last_error="interrupted-by-restart",
            outcome="interrupted-by-restart",
            retry_after_seconds=None,
        )
    )
    assert failed.terminal and failed.status_text == "failed" and failed.retry_after == "-"
    assert failed.outcome == "interrupted-by-restart"
    completed = operation_view(hostile_record(status="completed", outcome="window-complete"))
    assert completed.outcome == "window-complete" and completed.terminal


def test_unexpected_shapes_render_as_nothing() -> None:
    view = operation_view(
        hostile_record(status=["running"], attempts={"n": 1}, owner=None, retry_after_seconds=True)
    )
    assert view.status_text == "unrecognised" and view.attempts == "" and view.owner == ""
    assert view.retry_after == "-"
    assert view.disclosed_count == 2
