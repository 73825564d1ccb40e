"""HTTP face of the reference host: `/v1/host/*` for callers, `/v1/admin/deferred-operations*` for operators.

Thin: every route hands its bearer token and path to `HostService` and maps the reply; refusals are
`sensorium-error.v1` bodies like everywhere else.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from connector.api.errors import bearer_token, parse_json_body, to_response
from connector.errors import SensoriumError
from connector.host.service import HostService
from connector.service.replies import error_reply

_JSON_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
}
_ERROR = {"description": "a sensorium-error.v1 refusal"}


def host_router(host: HostService) -> APIRouter:
    """Routes of the reference host (SPEC 9, "The reference host adds")."""
    router = APIRouter()

    @router.post(
        "/v1/host/directives",
        openapi_extra=_JSON_BODY,
        responses={400: _ERROR, 401: _ERROR, 403: _ERROR, 404: _ERROR, 409: _ERROR, 422: _ERROR, 429: _ERROR},
    )
    async def admit(request: Request) -> Response:
        """Host admission: 202 `deferred-operation.v1` (Location, Retry-After) or the sync result."""
        token = bearer_token(request)
        try:
            host.port.authenticate(token)  # SPEC 2 step 1 before the body is even parsed
            body = parse_json_body(await request.body(), directive=True)
        except SensoriumError as error:
            return to_response(error_reply(error))
        return to_response(await host.admit(token, body))

    @router.get("/v1/host/operations/{operation_id}", responses={401: _ERROR, 404: _ERROR})
    async def status(
        request: Request,
        operation_id: str,
        wait_seconds: int | None = Query(default=None, ge=0),
        after_revision: int | None = Query(default=None, ge=0),
    ) -> Response:
        """The connector's live status with the host's policy fields (owning caller only)."""
        reply = await host.status(
            bearer_token(request), operation_id, wait_seconds=wait_seconds, after_revision=after_revision
        )
        return to_response(reply)

    @router.post(
        "/v1/host/operations/{operation_id}/cancel", responses={401: _ERROR, 404: _ERROR, 409: _ERROR}
    )
    async def cancel(request: Request, operation_id: str) -> Response:
        """Bridged to the connector where the handle has a `cancel_href`."""
        return to_response(await host.cancel(bearer_token(request), operation_id))

    @router.get("/v1/admin/deferred-operations", responses={401: _ERROR, 403: _ERROR, 422: _ERROR})
    async def operator_list(request: Request, status: str | None = Query(default=None)) -> Response:
        """Durable views of every operation, optionally of one status (operators)."""
        return to_response(await host.operator_list(bearer_token(request), status))

    @router.get(
        "/v1/admin/deferred-operations/{operation_id}", responses={401: _ERROR, 403: _ERROR, 404: _ERROR}
    )
    async def operator_detail(request: Request, operation_id: str) -> Response:
        """Durable view, digest-only history and receipt of one operation (operators)."""
        return to_response(await host.operator_detail(bearer_token(request), operation_id))

    @router.post(
        "/v1/admin/deferred-operations/{operation_id}/poll", responses={401: _ERROR, 403: _ERROR, 404: _ERROR}
    )
    async def operator_poll(request: Request, operation_id: str) -> Response:
        """Poll now (operators)."""
        return to_response(await host.operator_poll(bearer_token(request), operation_id))

    @router.post(
        "/v1/admin/deferred-operations/{operation_id}/cancel",
        responses={401: _ERROR, 403: _ERROR, 404: _ERROR, 409: _ERROR},
    )
    async def operator_cancel(request: Request, operation_id: str) -> Response:
        """Cancel where cancelable (operators)."""
        return to_response(await host.operator_cancel(bearer_token(request), operation_id))

    return router
