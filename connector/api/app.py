"""The FastAPI application: connector routes, health, metrics, and whatever the host adds."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fastapi import APIRouter, FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import Response

from connector.api.connector_routes import connector_router
from connector.api.errors import (
    DEFAULT_MAX_BODY_BYTES,
    BodyLimit,
    InternalErrors,
    JsonResponse,
    install_error_handlers,
)
from connector.api.openapi import Ok, Route, declare, install_openapi
from connector.errors import Code
from connector.resources import version
from connector.service.connector import ConnectorService
from connector.telemetry.metrics import RequestTimer, Telemetry

# What no JSON Schema can say about open objects (`input`, `extensions`, `causal/context`), nor about the
# spelling of a number (JSON Schema counts 1.0 as the integer 1).
API_DESCRIPTION = (
    "The Sensorium OS discovery connector (CONTRACT §9). Wire rule (CONTRACT §1): every number in a request "
    "body is an integer within +-(2^53 - 1) (an integral spelling such as 5.0 or 5e3 is that integer), "
    "anywhere in the body, open objects included; strings are valid Unicode and objects repeat no key. "
    "A body that is not strict JSON answers 400 `invalid-json`, other numbers 422 `invalid-directive` / "
    "`invalid-input`."
)
HEALTH = Route(
    oks=(Ok(200, ("health",), description="ready"), Ok(503, ("health",), description="starting")),
    refusals=(Code.INTERNAL,),
    authenticated=False,
)
METRICS = Route(oks=(Ok(200, media_type="text/plain"),), refusals=(Code.INTERNAL,), authenticated=False)


def create_app(
    service: ConnectorService,
    *,
    ready: Callable[[], bool],
    metrics: CollectorRegistry,
    routers: Iterable[APIRouter] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    telemetry: Telemetry | None = None,
) -> FastAPI:
    """Build the HTTP face of one connector process."""
    app = FastAPI(
        title="sensorium-os-connector",
        version=version(),
        description=API_DESCRIPTION,
        docs_url=None,
        redoc_url=None,
    )
    install_openapi(app)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(InternalErrors)  # added last: outermost, so it also covers the body limit
    if telemetry is not None:
        app.add_middleware(RequestTimer, telemetry=telemetry)  # times everything, refusals included
    app.include_router(connector_router(service))
    for router in routers:
        app.include_router(router)

    @app.get("/healthz", **declare(HEALTH))
    async def healthz() -> Response:
        """200 once ready, else 503."""
        up = ready()
        return JsonResponse({"status": "ok" if up else "starting"}, status_code=200 if up else 503)

    @app.get("/metrics", **declare(METRICS))
    async def prometheus() -> Response:
        """Prometheus counters; never candidate data."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    return app
