"""The operator console (CONTRACT §8, 11): server-rendered HTML under `/admin/`, usable without JavaScript.

Rules of this file:
- a browser without a live operator session is sent (303) to `/admin/sign-in`; the session id lives only in
  an HttpOnly, SameSite=Strict, Path=/admin cookie and in server memory (keyed by its SHA-256). `Secure` is
  not set: `serve` speaks plain http on loopback, where a Secure cookie would never come back;
- every form POST carries the CSRF token bound to its session (sign-in: a double-submit nonce) or gets 403;
  a cross-origin `Origin` or `Sec-Fetch-Site` is refused as well;
- pages render only whitelisted durable fields of the host's operator views, as text: never continuations,
  payloads, progress, snapshots or candidates, whatever else a view might carry;
- the operator's token stays in server memory and is authenticated once per request, the principal handed
  to the host's operator views: a revoked operator loses the console at once;
- messages are fixed text or wire codes, never an input value;
- the list holds every operation the process knows: the host registry's, and the connector's own (admitted
  on `POST /v1/directives`) read through `ConnectorOperations`; pages of running work refresh themselves
  with `<meta http-equiv="refresh">` (no script: the CSP allows none), re-reading durable metadata only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape
from starlette.responses import HTMLResponse, RedirectResponse, Response

from connector.core.authority import Principal
from connector.core.candidates import format_ms
from connector.core.clock import wall_clock
from connector.core.lifecycle import TERMINAL_STATUSES
from connector.core.scope import ALL_FILTER_KEYS
from connector.errors import SensoriumError
from connector.service.answers import Done, public_refusal
from connector.service.operations import AdapterClaim, ConnectorOperations
from providers.ble_names import company_label, uuid_label

SESSION_COOKIE: Final = "sensorium_console"
SIGN_IN_COOKIE: Final = "sensorium_console_sign_in"
COOKIE_PATH: Final = "/admin"
SIGN_IN_PATH: Final = "/admin/sign-in"
LIST_PATH: Final = "/admin/deferred-operations"
ADAPTERS_PATH: Final = "/admin/adapters"
# Seconds between self-refreshes of pages that show running work or a cleanup still in doubt.
LIST_REFRESH_SECONDS: Final = 5
DETAIL_REFRESH_SECONDS: Final = 2
# The scope values CONTRACT §7 keeps in durable metadata; every other key is shown by its name only.
_KEPT_VALUES: Final = frozenset(
    {"service_uuids", "manufacturer_ids", "vid_pid", "service_types", "min_rssi_dbm"}
)
_SCOPE_VALUES: Final = 8  # values of one filter a detail page names; the rest are counted
PAGE_SIZE: Final = 200  # the most the host's listing hands out at once (CONTRACT §9)
IDLE_TIMEOUT: Final = timedelta(hours=8)
ABSOLUTE_TIMEOUT: Final = timedelta(hours=24)
SIGN_IN_NONCE_SECONDS: Final = 900
MAX_SESSIONS: Final = 256
MAX_FORM_BYTES: Final = 4096
STATUSES: Final = (
    "pending",
    "running",
    "completed",
    "failed",
    "timed-out",
    "cancelled",
    "expired",
    "unknown",
)
TERMINAL: Final = frozenset(status.value for status in TERMINAL_STATUSES)
_MAX_TEXT = 256
# Characters a page would render invisibly or that reorder text (bidi overrides are `Cf`).
_HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
_STATIC = Path(__file__).resolve().parent / "static"

SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not `no-referrer`: under it browsers send `Origin: null` on form POSTs, which the origin check refuses.
    "Referrer-Policy": "same-origin",
}


class OperatorViews(Protocol):
    """The host's operator surface the console renders (`HostService`)."""

    async def operator_list(
        self, operator: Principal, status: str | None = None, *, after: str | None = None, limit: int = ...
    ) -> Done: ...
    async def operator_detail(self, operator: Principal, op_id: str) -> Done: ...
    async def operator_poll(self, operator: Principal, op_id: str) -> Done: ...
    async def operator_cancel(self, operator: Principal, op_id: str) -> Done: ...


# ---- sessions (no I/O; `now` is passed in) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One signed-in operator browser; the token is kept only to call the host's operator views."""

    principal_id: str
    token: str
    csrf_token: str
    created_at: datetime
    last_seen_at: datetime
    notice: str | None = None

    def __repr__(self) -> str:
        return f"ConsoleSession(principal_id={self.principal_id!r})"


def _key(cookie: str) -> str:
    """Sessions are stored under the SHA-256 of their cookie value, never the value itself."""
    return hashlib.sha256(cookie.encode("utf-8")).hexdigest()


class ConsoleSessions:
    """Server-side operator sessions with idle and absolute expiry and a bounded population."""

    def __init__(
        self,
        *,
        idle: timedelta = IDLE_TIMEOUT,
        absolute: timedelta = ABSOLUTE_TIMEOUT,
        capacity: int = MAX_SESSIONS,
        entropy: Callable[[int], str] = secrets.token_urlsafe,
    ) -> None:
        self.idle = idle
        self.absolute = absolute
        self._capacity = capacity
        self._entropy = entropy
        self._sessions: dict[str, ConsoleSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, principal_id: str, token: str, now: datetime) -> tuple[str, ConsoleSession]:
        """A new session; returns the cookie value (shown to the browser only) and the session."""
        self.expire(now)
        while len(self._sessions) >= self._capacity:
            oldest = min(self._sessions, key=lambda k: self._sessions[k].last_seen_at)
            del self._sessions[oldest]
        cookie = self._entropy(32)
        session = ConsoleSession(principal_id, token, self._entropy(32), now, now)
        self._sessions[_key(cookie)] = session
        return cookie, session

    def find(self, cookie: str | None, now: datetime) -> ConsoleSession | None:
        """The live session behind a cookie (its idle clock restarts), else None."""
        if not cookie:
            return None
        key = _key(cookie)
        session = self._sessions.get(key)
        if session is None:
            return None
        if self._expired(session, now):
            del self._sessions[key]
            return None
        touched = replace(session, last_seen_at=now)
        self._sessions[key] = touched
        return touched

    def close(self, cookie: str | None) -> None:
        """End a session (sign-out, or its operator lost the role)."""
        if cookie:
            self._sessions.pop(_key(cookie), None)

    def put_notice(self, cookie: str, notice: str) -> None:
        """Remember one message for the next page of this session (post-redirect-get)."""
        key = _key(cookie)
        if key in self._sessions:
            self._sessions[key] = replace(self._sessions[key], notice=notice)

    def take_notice(self, cookie: str) -> str | None:
        """The pending message of a session, once."""
        key = _key(cookie)
        session = self._sessions.get(key)
        if session is None or session.notice is None:
            return None
        self._sessions[key] = replace(session, notice=None)
        return session.notice

    def expire(self, now: datetime) -> int:
        """Drop every session past its idle or absolute limit; returns how many."""
        stale = [key for key, session in self._sessions.items() if self._expired(session, now)]
        for key in stale:
            del self._sessions[key]
        return len(stale)

    def _expired(self, session: ConsoleSession, now: datetime) -> bool:
        return now - session.last_seen_at >= self.idle or now - session.created_at >= self.absolute


def csrf_matches(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of a CSRF token."""
    return bool(presented) and hmac.compare_digest(expected.encode(), (presented or "").encode())


# ---- what a page may show ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperationView:
    """The whitelisted, text-only durable fields of one operation."""

    operation_id: str
    href: str
    operation_kind: str
    capability_id: str
    owner_module_id: str
    owner: str
    status: str
    status_text: str
    status_class: str
    terminal: bool
    created_at: str
    updated_at: str
    retry_after: str
    next_poll_at: str
    expires_at: str
    attempts: str
    cancelable: bool
    cancelability: str
    cancellation: str
    cleanup: str
    outcome: str
    disclosed_count: int | None
    correlation_id: str
    action: str = ""
    transport: str = "-"
    window: str = "-"
    adapter: str = "-"
    route: str = "host"
    cleanup_state: str = ""
    in_registry: bool = True
    scope: str = ""

    @property
    def short_id(self) -> str:
        """The last 8 characters: what tells two operations apart in a list."""
        return self.operation_id[-8:]

    @property
    def id_head(self) -> str:
        """The rest of the id, kept in the page (for copy and screen readers) but not shown in lists."""
        return self.operation_id[:-8]

    @property
    def live(self) -> bool:
        """True while the page should refresh: running work, or a cleanup not yet confirmed."""
        return not self.terminal or self.cleanup_state in ("pending", "uncertain")


@dataclass(frozen=True, slots=True)
class HistoryView:
    """One status-history event: its digest only."""

    seq: str
    at: str
    status: str
    digest: str


def _text(value: Any) -> str:
    """A scalar as bounded, visible text; anything structured is not shown."""
    if value is None or isinstance(value, (dict, list, tuple, set)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, str)):
        return visible(str(value)[:_MAX_TEXT])
    return ""


def visible(text: str) -> str:
    """Caller text that cannot mislead: C0 controls and DEL as their control pictures (ESC as `␛`), and
    format, bidi and other invisible characters (U+202E, U+200B, C1 controls) as `\\uXXXX`."""
    if text.isprintable():
        return text
    shown = []
    for char in text:
        point = ord(char)
        if point < 0x20:
            shown.append(chr(0x2400 + point))
        elif point == 0x7F:
            shown.append("\u2421")
        elif unicodedata.category(char) in _HIDDEN_CATEGORIES:
            shown.append(f"\\u{point:04x}")
        else:
            shown.append(char)
    return "".join(shown)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def operation_href(operation_id: str) -> str:
    """The console path of one operation."""
    return f"{LIST_PATH}/{quote(operation_id, safe='')}"


def _status_text(status: str, cancellation: Mapping[str, Any]) -> tuple[str, str]:
    """What the status badge says, and its style class."""
    if status in ("pending", "running") and cancellation.get("state") == "requested":
        return f"{status}, cancellation requested", "cancelling"
    if status in STATUSES:
        return status, status
    return "unrecognised", "unknown"


def _cancellation_text(cancellation: Mapping[str, Any]) -> str:
    state = _text(cancellation.get("state"))
    if not state:
        return ""
    if state == "requested":
        return f"cancellation requested at {_text(cancellation.get('requested_at'))}"
    if state == "confirmed":
        return f"cancellation confirmed at {_text(cancellation.get('confirmed_at'))}"
    return f"cancellation {state}"


def _cleanup_text(cleanup: Mapping[str, Any]) -> str:
    state, claim = _text(cleanup.get("state")), _text(cleanup.get("claim"))
    return f"{state}, claim {claim}" if state and claim else state


def _cancelability(record: Mapping[str, Any]) -> tuple[bool, str]:
    cancelable = record.get("cancelable") is True
    if cancelable:
        return True, "yes"
    reason = _text(record.get("cancel/unavailable-reason"))
    return False, f"no: {reason}" if reason else "no"


_ROUTES: Final[Mapping[str, str]] = {"host": "host", "bus": "Bus", "connector": "connector"}


def _columns(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """Transport, window and adapter from the operator row's columns (`-` where there is none)."""
    window = record.get("window_seconds")
    window_text = f"{window} s" if isinstance(window, int) and not isinstance(window, bool) else "-"
    return _text(record.get("transport")) or "-", window_text, _text(record.get("adapter")) or "-"


def _scope_text(metadata: Mapping[str, Any]) -> str:
    """Which filters a scan used: kept values by name and number (`Heart Rate (180d)`), prefixes only by key
    name, exclusions and limits."""
    scope = metadata.get("scope")
    if not isinstance(scope, Mapping):
        return ""
    filters = _mapping(scope.get("filters"))
    parts = [_filter_text(key, value) for key, value in filters.items() if key in ALL_FILTER_KEYS]
    redacted = scope.get("filters_redacted")
    if isinstance(redacted, list):
        parts += [f"{key} (value not kept)" for key in redacted if key in ALL_FILTER_KEYS]
    text = "filters: " + ("; ".join(parts) or "none")
    exclusions = scope.get("exclusions")
    if isinstance(exclusions, list) and exclusions:
        text += "; excluding by " + ", ".join(key for key in exclusions if key in ALL_FILTER_KEYS)
    limit = _mapping(scope.get("limits")).get("max_candidates")
    if isinstance(limit, int) and not isinstance(limit, bool):
        text += f"; at most {limit} candidates"
    return text


def _filter_text(key: str, value: Any) -> str:
    """One filter of a redacted scope: the values CONTRACT §7 keeps, named where bleak's tables know them;
    any other key by its name only (whatever the metadata holds)."""
    if key not in _KEPT_VALUES:
        if not isinstance(value, list):
            return key
        return f"{key} ({len(value)} value{'s' if len(value) != 1 else ''})"
    if not isinstance(value, list):
        return f"{key} {_text(value)}" if isinstance(value, int) and not isinstance(value, bool) else key
    shown = [_filter_value(key, item) for item in value[:_SCOPE_VALUES]]
    more = f" and {len(value) - _SCOPE_VALUES} more" if len(value) > _SCOPE_VALUES else ""
    return f"{key}: {', '.join(shown)}{more}"


def _filter_value(key: str, item: Any) -> str:
    if key == "service_uuids" and isinstance(item, str):
        return visible(uuid_label(item[:64]))
    if key == "manufacturer_ids" and isinstance(item, int) and not isinstance(item, bool):
        return company_label(item)
    if key == "vid_pid" and isinstance(item, Mapping):
        vid, pid = item.get("vid"), item.get("pid")
        if isinstance(vid, int) and isinstance(pid, int):
            return f"{vid:04x}:{pid:04x}"
    return _text(item) if not isinstance(item, (dict, list)) else "?"


def operation_view(record: Mapping[str, Any]) -> OperationView:
    """The fields a console page shows of an operator view document, and nothing else."""
    metadata = _mapping(record.get("metadata"))
    transport, window, adapter = _columns(record)
    cleanup_state = _text(_mapping(metadata.get("cleanup")).get("state"))
    route = _ROUTES.get(_text(record.get("route")), "host")
    cancellation = _mapping(metadata.get("cancellation"))
    status = _text(record.get("status"))
    status_text, status_class = _status_text(status, cancellation)
    cancelable, cancelability = _cancelability(record)
    if status_class == "cancelling":
        cancelable, cancelability = False, "no: cancellation already requested"
    retry = record.get("retry_after_seconds")
    disclosed = metadata.get("disclosed_count")
    operation_id = _text(record.get("operation/id"))
    return OperationView(
        operation_id=operation_id,
        href=operation_href(operation_id),
        operation_kind=_text(record.get("operation/kind")),
        capability_id=_text(record.get("capability_id")),
        owner_module_id=_text(record.get("owner_module_id")),
        owner=_text(record.get("owner")),
        status=status,
        status_text=status_text,
        status_class=status_class,
        terminal=status in TERMINAL,
        created_at=_text(record.get("created_at")),
        updated_at=_text(record.get("updated_at")),
        retry_after=f"{retry} s" if isinstance(retry, int) and not isinstance(retry, bool) else "-",
        next_poll_at=_text(record.get("next_poll_at")) or "-",
        expires_at=_text(record.get("expires_at")),
        attempts=_text(record.get("attempts")),
        cancelable=cancelable,
        cancelability=cancelability,
        cancellation=_cancellation_text(cancellation),
        cleanup=_cleanup_text(_mapping(metadata.get("cleanup"))),
        outcome=_text(record.get("outcome")),
        disclosed_count=disclosed if isinstance(disclosed, int) and not isinstance(disclosed, bool) else None,
        correlation_id=_text(record.get("correlation/id")),
        action=_text(record.get("capability_id")),
        transport=transport,
        window=window,
        adapter=adapter,
        route=route,
        cleanup_state=cleanup_state,
        in_registry=route != "connector",
        scope=_scope_text(metadata),
    )


def history_views(events: Any) -> list[HistoryView]:
    """The status-history events of a detail document (digests only)."""
    if not isinstance(events, list):
        return []
    return [
        HistoryView(_text(e.get("seq")), _text(e.get("at")), _text(e.get("status")), _text(e.get("digest")))
        for e in events
        if isinstance(e, Mapping)
    ]


# ---- HTTP -------------------------------------------------------------------------------------------------


def breakable(value: Any) -> Markup:
    """An id or code that may wrap only after its `:` separators (never inside a token), escaped."""
    return Markup(":<wbr>").join(escape(part) for part in str(value).split(":"))


def relative_time(value: Any, now: datetime | None) -> Markup:
    """A `<time>` reading `3 min ago` (or `in 5 min`) with the absolute time on hover; `-` for none."""
    text = _text(value)
    if not text or text == "-":
        return Markup("-")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return Markup(escape(text))
    shown = text if now is None else _ago(int((now - moment).total_seconds()))
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(text, shown)


def _ago(seconds: int) -> str:
    """`12 s ago`, `3 min ago`, `2 h ago`, `4 d ago`; a future moment as `in ...`."""
    span = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if span >= size:
            amount = f"{span // size} {unit}"
            break
    else:
        amount = f"{span} s"
    return f"{amount} ago" if seconds >= 0 else f"in {amount}"


def _environment() -> Environment:
    """Jinja2 over the package's templates, autoescaping everything, failing on undefined names."""
    environment = Environment(
        loader=PackageLoader("connector.api", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["breakable"] = breakable
    environment.filters["relative"] = relative_time
    return environment


@dataclass(frozen=True, slots=True)
class AdapterView:
    """One (transport, adapter) claim row of `/admin/adapters`."""

    transport: str
    adapter: str
    state: str
    text: str
    uncertain: tuple[tuple[str, str, str, str], ...]  # (operation id, href, since, next retry)


def _ms_text(value: int | None) -> str:
    return "-" if value is None else format_ms(value)


def adapter_view(claim: AdapterClaim) -> AdapterView:
    """What the adapters page says of one claim."""
    if claim.uncertain:
        text = f"held by {len(claim.uncertain)} uncertain cleanup(s)"
    elif claim.sessions:
        text = f"in use by {claim.sessions} session(s)"
    else:
        text = "free"
    rows = tuple(
        (u.operation_id, operation_href(u.operation_id), _ms_text(u.since_ms), _ms_text(u.next_retry_ms))
        for u in claim.uncertain
    )
    return AdapterView(claim.transport, claim.adapter, claim.state.replace(" ", "-"), text, rows)


@dataclass(frozen=True, slots=True)
class _Context:
    """A request with a live session."""

    cookie: str
    session: ConsoleSession


class _Console:
    """The console's request handlers over the host's operator views."""

    def __init__(
        self,
        host: OperatorViews,
        authenticate: Callable[[str | None], Principal],
        clock: Callable[[], datetime],
        sessions: ConsoleSessions,
        operations: ConnectorOperations | None = None,
        backends: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.operations = operations
        self.banner = backend_banner(backends or {})
        self.authenticate = authenticate
        self.clock = clock
        self.sessions = sessions
        self.templates = _environment()

    # ---- rendering ----

    def render(self, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """A page with the console's security headers."""
        context.setdefault("operator", None)
        context.setdefault("csrf_token", "")
        context.setdefault("now", self.clock())
        context.setdefault("banner", self.banner)
        context.setdefault("notice", None)
        context.setdefault("refresh_seconds", None)
        body = self.templates.get_template(f"console/{name}").render(**context)
        return HTMLResponse(body, status_code=status_code, headers=dict(SECURITY_HEADERS))

    def problem(
        self, status_code: int, heading: str, explanation: str, ctx: _Context | None = None
    ) -> HTMLResponse:
        """An error page (fixed text only)."""
        signed_in = (
            {"operator": ctx.session.principal_id, "csrf_token": ctx.session.csrf_token} if ctx else {}
        )
        back = (LIST_PATH, "Back to the operations") if ctx else (SIGN_IN_PATH, "Sign in")
        return self.render(
            "error.html",
            status_code,
            heading=heading,
            explanation=explanation,
            back_href=back[0],
            back_label=back[1],
            **signed_in,
        )

    def page(self, name: str, ctx: _Context, **context: Any) -> HTMLResponse:
        """A page for a signed-in operator, with its pending notice."""
        notice = self.sessions.take_notice(ctx.cookie)
        return self.render(
            name,
            operator=ctx.session.principal_id,
            csrf_token=ctx.session.csrf_token,
            notice=notice,
            **context,
        )

    # ---- sessions ----

    def context(self, request: Request) -> _Context | None:
        """The request's live session, if any."""
        cookie = request.cookies.get(SESSION_COOKIE)
        session = self.sessions.find(cookie, self.clock())
        return _Context(cookie, session) if cookie and session else None

    def sign_in_page(self, problem: str | None = None, status_code: int = 200) -> HTMLResponse:
        """The sign-in form with a fresh double-submit nonce."""
        nonce = secrets.token_urlsafe(32)
        response = self.render(
            "sign_in.html",
            status_code,
            sign_in_nonce=nonce,
            problem=problem,
            idle_hours=int(self.sessions.idle.total_seconds() // 3600),
        )
        _set_cookie(response, SIGN_IN_COOKIE, nonce, path=SIGN_IN_PATH, max_age=SIGN_IN_NONCE_SECONDS)
        return response

    async def sign_in(self, request: Request) -> Response:
        """Check the nonce, authenticate the pasted token, require the operator role, open a session."""
        refused = _cross_site(request)
        form = await _form(request)
        nonce = request.cookies.get(SIGN_IN_COOKIE, "")
        if refused or not nonce or not csrf_matches(nonce, form.get("csrf_token")):
            return self.problem(403, "Sign-in refused", "The sign-in form expired or came from elsewhere.")
        try:
            principal = self.authenticate(form.get("token") or None)
        except SensoriumError:
            return self.sign_in_page("This token was not accepted.", status_code=401)
        if principal.role != "operator" or principal.revoked:
            return self.sign_in_page("This token is not an operator's: callers cannot sign in.", 403)
        cookie, _ = self.sessions.open(principal.principal_id, form["token"], self.clock())
        response = _redirect(LIST_PATH)
        _set_cookie(response, SESSION_COOKIE, cookie, path=COOKIE_PATH, max_age=None)
        response.delete_cookie(SIGN_IN_COOKIE, path=SIGN_IN_PATH, httponly=True, samesite="strict")
        return response

    def sign_out(self, ctx: _Context) -> Response:
        """End the session and clear its cookie."""
        self.sessions.close(ctx.cookie)
        return self.signed_out()

    def signed_out(self, cookie: str | None = None) -> Response:
        """Back to the sign-in page without a session cookie."""
        self.sessions.close(cookie)
        response = _redirect(SIGN_IN_PATH)
        response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
        return response

    async def checked_post(self, request: Request) -> _Context | Response:
        """A form POST's live session after its CSRF and origin checks, else the response refusing it."""
        ctx = self.context(request)
        if ctx is None:
            return self.signed_out()
        form = await _form(request)
        if _cross_site(request) or not csrf_matches(ctx.session.csrf_token, form.get("csrf_token")):
            return self.problem(403, "Request refused", "The form is missing its CSRF token.", ctx)
        return ctx

    # ---- host replies ----

    def refused(self, error: SensoriumError, ctx: _Context) -> Response:
        """A host refusal as a page (its code, never its message); lost authority ends the session."""
        error = public_refusal(error)
        if error.http_status in (401, 403):
            return self.signed_out(ctx.cookie)
        if error.http_status == 404:
            return self.problem(404, "Not found", "No deferred operation with this id.", ctx)
        return self.problem(error.http_status, "Request failed", f"The host answered {error.code}.", ctx)

    async def list_page(self, request: Request, ctx: _Context) -> Response:
        """GET the list (newest first, a page at a time) with an optional status filter."""
        status = request.query_params.get("status") or None
        after = request.query_params.get("after") or None
        if status is not None and status not in STATUSES:
            return self.problem(400, "Unknown status", "Choose one of the listed statuses.", ctx)
        try:
            operator = self.authenticate(ctx.session.token)  # once per page, before the host is asked
            listing = await self.host.operator_list(operator, status, after=after, limit=PAGE_SIZE)
        except SensoriumError as error:
            return self.refused(error, ctx)
        body = _mapping(listing.document)
        rows = body.get("operations")
        operations = (
            [operation_view(r) for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []
        )
        live = any(op.live for op in operations)
        return self.page(
            "list.html",
            ctx,
            operations=operations,
            statuses=STATUSES,
            selected_status=status or "",
            older_href=_older_href(status, body.get("next_after")),
            refresh_seconds=LIST_REFRESH_SECONDS if live else None,
        )

    async def adapters_page(self, ctx: _Context) -> Response:
        """GET `/admin/adapters`: each (transport, adapter) claim (operators only)."""
        try:
            authority_check = self.authenticate(ctx.session.token)
        except SensoriumError:
            return self.signed_out(ctx.cookie)
        if authority_check.role != "operator" or authority_check.revoked:
            return self.signed_out(ctx.cookie)
        claims = [] if self.operations is None else [adapter_view(c) for c in self.operations.claims()]
        busy = any(c.state != "free" for c in claims)
        return self.page(
            "adapters.html", ctx, claims=claims, refresh_seconds=LIST_REFRESH_SECONDS if busy else None
        )

    async def detail_page(self, ctx: _Context, op_id: str) -> Response:
        """GET one operation's durable view and history digests."""
        try:
            detail = await self.host.operator_detail(self.authenticate(ctx.session.token), op_id)
        except SensoriumError as error:
            return self.refused(error, ctx)
        body = _mapping(detail.document)
        view = operation_view(_mapping(body.get("operation")))
        return self._detail(ctx, view, history_views(body.get("history")))

    def _detail(self, ctx: _Context, view: OperationView, history: list[HistoryView]) -> Response:
        refresh = DETAIL_REFRESH_SECONDS if view.live else None
        return self.page("detail.html", ctx, op=view, history=history, refresh_seconds=refresh)

    async def act(self, request: Request, op_id: str, action: str) -> Response:
        """POST poll-now or cancel, then back to the detail page with what the host answered."""
        ctx = await self.checked_post(request)
        if isinstance(ctx, Response):
            return ctx
        call = self.host.operator_poll if action == "poll" else self.host.operator_cancel
        try:
            answered: Done | SensoriumError = await call(self.authenticate(ctx.session.token), op_id)
        except SensoriumError as error:
            answered = public_refusal(error)
            if answered.http_status in (401, 403, 404):
                return self.refused(answered, ctx)
        self.sessions.put_notice(ctx.cookie, _action_notice(action, answered))
        return _redirect(operation_href(op_id))


def _older_href(status: str | None, cursor: Any) -> str | None:
    """The link to the next (older) page, keeping the status filter."""
    if not isinstance(cursor, str) or not cursor:
        return None
    query = f"after={quote(cursor, safe='')}"
    return f"{LIST_PATH}?{'status=' + quote(status, safe='') + '&' if status else ''}{query}"


def _action_notice(action: str, answered: Done | SensoriumError) -> str:
    """Fixed text for what a poll or cancel answered (a status or a code, never a value)."""
    label = "Poll" if action == "poll" else "Cancel"
    if isinstance(answered, SensoriumError):
        return f"{label} refused: {answered.code}."
    view = operation_view(_mapping(_mapping(answered.document).get("operation")))
    return f"{label} requested; the host answered: {view.status_text}."


def _redirect(path: str) -> RedirectResponse:
    """A 303 See Other carrying the console's security headers."""
    response = RedirectResponse(path, status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


def _set_cookie(response: Response, name: str, value: str, *, path: str, max_age: int | None) -> None:
    # No `Secure`: the console is served over plain http on loopback (see the header of this file).
    response.set_cookie(name, value, max_age=max_age, path=path, httponly=True, samesite="strict")


def _cross_site(request: Request) -> bool:
    """True when the browser says the POST came from another origin."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return origin != f"{request.url.scheme}://{request.headers.get('host', '')}"


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (first value of each field); anything else reads as empty."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if content_type != "application/x-www-form-urlencoded" or len(body) > MAX_FORM_BYTES:
        return {}
    try:
        fields = parse_qs(
            body.decode("utf-8"), keep_blank_values=True, max_num_fields=8, strict_parsing=False
        )
    except (UnicodeDecodeError, ValueError):
        return {}
    return {name: values[0] for name, values in fields.items() if values}


def backend_banner(backends: Mapping[str, str]) -> str:
    """What the banner says when transports are not real hardware (transport -> `simulated`/`replayed`)."""
    parts = []
    sources = (("simulated", "scripted through /v1/sim/..."), ("replayed", "played from a recording"))
    for mode, source in sources:
        named = sorted(t for t, m in backends.items() if m == mode)
        if named:
            parts.append(f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} {mode} ({source})")
    return "; ".join(parts) + ": these devices are not real hardware." if parts else ""


def console_router(
    host: OperatorViews,
    *,
    authenticate: Callable[[str | None], Principal],
    clock: Callable[[], datetime] = wall_clock,
    sessions: ConsoleSessions | None = None,
    operations: ConnectorOperations | None = None,
    backends: Mapping[str, str] | None = None,
) -> APIRouter:
    """The HTML operator console under `/admin/`; `backends` names transports that are simulated or
    replayed (a banner on every page says so)."""
    console = _Console(host, authenticate, clock, sessions or ConsoleSessions(), operations, backends)
    router = APIRouter(include_in_schema=False)
    css = (_STATIC / "console.css").read_bytes()

    @router.get("/admin/static/console.css")
    async def stylesheet() -> Response:
        """The console's only stylesheet."""
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @router.get("/admin")
    @router.get("/admin/")
    async def home(request: Request) -> Response:
        """The list is the console's home."""
        return _redirect(LIST_PATH if console.context(request) else SIGN_IN_PATH)

    @router.get(SIGN_IN_PATH)
    async def sign_in_form(request: Request) -> Response:
        """The sign-in form (signed-in browsers go to the list)."""
        return _redirect(LIST_PATH) if console.context(request) else console.sign_in_page()

    @router.post(SIGN_IN_PATH)
    async def sign_in(request: Request) -> Response:
        """Exchange an operator token for a session cookie."""
        return await console.sign_in(request)

    @router.post("/admin/sign-out")
    async def sign_out(request: Request) -> Response:
        """End the session (CSRF-checked)."""
        ctx = await console.checked_post(request)
        return ctx if isinstance(ctx, Response) else console.sign_out(ctx)

    @router.get(LIST_PATH)
    async def operation_list(request: Request) -> Response:
        """The list with a status filter."""
        ctx = console.context(request)
        return await console.list_page(request, ctx) if ctx else console.signed_out()

    @router.get(ADAPTERS_PATH)
    async def adapters(request: Request) -> Response:
        """Each (transport, adapter) claim: free, in use, or held by an uncertain cleanup."""
        ctx = console.context(request)
        return await console.adapters_page(ctx) if ctx else console.signed_out()

    @router.get(LIST_PATH + "/{op_id}")
    async def operation(request: Request, op_id: str) -> Response:
        """One operation's durable view."""
        ctx = console.context(request)
        return await console.detail_page(ctx, op_id) if ctx else console.signed_out()

    @router.post(LIST_PATH + "/{op_id}/poll")
    async def poll_now(request: Request, op_id: str) -> Response:
        """Poll the owning connector now."""
        return await console.act(request, op_id, "poll")

    @router.post(LIST_PATH + "/{op_id}/cancel")
    async def cancel(request: Request, op_id: str) -> Response:
        """Request cancellation (bridged only where the operation has a cancel surface)."""
        return await console.act(request, op_id, "cancel")

    return router
