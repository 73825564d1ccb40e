"""The federated view's pure core (CONTRACT §15): the unreachable rule on an injected clock, the table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from connector.core.lab import LabTable, NodeInfo, age_text, node_info, row_of

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _info(name: str, service_id: str = "id-1") -> NodeInfo:
    return NodeInfo(name, service_id, "0.1.0", "ble,mdns")


def _doc(
    op: str, status: str = "running", updated: str = "2026-01-01T12:00:00Z", **extra: Any
) -> dict[str, Any]:
    return {
        "operation/id": op,
        "capability_id": "device.discovery.scan",
        "status": status,
        "created_at": "2026-01-01T11:59:00Z",
        "updated_at": updated,
        "metadata": {"scope": {"transport": "ble", "adapter": "hci0"}},
        **extra,
    }


def test_a_new_node_is_due_for_a_listing_once() -> None:
    table = LabTable()
    assert table.answered(_info("a"), T0) is True
    assert table.due() == ["a"]
    table.listed("a", [])
    assert table.answered(_info("a"), T0 + timedelta(seconds=1)) is False
    assert table.due() == []


def test_silent_for_the_threshold_is_unreachable_since_its_last_answer() -> None:
    table = LabTable(unreachable_after=timedelta(seconds=10))
    table.answered(_info("a"), T0)
    table.listed("a", [_doc("op-1")])
    assert table.reachable("a", T0 + timedelta(seconds=9.9))
    assert not table.reachable("a", T0 + timedelta(seconds=10))
    line = table.lines(T0 + timedelta(seconds=10))[0]
    assert (line.reachable, line.unreachable_since) == (False, T0)
    # Its rows stay, marked, with the status the node last reported: the view ends nothing itself.
    [row] = table.table(T0 + timedelta(seconds=30))
    assert (row.row.status, row.reachable) == ("running", False)


def test_a_node_back_from_silence_or_restarted_is_listed_again() -> None:
    table = LabTable(unreachable_after=timedelta(seconds=10))
    table.answered(_info("a"), T0)
    table.listed("a", [_doc("op-1")])
    assert table.answered(_info("a"), T0 + timedelta(seconds=11)) is True  # back after 11 s of silence
    table.listed("a", [_doc("op-1", "failed", last_error="interrupted-by-restart")])
    assert table.table(T0 + timedelta(seconds=11))[0].row.outcome == "interrupted-by-restart"
    assert table.answered(_info("a", "id-2"), T0 + timedelta(seconds=12)) is True  # a new service id
    table.listed("a", [])
    table.relist_all()
    assert table.due() == ["a"]


def test_one_table_over_all_nodes_with_filters() -> None:
    table = LabTable()
    for name in ("a", "b"):
        table.answered(_info(name), T0)
    table.listed("a", [_doc("op-1", updated="2026-01-01T12:00:01Z"), _doc("op-2", "completed")])
    table.listed("b", [_doc("op-3", updated="2026-01-01T12:00:02Z")])
    rows = table.table(T0)
    assert [(r.row.node, r.row.operation_id) for r in rows] == [("b", "op-3"), ("a", "op-1"), ("a", "op-2")]
    assert [r.row.operation_id for r in table.table(T0, node="a")] == ["op-1", "op-2"]
    assert [r.row.operation_id for r in table.table(T0, status="running")] == ["op-3", "op-1"]
    assert [r.row.operation_id for r in table.table(T0, node="a", status="completed")] == ["op-2"]
    assert [line.live for line in table.lines(T0)] == [1, 1]


def test_op_done_updates_its_row() -> None:
    table = LabTable()
    table.answered(_info("a"), T0)
    table.listed("a", [_doc("op-1")])
    message = {"op": "op-1", "state": "cancelled", "operation/id": "op-1", "status": "cancelled"}
    assert table.done("a", message) is True
    assert table.row("a", "op-1").status == "cancelled"  # type: ignore[union-attr]
    assert table.done("unknown-node", message) is False
    assert table.done("a", {"op": "x"}) is False


def test_rows_carry_whitelisted_text_only() -> None:
    row = row_of("a", _doc("op-1", metadata={"scope": {"transport": "ble", "filters": {"name_prefix": []}}}))
    assert row is not None
    assert (row.action, row.transport, row.adapter) == ("device.discovery.scan", "ble", "default")
    assert row_of("a", {"status": "running"}) is None


def test_ping_answers_of_nodes_only() -> None:
    answer = {
        "id": "X1",
        "name": "sensorium-os",
        "version": "0.1.0",
        "metadata": {"node": "a", "transports": "ble"},
    }
    assert node_info(answer) == NodeInfo("a", "X1", "0.1.0", "ble")
    assert node_info({"id": "X2", "name": "sensorium-os", "metadata": {}}) is None


def test_age_text() -> None:
    assert age_text(None, T0) == "-"
    assert age_text(T0, T0 + timedelta(seconds=42)) == "42 s"
    assert age_text(T0, T0 + timedelta(minutes=3)) == "3 min"
    assert age_text(T0, T0 + timedelta(hours=5)) == "5 h"
    assert age_text(T0, T0 + timedelta(days=2)) == "2 d"


def test_the_newest_page_merges_into_a_listed_node() -> None:
    table = LabTable()
    table.answered(_info("a"), T0)
    assert table.fresh(T0) == []  # not listed yet: it gets a full listing first
    table.listed("a", [_doc("op-1"), _doc("op-2")])
    table.merge("a", [_doc("op-3"), _doc("op-1", "completed")])
    assert {r.row.operation_id: r.row.status for r in table.table(T0)} == {
        "op-1": "completed",
        "op-2": "running",
        "op-3": "running",
    }
    assert table.fresh(T0) == ["a"]
    assert table.fresh(T0 + timedelta(seconds=10)) == []  # unreachable: not asked


def test_a_refused_listing_shows_on_the_line_until_a_listing_succeeds() -> None:
    table = LabTable()
    table.answered(_info("a"), T0)
    table.refused("a", "unauthenticated")
    assert table.lines(T0)[0].refusal == "unauthenticated"
    assert table.due() == ["a"]  # asked again at its next answer
    table.listed("a", [])
    assert table.lines(T0)[0].refusal == ""
