"""CONTRACT §13.1 simulation routes (`serve --simulate` only): script devices and adapter faults at run time.

Operators only (401 without a token, 403 for callers). A transport that is not simulated, an unknown
transport and an unknown device all answer 404 `not-found`, like a route that does not exist. Refusals
name JSON paths and rules, never a value of the posted observation.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from connector.api.errors import JsonResponse, bearer_token, parse_json_body
from connector.api.openapi import Ok, Route, declare
from connector.core import authority
from connector.core.authority import Principal
from connector.errors import Code, SensoriumError
from providers.simulated import SimulatedAdapter, Simulation, adapter_command, parse_device

_AUTH = (Code.UNAUTHENTICATED, Code.FORBIDDEN, Code.NOT_FOUND)
PUT_DEVICE = Route(
    oks=(
        Ok(200, ("sim-id",), description="the device updated (its identity was known)"),
        Ok(201, ("sim-id",), description="the device appeared"),
    ),
    refusals=(Code.INVALID_JSON, *_AUTH, Code.INVALID_INPUT),
    body="sim-device",
)
REMOVE_DEVICE = Route(oks=(Ok(204, description="the device left"),), refusals=_AUTH)
ADAPTER = Route(
    oks=(Ok(200, ("sim-adapter-state",)),),
    refusals=(Code.INVALID_JSON, *_AUTH, Code.INVALID_INPUT),
    body="sim-adapter-request",
)


def _not_found() -> SensoriumError:
    return SensoriumError("not found", code=Code.NOT_FOUND)


def sim_router(simulation: Simulation, authenticate: Any) -> APIRouter:
    """`/v1/sim/{transport}/devices[/{sim_id}]` and `/v1/sim/{transport}/adapter`."""
    router = APIRouter()

    def adapter_for(request: Request, transport: str) -> SimulatedAdapter:
        principal: Principal = authenticate(bearer_token(request))
        authority.require_operator(principal)
        adapter = simulation.adapter(transport)
        if adapter is None:
            raise _not_found()
        return adapter

    @router.post("/v1/sim/{transport}/devices", **declare(PUT_DEVICE))
    async def put_device(request: Request, transport: str) -> Response:
        """A device appears (201) or, when its identity is known, updates (200)."""
        adapter = adapter_for(request, transport)
        observation, interval_ms = parse_device(adapter.transport, parse_json_body(await request.body()))
        sim_id, created = adapter.put(observation, interval_ms)
        return JsonResponse({"sim/id": sim_id}, status_code=201 if created else 200)

    @router.delete("/v1/sim/{transport}/devices/{sim_id}", status_code=204, **declare(REMOVE_DEVICE))
    async def remove_device(request: Request, transport: str, sim_id: str) -> Response:
        """The device leaves (a USB removal, an mDNS goodbye; a BLE device stops advertising)."""
        if not adapter_for(request, transport).remove(sim_id):
            raise _not_found()
        return Response(status_code=204)

    @router.post("/v1/sim/{transport}/adapter", **declare(ADAPTER))
    async def adapter_state(request: Request, transport: str) -> Response:
        """`{"powered": bool}`, `{"restart": true}` or `{"stop": "ack"|"refuse"|"stall"}`; the new state."""
        adapter = adapter_for(request, transport)
        state = adapter_command(adapter, parse_json_body(await request.body()))
        return JsonResponse(state)

    return router
