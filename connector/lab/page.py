"""`/lab`: the federated view's page, with the console's sign-in, cookie and CSRF machinery (CONTRACT §15).

Rules of this file:
- a lab operator signs in with a token of the view's own principals file (`<D>/principals.json`), re-checked
  on every request, so a revoked lab operator loses the view at once;
- the page renders the pure `LabTable` only (durable fields as text); it refreshes itself;
- a cancel is forwarded as the owning node's `admin.cancel` with that node's token; what the node answered is
  shown and audited (a status or an error code, never more).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.responses import HTMLResponse, RedirectResponse, Response

import connector.api.console as console
from connector.api.console import SECURITY_HEADERS, STATUSES, ConsoleSessions, breakable, csrf_matches
from connector.core.authority import Principal
from connector.core.lab import LabTable
from connector.errors import SensoriumError
from connector.lab.audit import AuditEntry, AuditLog, answer_text
from connector.storage.principals import PrincipalDirectory

LAB_PATH: Final = "/lab"
SIGN_IN_PATH: Final = "/lab/sign-in"
SESSION_COOKIE: Final = "sensorium_lab"
SIGN_IN_COOKIE: Final = "sensorium_lab_sign_in"
REFRESH_SECONDS: Final = 2
# Rows per page of the table: a lab holds thousands of operations, a page stays quick to render and to read.
PAGE_ROWS: Final = 200
_CONSOLE_CSS = Path(console.__file__).resolve().parent / "static" / "console.css"
_LAB_CSS = Path(__file__).resolve().parent / "static" / "lab.css"


def _environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("connector.lab", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["breakable"] = breakable
    environment.filters["when"] = _when
    return environment


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


class Forwarder(Protocol):
    """What the page needs of the NATS side (`LabFollower`): a node's `admin.cancel` answer."""

    async def cancel(self, name: str, operation_id: str) -> dict[str, Any]: ...


class LabPage:
    """The page's handlers over the table, the follower, the principals file and the audit log."""

    def __init__(
        self,
        table: LabTable,
        follower: Forwarder,
        principals: PrincipalDirectory,
        audit: AuditLog,
        clock: Callable[[], datetime],
    ) -> None:
        self.table = table
        self.follower = follower
        self.principals = principals
        self.audit = audit
        self.clock = clock
        self.sessions = ConsoleSessions()
        self.templates = _environment()

    def render(self, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """A page with the console's security headers."""
        body = self.templates.get_template(f"lab/{name}").render(**context)
        return HTMLResponse(body, status_code=status_code, headers=dict(SECURITY_HEADERS))

    def operator(self, request: Request) -> tuple[str, console.ConsoleSession] | None:
        """The request's live session whose token is still a lab operator's."""
        cookie = request.cookies.get(SESSION_COOKIE)
        session = self.sessions.find(cookie, self.clock())
        if not cookie or session is None or self._principal(session.token) is None:
            return None
        return cookie, session

    def _principal(self, token: str | None) -> Principal | None:
        self.principals.reload_if_changed()
        try:
            principal = self.principals.authenticate(token)
        except SensoriumError:
            return None
        return principal if principal.role == "operator" and not principal.revoked else None

    def sign_in_page(self, problem: str | None = None, status_code: int = 200) -> HTMLResponse:
        """The sign-in form with a fresh double-submit nonce."""
        nonce = secrets.token_urlsafe(32)
        response = self.render("sign_in.html", status_code, sign_in_nonce=nonce, problem=problem)
        console._set_cookie(response, SIGN_IN_COOKIE, nonce, path=SIGN_IN_PATH, max_age=900)
        return response

    async def sign_in(self, request: Request) -> Response:
        """Check the nonce, require a lab operator's token, open a session."""
        refused = console._cross_site(request)
        form = await console._form(request)
        nonce = request.cookies.get(SIGN_IN_COOKIE, "")
        if refused or not nonce or not csrf_matches(nonce, form.get("csrf_token")):
            return self.render("sign_in.html", 403, sign_in_nonce="", problem="The sign-in form expired.")
        principal = self._principal(form.get("token") or None)
        if principal is None:
            return self.sign_in_page("This token is not a lab operator's.", status_code=401)
        cookie, _ = self.sessions.open(principal.principal_id, form["token"], self.clock())
        response = _redirect(LAB_PATH)
        console._set_cookie(response, SESSION_COOKIE, cookie, path=LAB_PATH, max_age=None)
        response.delete_cookie(SIGN_IN_COOKIE, path=SIGN_IN_PATH, httponly=True, samesite="strict")
        return response

    def signed_out(self, cookie: str | None = None) -> Response:
        """Back to the sign-in page without a session cookie."""
        self.sessions.close(cookie)
        response = _redirect(SIGN_IN_PATH)
        response.delete_cookie(SESSION_COOKIE, path=LAB_PATH, httponly=True, samesite="strict")
        return response

    async def checked_post(
        self, request: Request
    ) -> tuple[str, console.ConsoleSession, dict[str, str]] | Response:
        """A form POST's live session and form after its CSRF and origin checks, else the refusal."""
        found = self.operator(request)
        if found is None:
            return self.signed_out(request.cookies.get(SESSION_COOKIE))
        form = await console._form(request)
        if console._cross_site(request) or not csrf_matches(found[1].csrf_token, form.get("csrf_token")):
            return self.render("error.html", 403, heading="Request refused", explanation="No CSRF token.")
        return found[0], found[1], form

    def view(self, request: Request, cookie: str, session: console.ConsoleSession) -> Response:
        """GET `/lab?node=&status=`: the node lines and the merged table."""
        node = request.query_params.get("node") or None
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            status = None
        now = self.clock()
        rows = self.table.table(now, node=node, status=status)
        pages = max(1, -(-len(rows) // PAGE_ROWS))
        number = min(_page_number(request.query_params.get("page")), pages)
        shown = rows[(number - 1) * PAGE_ROWS : number * PAGE_ROWS]
        query = {"node": node or "", "status": status or ""}
        return self.render(
            "lab.html",
            operator=session.principal_id,
            csrf_token=session.csrf_token,
            notice=self.sessions.take_notice(cookie),
            lines=self.table.lines(now),
            rows=shown,
            total=len(rows),
            first=(number - 1) * PAGE_ROWS + 1,
            page=number,
            pages=pages,
            previous_href=_page_href(query, number - 1) if number > 1 else None,
            next_href=_page_href(query, number + 1) if number < pages else None,
            nodes=self.table.nodes(),
            statuses=STATUSES,
            selected_node=node or "",
            selected_status=status or "",
            refresh_seconds=REFRESH_SECONDS,
        )

    async def cancel(self, request: Request) -> Response:
        """POST `/lab/cancel`: the owning node's `admin.cancel` with its token; its answer shown, audited."""
        checked = await self.checked_post(request)
        if isinstance(checked, Response):
            return checked
        cookie, session, form = checked
        node, operation_id = form.get("node", ""), form.get("operation", "")
        if node not in self.table.nodes() or not operation_id:
            return self.render("error.html", 400, heading="Unknown row", explanation="Choose a listed row.")
        answer = await self.follower.cancel(node, operation_id)
        text = answer_text(answer)
        self.audit.append(AuditEntry(self.clock(), session.principal_id, node, operation_id, text))
        self.sessions.put_notice(cookie, f"Cancel forwarded to node {node}; the node answered: {text}.")
        return _redirect(LAB_PATH)


def _page_number(value: str | None) -> int:
    """A 1-based page number from the query (anything else is page 1)."""
    return (
        int(value) if value is not None and value.isdigit() and 0 < len(value) < 7 and int(value) > 0 else 1
    )


def _page_href(query: dict[str, str], number: int) -> str:
    """The link to another page of the same filters."""
    return f"{LAB_PATH}?{urlencode({**query, 'page': str(number)})}"


def _redirect(path: str) -> RedirectResponse:
    response = RedirectResponse(path, status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


def lab_app(page: LabPage) -> FastAPI:
    """The view's HTTP app: `/lab` and its sign-in (no API of its own)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    router = APIRouter(include_in_schema=False)
    css = _CONSOLE_CSS.read_bytes() + b"\n" + _LAB_CSS.read_bytes()

    @router.get("/lab/static/lab.css")
    async def stylesheet() -> Response:
        """The console's stylesheet and the lab's few rules."""
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @router.get("/")
    async def home() -> Response:
        """The view lives at `/lab`."""
        return _redirect(LAB_PATH)

    @router.get(LAB_PATH)
    async def lab(request: Request) -> Response:
        """The node lines and the table (signed-in lab operators)."""
        found = page.operator(request)
        return page.view(request, *found) if found else page.signed_out(request.cookies.get(SESSION_COOKIE))

    @router.get(SIGN_IN_PATH)
    async def sign_in_form(request: Request) -> Response:
        """The sign-in form."""
        return _redirect(LAB_PATH) if page.operator(request) else page.sign_in_page()

    @router.post(SIGN_IN_PATH)
    async def sign_in(request: Request) -> Response:
        """Exchange a lab operator token for a session cookie."""
        return await page.sign_in(request)

    @router.post("/lab/sign-out")
    async def sign_out(request: Request) -> Response:
        """End the session (CSRF-checked)."""
        checked = await page.checked_post(request)
        return checked if isinstance(checked, Response) else page.signed_out(checked[0])

    @router.post("/lab/cancel")
    async def cancel(request: Request) -> Response:
        """Forward a cancel to the owning node."""
        return await page.cancel(request)

    app.include_router(router)
    return app
