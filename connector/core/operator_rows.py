"""The operator's one view of every operation (CONTRACT §9, §11, §15): rows, their columns, their order.

Rules of this file:
- a row is a durable view (CONTRACT §7): ids, owner, status, times, cancelability and durable metadata,
  never candidates, progress or a result value;
- every row carries the console's columns (action, transport, window, adapter, outcome) and the route that
  admitted it, so the HTTP admin list, the console and the Bus `admin.list` read the same facts;
- rows are listed newest first by (`created_at`, `operation/id`), which never changes for an operation, so a
  cursor (`after`) stays valid while rows update; a page holds at most `MAX_PAGE` rows;
- cancelability follows the status: an ended operation is never cancelable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from connector.core.clock import parse_time, to_ms
from connector.core.lifecycle import TERMINAL_STATUSES
from connector.core.transports import TRANSPORT_FACTS

MAX_PAGE: Final = 200
DEFAULT_PAGE: Final = 50
TERMINAL: Final = TERMINAL_STATUSES
ENDED_REASON: Final = "the operation has ended"
DEFAULT_ADAPTER_TEXT: Final = "default"
_CODE: Final = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
# 14 digits of milliseconds stay below the year 9999 that a datetime holds.
CURSOR_PATTERN: Final = r"^[0-9]{1,14}~[A-Za-z0-9:._-]{1,128}$"
_CURSOR: Final = re.compile(CURSOR_PATTERN)


def _scope(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    scope = metadata.get("scope")
    return scope if isinstance(scope, Mapping) else {}


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def error_code_of(metadata: Mapping[str, Any]) -> str | None:
    """The terminal error code durable metadata names (`error_code` for a scan, `error.code` else)."""
    error = metadata.get("error")
    code = metadata.get("error_code") or (error.get("code") if isinstance(error, Mapping) else None)
    return code if isinstance(code, str) and _CODE.match(code) else None


def known_code(value: Any) -> str | None:
    """A value that has the shape of a wire code, else None (a row never shows free text)."""
    return value if isinstance(value, str) and _CODE.match(value) else None


def operator_columns(
    metadata: Mapping[str, Any], action: str | None, last_error: str | None = None
) -> dict[str, Any]:
    """The console's columns of one operation: action, transport, window, adapter, outcome."""
    scope = _scope(metadata)
    transport = _string(scope.get("transport"))
    facts = next((f for name, f in TRANSPORT_FACTS.items() if name == transport), None)
    adapter = None
    if facts is not None and facts.takes("adapter"):
        adapter = _string(scope.get("adapter")) or DEFAULT_ADAPTER_TEXT
    code = known_code(last_error) or error_code_of(metadata)
    outcome = " ".join(part for part in (_string(metadata.get("reason")), code) if part) or None
    return {
        "action": action,
        "transport": transport,
        "window_seconds": _integer(scope.get("window_seconds")),
        "adapter": adapter,
        "outcome": outcome,
    }


def connector_row(metadata: Mapping[str, Any], owner_module_id: str) -> dict[str, Any]:
    """An operation admitted on the connector routes (no host registry row) as an operator row."""
    status = str(metadata.get("status", "unknown"))
    action = _string(metadata.get("action_id"))
    ended = status in TERMINAL
    created = metadata.get("created_at") or metadata.get("updated_at")
    return {
        "operation/id": metadata.get("operation/id"),
        "operation/kind": metadata.get("operation/kind"),
        "owner_module_id": owner_module_id,
        "capability_id": action,
        "owner": metadata.get("owner"),
        "status": status,
        "retry_after_seconds": None,
        "next_poll_at": None,
        "expires_at": metadata.get("expires_at") or metadata.get("updated_at"),
        "attempts": 0,
        "cancelable": not ended,
        "cancel/unavailable-reason": ENDED_REASON if ended else None,
        "correlation/id": None,
        "continuation_digest": None,
        "diagnostics_digest": None,
        "last_error": None,
        "created_at": created,
        "updated_at": metadata.get("updated_at"),
        "bus_op": None,
        "metadata": dict(metadata),
        "route": "connector",
        **operator_columns(metadata, action),
    }


def follow_status(row: dict[str, Any]) -> dict[str, Any]:
    """An ended operation is not cancelable, whatever its handle once offered."""
    if row.get("status") in TERMINAL and row.get("cancelable"):
        row["cancelable"] = False
        row["cancel/unavailable-reason"] = ENDED_REASON
    return row


# ---- the listing -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the listing and the cursor of the next (None: this was the last)."""

    rows: tuple[dict[str, Any], ...]
    next_after: str | None


class BadCursor(ValueError):
    """An `after` value this listing never handed out."""


def _order_key(row: Mapping[str, Any]) -> tuple[int, str]:
    created = row.get("created_at")
    created_ms = to_ms(parse_time(created)) if isinstance(created, str) and created else 0
    return (created_ms, str(row.get("operation/id") or ""))


def encode_cursor(row: Mapping[str, Any]) -> str:
    """The cursor just past `row`: its order key as `<created_at in ms>~<operation/id>`."""
    created_ms, operation_id = _order_key(row)
    return f"{created_ms}~{operation_id}"


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The order key a cursor names; `BadCursor` for a value not of `CURSOR_PATTERN`.

    Every value of that form is a position in the order (a keyset), handed out or not, so a request that the
    published pattern allows is never refused for its cursor (CONTRACT §1).
    """
    if _CURSOR.fullmatch(cursor) is None:
        raise BadCursor("not a cursor of this listing")
    created_ms, operation_id = cursor.split("~", 1)
    return int(created_ms), operation_id


def operator_page(
    rows: Iterable[Mapping[str, Any]],
    *,
    status: str | None = None,
    after: str | None = None,
    limit: int = DEFAULT_PAGE,
) -> Page:
    """Newest first, of one status if asked, strictly after the cursor, at most `limit` (<= MAX_PAGE)."""
    size = max(1, min(limit, MAX_PAGE))
    start = decode_cursor(after) if after is not None else None
    chosen = sorted(
        (dict(row) for row in rows if status is None or row.get("status") == status),
        key=_order_key,
        reverse=True,
    )
    if start is not None:
        chosen = [row for row in chosen if _order_key(row) < start]
    page = chosen[:size]
    more = len(chosen) > size
    return Page(tuple(page), encode_cursor(page[-1]) if more and page else None)


def merge_rows(
    host_rows: Sequence[dict[str, Any]], connector_rows: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The host registry's rows, then the connector's own that the registry does not hold."""
    known = {row.get("operation/id") for row in host_rows}
    return [*host_rows, *(row for row in connector_rows if row.get("operation/id") not in known)]
