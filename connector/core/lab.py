"""The federated view's state (CONTRACT §15): nodes, reachability, one merged table (pure, `now` passed in).

Rules of this file:
- a node is known once it answered a ping; it is `unreachable since T` (T: its last answer) once it has been
  silent for the threshold, and keeps its rows, so marked: only the node can end its operations;
- a node that answers again, restarted (a new service id) or not yet listed is due for a listing;
- rows hold only whitelisted durable fields as text (no scope values, no payloads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final

UNREACHABLE_AFTER: Final = timedelta(seconds=10)
LIVE_STATUSES: Final = frozenset({"pending", "running"})
_MAX_TEXT: Final = 128


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node's ping answer says of it."""

    name: str
    service_id: str
    version: str
    transports: str


@dataclass(frozen=True, slots=True)
class LabRow:
    """One operation of one node, as the table shows it."""

    node: str
    operation_id: str
    action: str
    transport: str
    adapter: str
    status: str
    outcome: str
    created_at: datetime | None
    updated_at: str


@dataclass(frozen=True, slots=True)
class NodeLine:
    """One node's line: identity, reachability and its count of live operations."""

    name: str
    version: str
    transports: str
    reachable: bool
    unreachable_since: datetime | None
    live: int
    refusal: str = ""  # the error code the node answered the view's last listing with, if it refused


@dataclass(frozen=True, slots=True)
class TableRow:
    """A row with its node's reachability and its age at `now`."""

    row: LabRow
    reachable: bool
    age: str


@dataclass(slots=True)
class _Node:
    info: NodeInfo
    last_answer: datetime
    listed: bool = False
    refusal: str = ""
    rows: dict[str, LabRow] = field(default_factory=dict)


def _text(value: Any) -> str:
    """A scalar as bounded text; anything structured is not shown."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return ""
    return str(value)[:_MAX_TEXT]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time of a document, else None."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def outcome_of(document: Mapping[str, Any]) -> str:
    """Reason and error code of an operator view or an `op.done` (as the console shows them)."""
    metadata = _mapping(document.get("metadata"))
    code = (
        _text(document.get("last_error"))
        or _text(document.get("error_code"))
        or _text(metadata.get("error_code"))
    )
    reason = _text(document.get("reason")) or _text(metadata.get("reason"))
    return " ".join(dict.fromkeys(part for part in (reason, code) if part))


def row_of(node: str, document: Mapping[str, Any]) -> LabRow | None:
    """A row from one operator view document of `admin.list`, or None when it names no operation."""
    operation_id = _text(document.get("operation/id"))
    if not operation_id:
        return None
    scope = _mapping(_mapping(document.get("metadata")).get("scope"))
    return LabRow(
        node=node,
        operation_id=operation_id,
        action=_text(document.get("action"))
        or _text(document.get("capability_id"))
        or _text(document.get("action_id"))
        or "-",
        transport=_text(document.get("transport")) or _text(scope.get("transport")) or "-",
        adapter=_text(document.get("adapter"))
        or _text(scope.get("adapter"))
        or ("default" if scope else "-"),
        status=_text(document.get("status")) or "unknown",
        outcome=_text(document.get("outcome")) or outcome_of(document),
        created_at=parse_time(document.get("created_at")),
        updated_at=_text(document.get("updated_at")),
    )


def age_text(since: datetime | None, now: datetime) -> str:
    """`12 s`, `3 min`, `5 h`, `2 d` since a time; `-` without one."""
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


class LabTable:
    """Every known node and its listed operations; every method takes `now` or needs none."""

    def __init__(self, unreachable_after: timedelta = UNREACHABLE_AFTER) -> None:
        self.unreachable_after = unreachable_after
        self._nodes: dict[str, _Node] = {}

    def answered(self, info: NodeInfo, now: datetime) -> bool:
        """A ping answer; True when the node is due for a listing (new, back, or restarted)."""
        node = self._nodes.get(info.name)
        if node is None:
            self._nodes[info.name] = _Node(info, now)
            return True
        due = not node.listed or not self.reachable(info.name, now) or node.info.service_id != info.service_id
        node.info, node.last_answer = info, now
        if due:
            node.listed = False
        return due

    def reachable(self, name: str, now: datetime) -> bool:
        """True while the node answered within the threshold."""
        node = self._nodes.get(name)
        return node is not None and now - node.last_answer < self.unreachable_after

    def unreachable_since(self, name: str, now: datetime) -> datetime | None:
        """The node's last answer once it has been silent for the threshold, else None."""
        node = self._nodes.get(name)
        if node is None or self.reachable(name, now):
            return None
        return node.last_answer

    def due(self) -> list[str]:
        """The nodes waiting for a listing."""
        return [name for name, node in self._nodes.items() if not node.listed]

    def relist_all(self) -> None:
        """After a reconnect of the view: every node is listed afresh."""
        for node in self._nodes.values():
            node.listed = False

    def listed(self, name: str, documents: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of one node: its rows are exactly these."""
        node = self._nodes.get(name)
        if node is None:
            return
        rows = (row_of(name, document) for document in documents)
        node.rows = {row.operation_id: row for row in rows if row is not None}
        node.listed, node.refusal = True, ""

    def refused(self, name: str, code: str) -> None:
        """The node refused the view's listing (a wrong or revoked token): shown on its line, retried."""
        node = self._nodes.get(name)
        if node is not None:
            node.refusal = _text(code)

    def done(self, name: str, message: Mapping[str, Any]) -> bool:
        """An `op.done` of a node: the row takes its status and outcome; True when a row changed."""
        node = self._nodes.get(name)
        operation_id = _text(message.get("operation/id"))
        if node is None or not operation_id:
            return False
        status = _text(message.get("status"))
        known = node.rows.get(operation_id)
        if known is None:
            row = row_of(name, message)
            if row is None:
                return False
            node.rows[operation_id] = row
            return True
        node.rows[operation_id] = replace(
            known,
            status=status or known.status,
            outcome=outcome_of(message) or known.outcome,
            updated_at=_text(message.get("updated_at")) or known.updated_at,
        )
        return True

    def merge(self, name: str, documents: Iterable[Mapping[str, Any]]) -> None:
        """The newest page of a listed node: new rows join, known rows take the node's current fields."""
        for document in documents:
            self.put(name, document)

    def fresh(self, now: datetime) -> list[str]:
        """The listed, reachable nodes (whose newest page the view reads between listings)."""
        return [name for name, node in self._nodes.items() if node.listed and self.reachable(name, now)]

    def put(self, name: str, document: Mapping[str, Any]) -> None:
        """One operator view the node answered (after a cancel): its row as the node now reports it."""
        node = self._nodes.get(name)
        row = row_of(name, document)
        if node is not None and row is not None:
            node.rows[row.operation_id] = row

    def nodes(self) -> list[str]:
        """Known node names, sorted."""
        return sorted(self._nodes)

    def lines(self, now: datetime) -> list[NodeLine]:
        """One line per known node, by name."""
        return [
            NodeLine(
                name=name,
                version=node.info.version,
                transports=node.info.transports,
                reachable=self.reachable(name, now),
                unreachable_since=self.unreachable_since(name, now),
                live=sum(1 for row in node.rows.values() if row.status in LIVE_STATUSES),
                refusal=node.refusal,
            )
            for name, node in sorted(self._nodes.items())
        ]

    def table(self, now: datetime, *, node: str | None = None, status: str | None = None) -> list[TableRow]:
        """All nodes' rows (or one node's, or one status), most recently updated first."""
        rows = [
            TableRow(row, self.reachable(name, now), age_text(row.created_at, now))
            for name, entry in self._nodes.items()
            if node in (None, name)
            for row in entry.rows.values()
            if status in (None, row.status)
        ]
        rows.sort(key=lambda r: (r.row.updated_at, r.row.node, r.row.operation_id), reverse=True)
        return rows

    def row(self, name: str, operation_id: str) -> LabRow | None:
        """One row, if listed."""
        node = self._nodes.get(name)
        return None if node is None else node.rows.get(operation_id)


def node_info(answer: Mapping[str, Any]) -> NodeInfo | None:
    """A `$SRV.PING` answer of a `sensorium-os` node, else None (other services, no node metadata)."""
    metadata = _mapping(answer.get("metadata"))
    name, service_id = _text(metadata.get("node")), _text(answer.get("id"))
    if not name or not service_id:
        return None
    return NodeInfo(
        name=name,
        service_id=service_id,
        version=_text(metadata.get("version")) or _text(answer.get("version")),
        transports=_text(metadata.get("transports")),
    )
