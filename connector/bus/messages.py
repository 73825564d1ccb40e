"""Bus messages (CONTRACT §10): subjects, request parsing, and the envelopes of replies and `op.done`.

Rules of this file:
- every envelope is built from an operation's DURABLE record (CONTRACT §7); keys that could carry
  caller-private data (`progress`, `result`, `snapshot`, `candidates`) are dropped even if a record ever
  held them;
- `state` follows `connector.core.lifecycle.bus_state`/`bus_reason`; two cases the table leaves open are
  decided here: a record the host lost track of (status `unknown`) is `lost` with reason
  `unknown-operation` (the service saw it, so it is terminal on the Bus), and a terminal record older than
  the retention is `unknown` (the service no longer retains it);
- a refusal names the op only when it is a well-formed handle; messages never echo other request values;
- pure: no NATS, no I/O, `now` passed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from connector.contract import strict_json
from connector.core.clock import format_time
from connector.core.lifecycle import (
    BUS_TERMINAL_STATES,
    INTERRUPTED_BY_RESTART,
    BusState,
    Status,
    bus_reason,
    bus_state,
    is_terminal,
)
from connector.errors import CODES, BusAnswer, Code, SensoriumError

DEFAULT_SERVICE: Final = "sensorium-os"
DEFAULT_RETENTION_SECONDS: Final = 7 * 24 * 3600
LOST_BY_HOST: Final = Code.UNKNOWN_OPERATION
MAX_REQUEST_BYTES: Final = 65536

_SERVICE = re.compile(r"[A-Za-z0-9_-]{1,64}(?:\.[A-Za-z0-9_-]{1,64}){0,3}")
_OP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_BROKER_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
_PRIVATE_KEYS: Final = frozenset({"progress", "result", "snapshot", "candidates"})
_NOT_ENVELOPE_KEYS: Final = frozenset({"schema", "schema/v", "retry_after_seconds", "diagnostics"})
# What `op.done` (a broadcast) carries beside {op, state, reason}; `op.get` adds the rest of the metadata.
LIFECYCLE_KEYS: Final = (
    "operation/id",
    "operation/kind",
    "action_id",
    "status",
    "created_at",
    "updated_at",
    "expires_at",
    "error_code",
    "cancellation",
    "cleanup",
    "erased_at",
)


class DurableRecord(Protocol):
    """What the Bus reads of a registry row (`connector.storage.registry.OperationRecord`)."""

    @property
    def operation_id(self) -> str: ...
    @property
    def operation_kind(self) -> str: ...
    @property
    def capability_id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def expires_at(self) -> datetime: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def updated_at(self) -> datetime: ...
    @property
    def bus_op(self) -> str | None: ...
    @property
    def metadata(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Subjects:
    """The four subjects of one service."""

    start: str
    get: str
    cancel: str
    done: str

    @classmethod
    def for_service(cls, service: str = DEFAULT_SERVICE) -> Subjects:
        """`<svc>.op.start|get|cancel|done`; `ValueError` for a name that is not a subject prefix."""
        if not _SERVICE.fullmatch(service):
            raise ValueError("the Bus service name must be 1-4 dot-separated tokens of [A-Za-z0-9_-]")
        return cls(f"{service}.op.start", f"{service}.op.get", f"{service}.op.cancel", f"{service}.op.done")


def check_broker_url(url: str) -> str:
    """A NATS URL (`nats://HOST:PORT`, also tls/ws/wss); `ValueError` with a fixed reason otherwise."""
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError:
        parsed, port = None, None
    if parsed is None or parsed.scheme not in _BROKER_SCHEMES or not parsed.hostname or port == 0:
        raise ValueError("--nats takes a broker URL such as nats://127.0.0.1:4222")
    return url


@dataclass(frozen=True, slots=True)
class StartRequest:
    """`op.start`: an optional caller-chosen handle and the directive."""

    op: str | None
    directive: Any


# ---- requests --------------------------------------------------------------------------------------------


def bearer_token(headers: Mapping[str, str] | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (name case-insensitive), else None."""
    for name, value in (headers or {}).items():
        if name.lower() == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def is_valid_op(value: Any) -> bool:
    """True for a well-formed Bus handle (1-128 characters of `[A-Za-z0-9._:/-]`, alphanumeric first)."""
    return isinstance(value, str) and _OP.fullmatch(value) is not None


def peek_op(data: bytes) -> str | None:
    """The request's `op` when it is well-formed, for echoing in any answer; never raises."""
    try:
        body = strict_json.loads(data, directive_at=None) if len(data) <= MAX_REQUEST_BYTES else None
    except SensoriumError:
        return None
    op = body.get("op") if isinstance(body, dict) else None
    return op if is_valid_op(op) else None


def _invalid(path: str, rule: str) -> SensoriumError:
    diagnostics = [{"code": Code.INVALID_INPUT, "message": f"{path}: {rule}"}]
    return SensoriumError("the Bus request is malformed", code=Code.INVALID_INPUT, diagnostics=diagnostics)


def _decode(data: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    """A closed, strict JSON object of at most `MAX_REQUEST_BYTES` (CONTRACT §1: `invalid-json` or 422)."""
    if len(data) > MAX_REQUEST_BYTES:
        raise SensoriumError("the Bus request is too large", code=Code.BODY_TOO_LARGE)
    body = strict_json.loads(data, directive_at=("directive",) if "directive" in allowed else None)
    if not isinstance(body, dict):
        raise _invalid("/", "object-required")
    if set(body) - allowed:
        raise _invalid("/", "closed-object")
    return body


def _op_field(body: Mapping[str, Any], *, required: bool) -> str | None:
    if "op" not in body and not required:
        return None
    if not is_valid_op(body.get("op")):
        raise _invalid("/op", "handle-pattern")
    op: str = body["op"]
    return op


def parse_start(data: bytes) -> StartRequest:
    """`{"op"?, "directive"}`; the directive itself is checked by admission."""
    body = _decode(data, frozenset({"op", "directive"}))
    op = _op_field(body, required=False)
    if "directive" not in body:
        raise _invalid("/directive", "required")
    return StartRequest(op, body["directive"])


def parse_op(data: bytes) -> str:
    """`{"op"}` of `op.get` and `op.cancel`."""
    op = _op_field(_decode(data, frozenset({"op"})), required=True)
    assert op is not None  # required=True never answers None
    return op


def is_sync_directive(directive: Any) -> bool:
    """True when a directive asks for `timing.mode = sync` (the Bus starts operations only)."""
    timing = directive.get("timing") if isinstance(directive, dict) else None
    return isinstance(timing, dict) and timing.get("mode") == "sync"


# ---- states ----------------------------------------------------------------------------------------------


def handle_of(record: DurableRecord) -> str:
    """The Bus `op` of a record: the caller's own handle, else the operation id."""
    return record.bus_op or record.operation_id


def is_retained(record: DurableRecord, *, now: datetime, retention: timedelta) -> bool:
    """False once a terminal record is older than the retention (then the Bus answers `unknown`)."""
    return not is_terminal(Status(record.status)) or record.updated_at >= now - retention


def error_code(record: DurableRecord) -> str | None:
    """The terminal error code: the row's, else the one its durable metadata carries."""
    error = record.metadata.get("error")
    for code in (
        record.last_error,
        record.metadata.get("error_code"),
        error.get("code") if isinstance(error, Mapping) else None,
    ):
        if isinstance(code, str):
            return code
    return None


def bus_answer(code: str | None) -> BusAnswer:
    """What the Bus makes of an error code, as `connector.errors.CODES` states it (`none` for no code)."""
    return CODES[Code(code)].bus if code is not None and code in CODES else BusAnswer.NONE


def is_interrupted(record: DurableRecord) -> bool:
    """True for an operation cut by a restart (`failed` with the code the Bus reports `lost`)."""
    return record.status == Status.FAILED and bus_answer(error_code(record)) is BusAnswer.LOST


def record_state(record: DurableRecord) -> tuple[BusState, str | None]:
    """The Bus state and reason of a retained record."""
    status = Status(record.status)
    if status is Status.UNKNOWN:
        return BusState.LOST, LOST_BY_HOST
    if is_interrupted(record):
        return BusState.LOST, INTERRUPTED_BY_RESTART
    reason = bus_reason(status, error_code(record))
    if reason is None and status is Status.COMPLETED:
        completion = record.metadata.get("reason")
        reason = completion if isinstance(completion, str) else None
    return bus_state(status), reason


def status_state(status_document: Mapping[str, Any]) -> BusState:
    """The Bus state of a status document (a reply of the host)."""
    return bus_state(Status(status_document["status"]))


def is_bus_terminal(state: str) -> bool:
    """True for done, failed, cancelled and lost."""
    return state in BUS_TERMINAL_STATES


# ---- envelopes -------------------------------------------------------------------------------------------


def _row_fields(record: DurableRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "operation/id": record.operation_id,
        "operation/kind": record.operation_kind,
        "action_id": record.capability_id,
        "status": record.status,
        "created_at": format_time(record.created_at),
        "updated_at": format_time(record.updated_at),
        "expires_at": format_time(record.expires_at),
    }
    code = error_code(record)
    if code is not None:
        fields["error_code"] = code
    return fields


def _metadata(record: DurableRecord) -> dict[str, Any]:
    # `error` is the refusal key of a Bus reply: an operation's own failure travels as reason/error_code.
    excluded = _PRIVATE_KEYS | _NOT_ENVELOPE_KEYS | {"op", "state", "reason", "error"}
    return {key: value for key, value in record.metadata.items() if key not in excluded}


def envelope(op: str, record: DurableRecord, *, full: bool) -> dict[str, Any]:
    """`{op, state, reason?}` + lifecycle metadata (`full`: every durable metadata field, for `op.get`)."""
    state, reason = record_state(record)
    fields = _metadata(record)
    if not full:
        fields = {key: value for key, value in fields.items() if key in LIFECYCLE_KEYS}
    fields.update(_row_fields(record))
    document: dict[str, Any] = {"op": op, "state": state.value}
    if reason is not None:
        document["reason"] = reason
    document.update(fields)
    return document


def done_message(record: DurableRecord) -> dict[str, Any]:
    """The one `op.done` of a terminal record."""
    return envelope(handle_of(record), record, full=False)


def unknown_reply(op: str | None) -> dict[str, Any]:
    """An op this caller may not see, never seen, or no longer retained."""
    return {"op": op, "state": BusState.UNKNOWN.value}


def state_reply(op: str, state: BusState) -> dict[str, Any]:
    """`op.start`'s answer: `{op, state}`."""
    return {"op": op, "state": state.value}


def cancel_reply(op: str, *, cancelled: bool, state: BusState) -> dict[str, Any]:
    """`op.cancel`'s answer: `{op, cancelled, state}`."""
    return {"op": op, "cancelled": cancelled, "state": state.value}


def refusal(op: str | None, error: SensoriumError, *, state: BusState = BusState.UNKNOWN) -> dict[str, Any]:
    """A refused request: `{op, state, error: sensorium-error.v1}`."""
    return {"op": op, "state": state.value, "error": error.to_document()}


def refusal_reply(
    op: str | None, error: SensoriumError, *, state: BusState = BusState.UNKNOWN
) -> dict[str, Any]:
    """A refused request's Bus answer: `{op, state: unknown}` where the code hides the op, else `refusal`."""
    if bus_answer(error.code) is BusAnswer.UNKNOWN:
        return unknown_reply(op)
    return refusal(op, error, state=state)


def encode(document: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_reply(data: bytes) -> dict[str, Any]:
    """A Bus reply as a dict; `internal` when it is not a JSON object with `op` and `state`."""
    try:
        body = json.loads(data)
    except ValueError:
        raise SensoriumError("the Bus reply is not JSON", code=Code.INTERNAL) from None
    if not isinstance(body, dict) or "state" not in body or "op" not in body:
        raise SensoriumError("the Bus reply is not an operation envelope", code=Code.INTERNAL)
    return body
