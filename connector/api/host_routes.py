"""HTTP face of the reference host: `/v1/host/*` for callers, `/v1/admin/deferred-operations*` for operators.

Thin: every route authenticates its bearer token once, hands the principal and path to `HostService` and
maps the reply; refusals are `sensorium-error.v1` bodies like everywhere else.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from connector.api.errors import bearer_token, parse_json_body, to_response
from connector.api.openapi import ADMISSION_REFUSALS, Ok, Route, declare
from connector.core.operator_rows import CURSOR_PATTERN, DEFAULT_PAGE, MAX_PAGE
from connector.errors import Code
from connector.host.service import HostService

_AUTH = (Code.UNAUTHENTICATED, Code.INTERNAL)
_STATUS_BODIES = ("deferred-operation-status.v1", "deferred-operation-status.v2")
_OPERATOR = (*_AUTH, Code.FORBIDDEN)
ADMIT = Route(
    oks=(
        Ok(200, ("sensorium-directive-result.v1",), description="the result of a sync directive"),
        Ok(
            202,
            ("deferred-operation.v1",),
            headers=("Location", "Retry-After"),
            required_headers=("Location", "Retry-After"),
        ),
    ),
    refusals=ADMISSION_REFUSALS,
    body="sensorium-directive.v1",
)
STATUS = Route(
    oks=(Ok(200, _STATUS_BODIES, description="the live status with the host's policy fields"),),
    refusals=(*_AUTH, Code.UNKNOWN_OPERATION, Code.INVALID_INPUT),
)
CANCEL = Route(oks=(Ok(200, _STATUS_BODIES),), refusals=(*_AUTH, Code.UNKNOWN_OPERATION, Code.NOT_CANCELABLE))
OPERATOR_LIST = Route(oks=(Ok(200, ("operator-operation-list",)),), refusals=(*_OPERATOR, Code.INVALID_INPUT))
OPERATOR_DETAIL = Route(
    oks=(Ok(200, ("operator-operation-detail",)),), refusals=(*_OPERATOR, Code.UNKNOWN_OPERATION)
)
OPERATOR_CANCEL = Route(
    oks=(Ok(200, ("operator-operation-detail",)),),
    refusals=(*_OPERATOR, Code.UNKNOWN_OPERATION, Code.NOT_CANCELABLE),
)
_STATUSES = ["pending", "running", "completed", "failed", "timed-out", "cancelled", "expired", "unknown"]


def host_router(host: HostService) -> APIRouter:
    """Routes of the reference host (CONTRACT §9, "The reference host adds")."""
    router = APIRouter()

    @router.post("/v1/host/directives", **declare(ADMIT))
    async def admit(request: Request) -> Response:
        """Host admission: 202 `deferred-operation.v1` (Location, Retry-After) or the sync result."""
        principal = host.authenticate(bearer_token(request))  # CONTRACT §2 step 1, before the body
        body = parse_json_body(await request.body(), directive=True)
        return to_response(await host.admit(principal, body))

    @router.get("/v1/host/operations/{operation_id}", **declare(STATUS))
    async def status(
        request: Request,
        operation_id: str,
        wait_seconds: int | None = Query(default=None, ge=0),
        after_revision: int | None = Query(default=None, ge=0),
    ) -> Response:
        """The connector's live status with the host's policy fields (owning caller only)."""
        principal = host.authenticate(bearer_token(request))
        reply = await host.status(
            principal, operation_id, wait_seconds=wait_seconds, after_revision=after_revision
        )
        return to_response(reply)

    @router.post("/v1/host/operations/{operation_id}/cancel", **declare(CANCEL))
    async def cancel(request: Request, operation_id: str) -> Response:
        """Bridged to the connector where the handle has a `cancel_href`."""
        principal = host.authenticate(bearer_token(request))
        return to_response(await host.cancel(principal, operation_id))

    @router.get("/v1/admin/deferred-operations", **declare(OPERATOR_LIST))
    async def operator_list(
        request: Request,
        status: str | None = Query(default=None, json_schema_extra={"enum": _STATUSES}),
        after: str | None = Query(default=None, pattern=CURSOR_PATTERN),
        limit: int = Query(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE),
    ) -> Response:
        """Every operation the process knows, newest first; `after` is the previous page's `next_after`."""
        operator = host.authenticate(bearer_token(request))
        reply = await host.operator_list(operator, status, after=after, limit=limit)
        return to_response(reply)

    @router.get("/v1/admin/deferred-operations/{operation_id}", **declare(OPERATOR_DETAIL))
    async def operator_detail(request: Request, operation_id: str) -> Response:
        """Durable view, digest-only history and receipt of one operation (operators)."""
        operator = host.authenticate(bearer_token(request))
        return to_response(await host.operator_detail(operator, operation_id))

    @router.post("/v1/admin/deferred-operations/{operation_id}/poll", **declare(OPERATOR_DETAIL))
    async def operator_poll(request: Request, operation_id: str) -> Response:
        """Poll now (operators)."""
        operator = host.authenticate(bearer_token(request))
        return to_response(await host.operator_poll(operator, operation_id))

    @router.post("/v1/admin/deferred-operations/{operation_id}/cancel", **declare(OPERATOR_CANCEL))
    async def operator_cancel(request: Request, operation_id: str) -> Response:
        """Cancel where cancelable (operators)."""
        operator = host.authenticate(bearer_token(request))
        return to_response(await host.operator_cancel(operator, operation_id))

    return router
