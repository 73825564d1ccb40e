"""SPEC 9 connector routes: directives, operations, selections, bindings, catalog, principal revocation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from connector.api.errors import bearer_token, parse_json_body, to_response
from connector.errors import SensoriumError
from connector.service.connector import ConnectorService
from connector.service.replies import Reply, error_reply

_OPAQUE = {"type": "string", "minLength": 1, "maxLength": 128}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI `requestBody` of a JSON route (documentation only: the service checks every body)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _closed(*required: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": {name: _OPAQUE for name in required},
    }


_DIRECTIVE_BODY = _json_body({"type": "object"})
_SELECTION_BODY = _json_body(_closed("candidate/ref"))
_BINDING_BODY = _json_body(_closed("candidate/ref", "idempotency_key"))
_ERROR = {"description": "a sensorium-error.v1 refusal"}


async def _json(request: Request, *, directive: bool) -> Any:
    return parse_json_body(await request.body(), directive=directive)


def connector_router(service: ConnectorService) -> APIRouter:
    """Routes of the connector service (`sensorium.directive.invoke`, `sensorium.operation.*`)."""
    router = APIRouter()

    @router.post(
        "/v1/directives", openapi_extra=_DIRECTIVE_BODY, responses={400: _ERROR, 401: _ERROR, 422: _ERROR}
    )
    async def invoke(request: Request) -> Response:
        """sensorium.directive.invoke: 200 sync result or 202 deferred handle."""
        return await _with_body(
            service, request, lambda body: service.invoke(bearer_token(request), body), directive=True
        )

    @router.get("/v1/operations/{operation_id}", responses={401: _ERROR, 404: _ERROR})
    async def status(
        request: Request,
        operation_id: str,
        wait_seconds: int | None = Query(default=None, ge=0),
        after_revision: int | None = Query(default=None, ge=0),
    ) -> Response:
        """sensorium.operation.status, with the optional long poll."""
        reply = await service.status(
            bearer_token(request), operation_id, wait_seconds=wait_seconds, after_revision=after_revision
        )
        return to_response(reply)

    @router.post("/v1/operations/{operation_id}/cancel", responses={401: _ERROR, 404: _ERROR, 409: _ERROR})
    async def cancel(request: Request, operation_id: str) -> Response:
        """sensorium.operation.cancel."""
        return to_response(await service.cancel(bearer_token(request), operation_id))

    @router.post(
        "/v1/operations/{operation_id}/selection",
        openapi_extra=_SELECTION_BODY,
        responses={401: _ERROR, 404: _ERROR},
    )
    async def select(request: Request, operation_id: str) -> Response:
        """Select a candidate of a running snapshot."""
        return await _with_body(
            service, request, lambda body: service.select(bearer_token(request), operation_id, body)
        )

    @router.post(
        "/v1/operations/{operation_id}/bindings",
        openapi_extra=_BINDING_BODY,
        status_code=201,
        responses={401: _ERROR, 404: _ERROR, 409: _ERROR, 410: _ERROR},
    )
    async def bind(request: Request, operation_id: str) -> Response:
        """Bind a candidate of a terminated session; reveals its address."""
        return await _with_body(
            service, request, lambda body: service.bind(bearer_token(request), operation_id, body)
        )

    @router.delete("/v1/bindings/{binding_id}", status_code=204, responses={401: _ERROR, 404: _ERROR})
    async def forget(request: Request, binding_id: str) -> Response:
        """Forget (erase) a binding."""
        return to_response(await service.forget(bearer_token(request), binding_id))

    @router.get("/v1/catalog", responses={401: _ERROR})
    async def catalog(request: Request) -> Response:
        """Catalog summary for an authenticated principal."""
        try:
            service.authenticate(bearer_token(request))
        except SensoriumError as error:
            return to_response(error_reply(error))
        return to_response(Reply(200, service.catalog_summary()))

    @router.post("/v1/admin/principals/{principal_id}/revoke", responses={401: _ERROR, 403: _ERROR})
    async def revoke(
        request: Request, principal_id: str, action_id: str | None = Query(default=None)
    ) -> Response:
        """Revoke one grant (`?action_id=`) or the whole principal (operators only)."""
        return to_response(service.revoke(bearer_token(request), principal_id, action_id))

    return router


async def _with_body(
    service: ConnectorService,
    request: Request,
    call: Callable[[Any], Awaitable[Reply]],
    *,
    directive: bool = False,
) -> Response:
    """Authenticate (SPEC 2 step 1 comes first), parse the JSON body (400 `invalid-json`), then call."""
    try:
        service.authenticate(bearer_token(request))
        body = await _json(request, directive=directive)
    except SensoriumError as error:
        return to_response(error_reply(error))
    return to_response(await call(body))
