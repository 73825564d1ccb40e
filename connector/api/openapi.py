"""The OpenAPI 3.1 document: every route declares its body and answers here; bodies are the canonical schemas.

`schemas/` stays the one source of truth: its files become `components/schemas` by a mechanical rewrite
(each `$defs` entry hoisted to a component of its own, every `$ref` pointed at that component), so that
generators which cannot follow external references still see exactly the canonical content.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from connector.contract.schemas import schema_files
from connector.errors import HTTP_STATUS_BY_CODE, Code

COMPONENTS = "#/components/schemas/"
MAX_SAFE_INTEGER = 2**53 - 1
STRICT_VALUE_DEPTH = 1  # arrays inline, one deep (see `strict_value`)
JSON_OBJECT = "strict-json-object"
SECURITY_SCHEME = "bearerAuth"
ERROR_SCHEMA = "sensorium-error.v1"
_DOC_SUFFIX = ".schema.json"
_DEFS_SUFFIX = ".json"
_DECLARED = "x-sensorium-declared"
_SCHEMA_MAPS = frozenset({"properties", "patternProperties"})
# Subschemas that decide when a rule applies, or forbid a member: their meaning would change if tightened.
_CONDITIONALS = frozenset({"if", "then", "else", "not"})
_REASON = {
    200: "OK",
    201: "Created",
    202: "Accepted: a deferred handle",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    421: "Misdirected Request",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_HEADERS: Mapping[str, Mapping[str, Any]] = {
    "Location": {
        "description": "origin-relative path of the operation's status",
        "schema": {"type": "string", "pattern": "^/"},
    },
    "Retry-After": {
        "description": "seconds to wait before the next request",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    },
}


# ---- components from schemas/ ------------------------------------------------------------------------


def component_name(file_name: str) -> str:
    """The component of a schema file: its schema name (`common.defs` for the shared definitions)."""
    if file_name.endswith(_DOC_SUFFIX):
        return file_name.removesuffix(_DOC_SUFFIX)
    return file_name.removesuffix(_DEFS_SUFFIX)


def canonical_components() -> dict[str, Any]:
    """`components/schemas` generated from every file of `schemas/`."""
    components: dict[str, Any] = {}
    for file_name, contents in schema_files().items():
        base = component_name(file_name)
        document = dict(contents)
        for name, definition in document.pop("$defs", {}).items():
            components[f"{base}.{name}"] = _rewrite(definition, base)
        document.pop("$id", None)
        document.pop("$schema", None)
        if document.keys() - {"title", "description"}:
            components[base] = _rewrite(document, base)
    return {name: _inline_rules(schema, components) for name, schema in components.items()}


def _inline_rules(node: Any, components: Mapping[str, Any]) -> Any:
    """`allOf` items that only reference conditionals (no properties) inlined; the same schema, in a form
    that generators merging `allOf` into one model can read (they take only object models by reference)."""
    if isinstance(node, list):
        return [_inline_rules(item, components) for item in node]
    if not isinstance(node, Mapping):
        return node
    result = {key: _inline_rules(value, components) for key, value in node.items()}
    if isinstance(result.get("allOf"), list):
        result["allOf"] = [_inlined(item, components) for item in result["allOf"]]
    return result


def _inlined(item: Any, components: Mapping[str, Any]) -> Any:
    target = item.get("$ref", "") if isinstance(item, Mapping) and len(item) == 1 else ""
    schema = components.get(target.removeprefix(COMPONENTS)) if target.startswith(COMPONENTS) else None
    if not isinstance(schema, Mapping) or "properties" in schema:
        return item
    return _inline_rules(copy.deepcopy(dict(schema)), components)


def _rewrite(node: Any, base: str) -> Any:
    """`node` with every `$ref` pointing into `#/components/schemas/`."""
    if isinstance(node, list):
        return [_rewrite(item, base) for item in node]
    if not isinstance(node, Mapping):
        return node
    rewritten = {key: _rewrite(value, base) for key, value in node.items()}
    for key in _SCHEMA_MAPS & rewritten.keys():
        # `true` and `{}` are the same 2020-12 schema; generators read only the object form.
        rewritten[key] = {name: {} if sub is True else sub for name, sub in rewritten[key].items()}
    if isinstance(node.get("$ref"), str):
        rewritten["$ref"] = _component_ref(node["$ref"], base)
    return rewritten


def _component_ref(ref: str, base: str) -> str:
    target, _, fragment = ref.partition("#")
    owner = component_name(target) if target else base
    if not fragment:
        return COMPONENTS + owner
    prefix = "/$defs/"
    name = fragment.removeprefix(prefix)
    if not fragment.startswith(prefix) or "/" in name:
        raise ValueError("a schema reference that is not a whole definition")  # none in schemas/ today
    return f"{COMPONENTS}{owner}.{name}"


# ---- the numbers of CONTRACT §1, stated where JSON Schema can state them ----------------------------------


def strict_value(depth: int = STRICT_VALUE_DEPTH) -> dict[str, Any]:
    """Any JSON value a caller may send (CONTRACT §1), its numbers integers within +-(2^53 - 1).

    Objects go through the recursive `strict-json-object` model (generators take a `$ref` to a model, never
    to a union); arrays are inline, `depth` deep. An array right inside that many arrays is left out: the
    document is then narrower than the server (which takes it), never wider - a wider `{}` there let
    schemathesis send a fraction the server rightly refuses, and every level more multiplies its cases.
    """
    scalars: list[dict[str, Any]] = [{"type": "null"}, {"type": "boolean"}, {"type": "string"}]
    branches = [*scalars, dict(_SAFE_INTEGER), _ref(JSON_OBJECT)]
    if depth > 0:
        branches.insert(4, {"type": "array", "items": strict_value(depth - 1)})
    return {"description": _STRICT_VALUE_TEXT, "anyOf": branches}


def _strict_object() -> dict[str, Any]:
    """The `strict-json-object` model: a JSON object of strict values (recursive through itself)."""
    return {"type": "object", "description": _STRICT_VALUE_TEXT, "additionalProperties": strict_value()}


_STRICT_VALUE_TEXT = (
    "any JSON value whose numbers are integers within +-(2^53 - 1), at any depth (CONTRACT §1; an integral "
    "spelling such as 5.0 or 5e3 is that integer); strings hold no lone surrogate, objects no duplicate "
    "key, nesting at most 64"
)
_SAFE_INTEGER = {"type": "integer", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER}


def strict_numbers(node: Any) -> Any:
    """`node` with CONTRACT §1's number rule spelt out: every integer bounded, every open member's values (and
    every any-value member) a strict JSON value. Conditionals are left as they are (see `_CONDITIONALS`)."""
    if isinstance(node, list):
        return [strict_numbers(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    result = {
        key: value if key in _CONDITIONALS else strict_numbers(value) for key, value in node.items()
    }
    for key in _SCHEMA_MAPS & result.keys():
        result[key] = {name: sub or strict_value() for name, sub in result[key].items()}
    kinds = result.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "integer" in kinds:
        result.setdefault("minimum", -MAX_SAFE_INTEGER)
        result.setdefault("maximum", MAX_SAFE_INTEGER)
    if "object" in kinds and not {"additionalProperties", "patternProperties"} & result.keys():
        result["additionalProperties"] = strict_value()
    return result


# ---- documents of this API that no wire schema names (CONTRACT §9) -----------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": COMPONENTS + name}


def _closed(properties: Mapping[str, Any], required: Iterable[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(properties if required is None else required),
        "properties": dict(properties),
    }


def _nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"anyOf": [dict(schema), {"type": "null"}]}


_OPAQUE = _ref("common.defs.opaqueId")
_TIME = _ref("common.defs.time")
_TEXT = _ref("common.defs.text")
_COUNT = _ref("common.defs.count")
_DIGEST = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_DURABLE_VIEW = _closed(
    {
        "operation/id": _ref("common.defs.operationId"),
        "operation/kind": _ref("common.defs.operationKind"),
        "owner_module_id": _TEXT,
        "capability_id": _TEXT,
        "owner": _TEXT,
        "status": _ref("common.defs.status"),
        "retry_after_seconds": _nullable(_COUNT),
        "next_poll_at": _nullable(_TIME),
        "expires_at": _TIME,
        "attempts": _COUNT,
        "cancelable": {"type": "boolean"},
        "cancel/unavailable-reason": _nullable(_TEXT),
        "correlation/id": _nullable(_TEXT),
        "continuation_digest": _nullable(_DIGEST),
        "diagnostics_digest": _nullable(_DIGEST),
        "last_error": _nullable(_TEXT),
        "created_at": _TIME,
        "updated_at": _TIME,
        "bus_op": _nullable(_TEXT),
        "metadata": {"type": "object", "description": "durable metadata (CONTRACT §6.6): no candidate data"},
        "route": {"enum": ["host", "bus", "connector"], "description": "where it was admitted"},
        "action": _nullable(_TEXT),
        "transport": _nullable(_ref("common.defs.transport")),
        "window_seconds": _nullable(_COUNT),
        "adapter": _nullable(_TEXT),
        "outcome": _nullable(_TEXT),
    }
)
# CONTRACT §6.1: the `input` of `device.discovery.scan` (a directive's `input` stays open on the wire; this
# documents what the action's own rules accept). UUIDs and `vid_pid` strings are normalised on admission.
_UUID_FORMS = {
    "type": "string",
    "pattern": "^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
    "[0-9a-fA-F]{12})$",
    "description": "128-bit, or a 16-/32-bit short form on the Bluetooth base UUID (180d), any case; "
    "admitted as lowercase 128-bit",
}
_VID_PID_FORMS = {
    "oneOf": [
        _closed({"vid": _ref("common.defs.count"), "pid": _ref("common.defs.count")}),
        {"type": "string", "pattern": "^[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}$", "description": "hex, 0403:6001"},
    ]
}


def _list(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": 1, "maxItems": 64}


_DISCOVERY_FILTER = _closed(
    {
        "service_uuids": _list(_UUID_FORMS),
        "manufacturer_ids": _list({"type": "integer", "minimum": 0, "maximum": 65535}),
        "name_prefix": _TEXT,
        "min_rssi_dbm": {"type": "integer", "minimum": -128, "maximum": 127},
        "addresses": _list(_TEXT),
        "vid_pid": _list(_VID_PID_FORMS),
        "serial_numbers": _list(_TEXT),
        "service_types": _list({"type": "string", "description": "_http._tcp[.local.]"}),
        "instance_prefix": _TEXT,
    },
    required=(),
)
API_COMPONENTS: Mapping[str, Any] = {
    "device.discovery.scan-input": _closed(
        {
            "transport": _ref("common.defs.transport"),
            "window_seconds": {"type": "integer", "minimum": 1},
            "limits": _closed(
                {"max_candidates": {"type": "integer", "minimum": 1}, "max_snapshot_bytes": _COUNT},
                required=(),
            ),
            "filters": _DISCOVERY_FILTER,
            "exclusions": _DISCOVERY_FILTER,
            "adapter": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"},
        },
        required=("transport", "window_seconds"),
    ),
    "catalog-summary": _closed(
        {
            "catalog/id": _TEXT,
            "catalog/version": _COUNT,
            "actions": {
                "type": "array",
                "items": _closed(
                    {
                        "action_id": _ref("common.defs.actionId"),
                        "execution_mode_support": {"enum": ["sync-only", "async-only", "either"]},
                    }
                ),
            },
        }
    ),
    "selection": _closed(
        {
            "operation/id": _ref("common.defs.operationId"),
            "candidate/ref": _OPAQUE,
            "selected": {"const": True},
        }
    ),
    "selection-request": _closed({"candidate/ref": _OPAQUE}),
    "binding-request": _closed({"candidate/ref": _OPAQUE, "idempotency_key": _OPAQUE}),
    "binding-list": _closed(
        {
            "bindings": {
                "type": "array",
                "items": _closed(
                    {
                        "binding/id": _OPAQUE,
                        "transport": _ref("common.defs.transport"),
                        "bound_at": _TIME,
                        "address": {"type": "string", "minLength": 1},
                        "owner": _TEXT,
                    },
                    required=("binding/id", "transport", "bound_at"),
                ),
            }
        }
    ),
    "principal-revocation": _closed(
        {
            "principal/id": _TEXT,
            "revoked": {"enum": ["principal", "grant"]},
            "action_id": _ref("common.defs.actionId"),
            "revoked_actions": {"type": "array", "items": _ref("common.defs.actionId")},
        },
        required=("principal/id", "revoked", "revoked_actions"),
    ),
    # CONTRACT §13.1 (`serve --simulate` only): a device is one hw-fixtures line without `t_ms`.
    "sim-device": {"type": "object", "description": "one CONTRACT §13 observation line without t_ms"},
    "sim-id": _closed({"sim/id": {"type": "string", "minLength": 1}}),
    "sim-adapter-request": {
        "oneOf": [
            _closed({"powered": {"type": "boolean"}}),
            _closed({"restart": {"const": True}}),
            _closed({"stop": {"enum": ["ack", "refuse", "stall"]}}),
        ]
    },
    "sim-adapter-state": _closed(
        {
            "transport": _ref("common.defs.transport"),
            "powered": {"type": "boolean"},
            "stop": {"enum": ["ack", "refuse", "stall"]},
            "devices": _COUNT,
            "sessions": _COUNT,
        }
    ),
    "health": _closed({"status": {"enum": ["ok", "starting"]}}),
    "operator-operation-list": _closed(
        {
            "operations": {"type": "array", "items": _DURABLE_VIEW, "maxItems": 200},
            "next_after": {"type": "string", "description": "the cursor of the next (older) page"},
        },
        required=("operations",),
    ),
    "operator-operation-detail": _closed(
        {
            "operation": _DURABLE_VIEW,
            "history": {
                "type": "array",
                "items": _closed(
                    {"seq": _COUNT, "at": _TIME, "status": _ref("common.defs.status"), "digest": _DIGEST}
                ),
            },
            "receipt": _nullable(_ref("execution-receipt.v1")),
        }
    ),
}


# ---- route declarations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    """One success answer: its status, the component(s) of its body (none: no body) and its headers."""

    status: int
    bodies: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    required_headers: tuple[str, ...] = ()
    media_type: str = "application/json"
    description: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """What one operation takes and answers."""

    oks: tuple[Ok, ...]
    refusals: tuple[str, ...]
    body: str | None = None
    authenticated: bool = True


# Any request can meet these: the body limit applies before routing (even to a GET with a body), and a
# bug of ours answers 500 `internal`.
ANY_ROUTE_REFUSALS = (Code.BODY_TOO_LARGE, Code.INTERNAL)
# What the server's edge answers below every route (CONTRACT §8): read deadlines, foreign `Host`, the cap.
EDGE_REFUSALS = (Code.REQUEST_TIMEOUT, Code.MISDIRECTED_REQUEST, Code.OVERLOADED)
# What admitting a directive may refuse (CONTRACT §2): the connector's invoke route and the host's admit
# route.
ADMISSION_REFUSALS = (
    Code.INVALID_JSON,
    Code.BODY_TOO_LARGE,
    Code.UNAUTHENTICATED,
    Code.INTERNAL,
    Code.INVALID_DIRECTIVE,
    Code.UNKNOWN_ACTION,
    Code.EXECUTION_MODE_NOT_SUPPORTED,
    Code.FORBIDDEN,
    Code.INVALID_INPUT,
    Code.STATUS_V2_REQUIRED,
    Code.IDEMPOTENCY_CONFLICT,
    Code.TOO_MANY_OPERATIONS,
    Code.TRANSPORT_CLAIMED,
)
# Refusal codes that carry `Retry-After` (CONTRACT §2 step 9, 6.8).
RETRY_AFTER_CODES = frozenset(
    {Code.TOO_MANY_OPERATIONS, Code.TRANSPORT_CLAIMED, Code.SESSION_NOT_TERMINATED, Code.OVERLOADED}
)


def declare(route: Route) -> dict[str, Any]:
    """Keyword arguments for a FastAPI route decorator that put `route` into the document."""
    return {"openapi_extra": {_DECLARED: _operation(route)}}


def _operation(route: Route) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for ok in route.oks:
        responses[str(ok.status)] = _ok_response(ok)
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys((*route.refusals, *ANY_ROUTE_REFUSALS, *EDGE_REFUSALS)):
        by_status.setdefault(HTTP_STATUS_BY_CODE[code], []).append(code)
    for status, codes in sorted(by_status.items()):
        refusal = _refusal(status, codes)
        answer = responses.get(str(status))
        responses[str(status)] = refusal if answer is None else _either(answer, refusal)
    operation: dict[str, Any] = {"responses": responses}
    if route.body is not None:
        content = {"application/json": {"schema": _ref(route.body)}}
        operation["requestBody"] = {"required": True, "content": content}
    if route.authenticated:
        operation["security"] = [{SECURITY_SCHEME: []}]
    return operation


def _ok_response(ok: Ok) -> dict[str, Any]:
    response: dict[str, Any] = {"description": ok.description or _REASON[ok.status]}
    if ok.media_type != "application/json":
        response["content"] = {ok.media_type: {"schema": {"type": "string"}}}
    elif ok.bodies:
        schema = _ref(ok.bodies[0]) if len(ok.bodies) == 1 else {"oneOf": [_ref(b) for b in ok.bodies]}
        response["content"] = {ok.media_type: {"schema": schema}}
    headers = {name: _header(name, name in ok.required_headers) for name in ok.headers}
    if headers:
        response["headers"] = headers
    return response


# Refusals a request valid against this document can still meet: rules no JSON Schema states (CONTRACT §2,
# 6.1).
_SEMANTIC_NOTES: Mapping[str, str] = {
    Code.INVALID_DIRECTIVE: "invalid-directive also for rules beyond the schema (CONTRACT §1: causal/context "
    "above 4096 bytes of canonical JSON; a number that is not an integer within +-(2^53 - 1))",
    Code.INVALID_INPUT: "invalid-input when the input breaks the action's own rules (CONTRACT §2 step 6; "
    "discovery: CONTRACT §6.1 - transport, window, limits, filters, a window longer than timeout_ms), "
    "which the open `input` object of the schema does not state",
}


def _refusal(status: int, codes: Sequence[str]) -> dict[str, Any]:
    schema = {**_ref(ERROR_SCHEMA), "properties": {"code": {"enum": sorted(codes)}}}
    notes = "".join(f"; {_SEMANTIC_NOTES[code]}" for code in sorted(codes) if code in _SEMANTIC_NOTES)
    names = " | ".join(sorted(codes))
    response: dict[str, Any] = {
        "description": f"{_REASON[status]}: sensorium-error.v1 with code {names}{notes}",
        "content": {"application/json": {"schema": schema}},
    }
    if RETRY_AFTER_CODES & set(codes):
        required = set(codes) <= RETRY_AFTER_CODES
        response["headers"] = {"Retry-After": _header("Retry-After", required)}
    return response


def _either(ok: dict[str, Any], refusal: dict[str, Any]) -> dict[str, Any]:
    """One status that is an answer of the route or a refusal (`/healthz` starting, or the edge's 503)."""
    schemas = [r["content"]["application/json"]["schema"] for r in (ok, refusal)]
    either: dict[str, Any] = {
        "description": f"{ok['description']}; or {refusal['description']}",
        "content": {"application/json": {"schema": {"anyOf": schemas}}},
    }
    headers = {**ok.get("headers", {}), **refusal.get("headers", {})}
    if headers:
        either["headers"] = {name: {**header, "required": False} for name, header in headers.items()}
    return either


def _header(name: str, required: bool) -> dict[str, Any]:
    return {**copy.deepcopy(dict(_HEADERS[name])), "required": required}


# ---- the document -------------------------------------------------------------------------------------


def install_openapi(app: FastAPI) -> None:
    """Serve the exact document at `/openapi.json` (built once, on first request)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app)
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]


def build_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with each route's declared answers and the canonical components."""
    document = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version="3.1.0",
        description=app.description,
        routes=app.routes,
    )
    for methods in document.get("paths", {}).values():
        for operation in methods.values():
            _settle(operation)
    components = document.setdefault("components", {})
    schemas = {**canonical_components(), **API_COMPONENTS}
    components["schemas"] = {**strict_numbers(schemas), JSON_OBJECT: _strict_object()}
    document["paths"] = strict_numbers(document.get("paths", {}))
    components["securitySchemes"] = {
        SECURITY_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "a principal's token (CONTRACT §8)",
        }
    }
    return document


def _settle(operation: dict[str, Any]) -> None:
    """Replace FastAPI's guessed answers with the declared ones; keep its parameters, made plain."""
    declared = operation.pop(_DECLARED, None)
    if declared is None:
        return
    operation.pop("requestBody", None)
    operation.update(copy.deepcopy(declared))
    for parameter in operation.get("parameters", ()):
        parameter["schema"] = _without_null(parameter.get("schema", {}))


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter is absent or an integer: `null` is not a value a query can carry."""
    options = [s for s in schema.get("anyOf", ()) if s.get("type") != "null"]
    if len(options) == 1 and len(options) < len(schema.get("anyOf", ())):
        rest = {k: v for k, v in schema.items() if k != "anyOf" and not (k == "default" and v is None)}
        return {**options[0], **rest}
    return schema
