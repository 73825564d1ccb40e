"""The operator rows (CONTRACT §9, §11): columns, cancelability that follows the status, the cursor."""

from __future__ import annotations

import re
from typing import Any

import pytest

from connector.core.operator_rows import (
    CURSOR_PATTERN,
    BadCursor,
    connector_row,
    decode_cursor,
    follow_status,
    merge_rows,
    operator_columns,
    operator_page,
)


def _row(n: int, status: str = "running") -> dict[str, Any]:
    return {"operation/id": f"op-{n:02d}", "created_at": f"2026-01-01T00:00:{n:02d}.000Z", "status": status}


def test_columns_name_an_adapter_only_where_the_transport_has_one() -> None:
    ble = {"scope": {"transport": "ble", "window_seconds": 5}, "reason": "window-complete"}
    usb = {"scope": {"transport": "usb-serial", "window_seconds": 5}, "error_code": "provider-failure"}
    assert operator_columns(ble, "device.discovery.scan") == {
        "action": "device.discovery.scan",
        "transport": "ble",
        "window_seconds": 5,
        "adapter": "default",
        "outcome": "window-complete",
    }
    assert operator_columns({"scope": {"transport": "ble", "adapter": "hci1"}}, None)["adapter"] == "hci1"
    assert operator_columns(usb, "x")["adapter"] is None
    assert operator_columns(usb, "x")["outcome"] == "provider-failure"
    assert operator_columns({"error": {"code": "command-failed"}}, "cmd")["transport"] is None
    assert operator_columns({"error": {"code": "Free text!"}}, "cmd")["outcome"] is None


def test_an_ended_operation_is_never_cancelable() -> None:
    ended = follow_status({"status": "cancelled", "cancelable": True, "cancel/unavailable-reason": None})
    assert ended["cancelable"] is False and ended["cancel/unavailable-reason"]
    row = connector_row({"operation/id": "op", "status": "running", "action_id": "a"}, "sensorium-os")
    assert row["cancelable"] is True and row["route"] == "connector" and row["action"] == "a"
    done = connector_row({"operation/id": "op", "status": "completed"}, "sensorium-os")
    assert done["cancelable"] is False


def test_pages_follow_the_cursor_newest_first_without_gaps_or_repeats() -> None:
    rows = [_row(n) for n in range(7)]
    seen: list[str] = []
    after = None
    while True:
        page = operator_page(rows, after=after, limit=3)
        seen += [row["operation/id"] for row in page.rows]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [f"op-{n:02d}" for n in reversed(range(7))]
    assert [r["operation/id"] for r in operator_page(rows, status="running", limit=500).rows][:1] == ["op-06"]
    assert len(operator_page(rows * 40, limit=500).rows) == 200


def test_a_status_filter_and_the_merge_keep_the_registry_row() -> None:
    host = [_row(1, "completed") | {"route": "host"}]
    connector = [_row(1, "completed") | {"route": "connector"}, _row(2)]
    merged = merge_rows(host, connector)
    assert [(r["operation/id"], r.get("route")) for r in merged] == [("op-01", "host"), ("op-02", None)]
    assert [r["operation/id"] for r in operator_page(merged, status="completed").rows] == ["op-01"]


@pytest.mark.parametrize("cursor", ["", "!!", "bm90IGpzb24", "WzFd", "123", "~op", "123456789012345~op"])
def test_a_cursor_never_handed_out_is_refused(cursor: str) -> None:
    with pytest.raises(BadCursor):
        decode_cursor(cursor)


def test_any_cursor_of_the_published_form_is_a_position_handed_out_or_not() -> None:
    rows = [_row(n) for n in range(5)]
    handed = operator_page(rows, limit=2).next_after
    assert handed is not None and re.fullmatch(CURSOR_PATTERN, handed)
    assert [r["operation/id"] for r in operator_page(rows, after=handed).rows] == ["op-02", "op-01", "op-00"]
    never = "1767225603500~op-99"  # between op-03 and op-04, never handed out
    listed = [r["operation/id"] for r in operator_page(rows, after=never).rows]
    assert listed == ["op-03", "op-02", "op-01", "op-00"]
    assert decode_cursor("0~a") == (0, "a") and operator_page(rows, after="0~a").rows == ()
