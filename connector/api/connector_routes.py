"""CONTRACT §9 connector routes: directives, operations, selections, bindings, catalog, principal
revocation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from connector.api.errors import bearer_token, parse_json_body, to_response
from connector.api.openapi import ADMISSION_REFUSALS, Ok, Route, declare
from connector.core.authority import Principal
from connector.errors import Code
from connector.service.answers import Answer, Done
from connector.service.connector import ConnectorService

_AUTH = (Code.UNAUTHENTICATED, Code.INTERNAL)
_BODY = (Code.INVALID_JSON, Code.BODY_TOO_LARGE)
_STATUS_BODIES = ("deferred-operation-status.v1", "deferred-operation-status.v2")
INVOKE = Route(
    oks=(
        Ok(200, ("sensorium-directive-result.v1",), description="the result of a sync directive"),
        Ok(
            202,
            ("sensorium-connector-deferred.v1",),
            headers=("Location", "Retry-After"),
            required_headers=("Location", "Retry-After"),
        ),
    ),
    refusals=ADMISSION_REFUSALS,
    body="sensorium-directive.v1",
)
STATUS = Route(
    oks=(Ok(200, _STATUS_BODIES, description="v1 status, or v2 for discovery"),),
    refusals=(*_AUTH, Code.UNKNOWN_OPERATION, Code.INVALID_INPUT),
)
CANCEL = Route(
    oks=(Ok(200, _STATUS_BODIES, description="the status after the request"),),
    refusals=(*_AUTH, Code.UNKNOWN_OPERATION, Code.NOT_CANCELABLE),
)
SELECT = Route(
    oks=(Ok(200, ("selection",)),),
    refusals=(
        *_BODY,
        *_AUTH,
        Code.UNKNOWN_OPERATION,
        Code.FORBIDDEN,
        Code.INVALID_INPUT,
        Code.UNKNOWN_CANDIDATE,
    ),
    body="selection-request",
)
BIND = Route(
    oks=(
        Ok(201, ("sensorium-device-binding.v1",), description="the binding; the only answer with an address"),
    ),
    refusals=(
        *_BODY,
        *_AUTH,
        Code.UNKNOWN_OPERATION,
        Code.FORBIDDEN,
        Code.INVALID_INPUT,
        Code.NOT_BINDABLE,
        Code.SESSION_NOT_TERMINATED,
        Code.UNKNOWN_CANDIDATE,
        Code.CANDIDATE_EXPIRED,
        Code.CANDIDATE_CONSUMED,
        Code.IDEMPOTENCY_CONFLICT,
        Code.TRANSPORT_CLAIMED,
    ),
    body="binding-request",
)
BINDINGS = Route(oks=(Ok(200, ("binding-list",)),), refusals=_AUTH)
FORGET = Route(oks=(Ok(204),), refusals=(*_AUTH, Code.UNKNOWN_BINDING))
CATALOG = Route(oks=(Ok(200, ("catalog-summary",)),), refusals=_AUTH)
REVOKE = Route(
    oks=(Ok(200, ("principal-revocation",)),),
    refusals=(*_AUTH, Code.FORBIDDEN, Code.NOT_FOUND, Code.INVALID_INPUT),
)


async def _json(request: Request, *, directive: bool) -> Any:
    return parse_json_body(await request.body(), directive=directive)


def connector_router(service: ConnectorService) -> APIRouter:
    """Routes of the connector service (`sensorium.directive.invoke`, `sensorium.operation.*`)."""
    router = APIRouter()

    @router.post("/v1/directives", **declare(INVOKE))
    async def invoke(request: Request) -> Response:
        """sensorium.directive.invoke: 200 sync result or 202 deferred handle."""
        principal = service.authenticate(bearer_token(request))  # CONTRACT §2 step 1, once, before the body
        directive = await _json(request, directive=True)
        return to_response(await service.invoke(principal, directive))

    @router.get("/v1/operations/{operation_id}", **declare(STATUS))
    async def status(
        request: Request,
        operation_id: str,
        wait_seconds: int | None = Query(default=None, ge=0),
        after_revision: int | None = Query(default=None, ge=0),
    ) -> Response:
        """sensorium.operation.status, with the optional long poll."""
        principal = service.authenticate(bearer_token(request))
        reply = await service.status(
            principal, operation_id, wait_seconds=wait_seconds, after_revision=after_revision
        )
        return to_response(reply)

    @router.post("/v1/operations/{operation_id}/cancel", **declare(CANCEL))
    async def cancel(request: Request, operation_id: str) -> Response:
        """sensorium.operation.cancel."""
        principal = service.authenticate(bearer_token(request))
        return to_response(await service.cancel(principal, operation_id))

    @router.post("/v1/operations/{operation_id}/selection", **declare(SELECT))
    async def select(request: Request, operation_id: str) -> Response:
        """Select a candidate of a running snapshot."""
        return await _with_body(
            service, request, lambda principal, body: service.select(principal, operation_id, body)
        )

    @router.post("/v1/operations/{operation_id}/bindings", status_code=201, **declare(BIND))
    async def bind(request: Request, operation_id: str) -> Response:
        """Bind a candidate of a terminated session; reveals its address."""
        return await _with_body(
            service, request, lambda principal, body: service.bind(principal, operation_id, body)
        )

    @router.get("/v1/bindings", **declare(BINDINGS))
    async def bindings(request: Request) -> Response:
        """The caller's bindings (with addresses), or every binding for an operator (without)."""
        return to_response(await service.list_bindings(service.authenticate(bearer_token(request))))

    @router.delete("/v1/bindings/{binding_id}", status_code=204, **declare(FORGET))
    async def forget(request: Request, binding_id: str) -> Response:
        """Forget (erase) a binding."""
        principal = service.authenticate(bearer_token(request))
        return to_response(await service.forget(principal, binding_id))

    @router.get("/v1/catalog", **declare(CATALOG))
    async def catalog(request: Request) -> Response:
        """Catalog summary for an authenticated principal."""
        service.authenticate(bearer_token(request))
        return to_response(Done(service.catalog_summary()))

    @router.post("/v1/admin/principals/{principal_id}/revoke", **declare(REVOKE))
    async def revoke(
        request: Request, principal_id: str, action_id: str | None = Query(default=None)
    ) -> Response:
        """Revoke one grant (`?action_id=`) or the whole principal (operators only)."""
        operator = service.authenticate(bearer_token(request))
        return to_response(service.revoke(operator, principal_id, action_id))

    return router


async def _with_body(
    service: ConnectorService,
    request: Request,
    call: Callable[[Principal, Any], Awaitable[Answer]],
) -> Response:
    """Authenticate (CONTRACT §2 step 1 comes first), parse the JSON body (400 `invalid-json`), then call."""
    principal = service.authenticate(bearer_token(request))
    body = await _json(request, directive=False)
    return to_response(await call(principal, body))
