"""Pydantic models of every wire document (CONTRACT §1): the typed documents of `connector.client` and
`validate`.

`schemas/` is the canonical shape; `tests/contract/test_model_schemas.py` compares every model with its
schema (members, required set, consts and enums, types, bounds, patterns), so neither drifts unnoticed.
Models check shapes only; the cross-field rules live in `connector.contract.semantic`, which both
validation paths apply. Validate wire input by alias only (`validate_wire`), so that `operation_id` is as
unknown to a model as it is to the schema; Python code may construct models by field name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from connector.contract.catalog_models import ActionCatalog, CatalogSignature
from connector.contract.patterns import (
    ACTION_ID_PATTERN,
    ERROR_CODE_PATTERN,
    MAX_ITEMS,
    MAX_LABEL,
    MAX_OPAQUE_ID,
    MAX_SAFE_INT,
    MAX_TEXT,
    MAX_TIME,
    OPERATION_ID_PATTERN,
    OPERATION_KIND_PATTERN,
    PATH_PATTERN,
    TIME_PATTERN,
    UUID_PATTERN,
)
from connector.contract.schemas import UnknownSchemaError


def _plain_int(value: Any) -> Any:
    # A Literal of ints would take `true` and `1.0`; the wire knows neither as an integer.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError("expected an integer")
    return value


def _unique(items: list[Any]) -> list[Any]:
    if len(set(items)) != len(items):
        raise ValueError("expected unique items")
    return items


Text = Annotated[str, Field(max_length=MAX_TEXT)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
OpaqueId = Annotated[str, Field(min_length=1, max_length=MAX_OPAQUE_ID)]
Label = Annotated[str, Field(max_length=MAX_LABEL)]
Time = Annotated[str, Field(max_length=MAX_TIME, pattern=TIME_PATTERN)]
PathText = Annotated[str, Field(max_length=MAX_TEXT, pattern=PATH_PATTERN)]
OperationId = Annotated[str, Field(max_length=MAX_TEXT, pattern=OPERATION_ID_PATTERN)]
OperationKind = Annotated[str, Field(min_length=1, max_length=MAX_OPAQUE_ID, pattern=OPERATION_KIND_PATTERN)]
ActionId = Annotated[str, Field(min_length=1, max_length=MAX_OPAQUE_ID, pattern=ACTION_ID_PATTERN)]
ErrorCode = Annotated[str, Field(min_length=1, max_length=64, pattern=ERROR_CODE_PATTERN)]
Uuid = Annotated[str, Field(pattern=UUID_PATTERN)]
Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]
Positive = Annotated[int, Field(ge=1, le=MAX_SAFE_INT)]
Uint16 = Annotated[int, Field(ge=0, le=0xFFFF)]
Dbm = Annotated[int, Field(ge=-128, le=127)]
Transport = Literal["ble", "usb-serial", "mdns"]
Status = Literal["pending", "running", "completed", "failed", "timed-out", "cancelled", "expired", "unknown"]
TerminalStatus = Literal["completed", "failed", "timed-out", "cancelled", "expired", "unknown"]
StatusVersion = Annotated[Literal[1, 2], BeforeValidator(_plain_int)]
StatusVersions = Annotated[list[StatusVersion], Field(min_length=1, max_length=2), AfterValidator(_unique)]
OpenObject = dict[str, Any]


class WireModel(BaseModel):
    """A closed wire object: strict JSON types, slash keys by alias, optional members absent, never null."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, populate_by_name=True, serialize_by_alias=True
    )
    # Fields whose value may be JSON null (the schema says "any value").
    NULLABLE: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _absent_not_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and info.field_name not in cls.NULLABLE:
            raise ValueError("an optional member is omitted, never null")
        return value

    def to_wire(self) -> dict[str, Any]:
        """The JSON document: aliases, and only the members that were given."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class OpenWireModel(WireModel):
    """An open object (CONTRACT §1): typed where named, anything else allowed."""

    model_config = ConfigDict(extra="allow")


class Diagnostic(OpenWireModel):
    """One `diagnostics[]` item."""

    code: Name
    message: Text | None = None


class CausalContext(OpenWireModel):
    """`causal/context`: echoed unchanged from the directive."""

    operation_id: Name = Field(alias="operation/id")
    parent_operation_id: Name | None = Field(default=None, alias="parent/operation-id")
    trace_id: Name | None = Field(default=None, alias="trace/id")


class ErrorObject(WireModel):
    """The `error` of a failed result or status."""

    code: ErrorCode
    message: Text


Diagnostics = Annotated[list[Diagnostic], Field(max_length=MAX_ITEMS)]


class Timing(WireModel):
    """`timing` of a directive."""

    mode: Literal["sync", "async"]
    timeout_ms: Count | None = None
    deadline_at: Time | None = None
    status_versions: StatusVersions | None = None


class Directive(WireModel):
    """`sensorium-directive.v1`."""

    schema_: Literal["sensorium-directive.v1"] = Field(alias="schema")
    action_id: ActionId
    timing: Timing
    input: OpenObject
    idempotency_key: Name | None = None
    correlation_id: Name | None = Field(default=None, alias="correlation/id")
    causal_context: CausalContext | None = Field(default=None, alias="causal/context")
    extensions: OpenObject | None = None


class DirectiveValue(WireModel):
    """`result` of a completed directive: `{"json": any}`."""

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"value"})

    value: Any = Field(alias="json")


class DirectiveResult(WireModel):
    """`sensorium-directive-result.v1`."""

    schema_: Literal["sensorium-directive-result.v1"] = Field(alias="schema")
    action_id: ActionId
    status: Literal["completed", "failed"]
    result: DirectiveValue | None = None
    error: ErrorObject | None = None
    diagnostics: Diagnostics
    extensions: OpenObject | None = None


class ConnectorDeferred(WireModel):
    """`sensorium-connector-deferred.v1`."""

    schema_: Literal["sensorium-connector-deferred.v1"] = Field(alias="schema")
    connector_operation_id: OperationId = Field(alias="connector_operation/id")
    action_id: ActionId
    retry_after_seconds: Count
    status_path: PathText
    cancel_path: PathText | None = None
    cancel_unavailable_reason: Name | None = Field(default=None, alias="cancel/unavailable-reason")
    fail_after_seconds: Count | None = None
    diagnostics: Diagnostics | None = None
    causal_context: CausalContext | None = Field(default=None, alias="causal/context")
    extensions: OpenObject | None = None


class DeferredOperation(WireModel):
    """`deferred-operation.v1`."""

    schema_: Literal["deferred-operation.v1"] = Field(alias="schema")
    schema_v: Annotated[Literal[1], BeforeValidator(_plain_int)] = Field(alias="schema/v")
    status: Literal["deferred"]
    operation_id: OperationId = Field(alias="operation/id")
    operation_kind: OperationKind = Field(alias="operation/kind")
    retry_after_seconds: Count
    created_at: Time
    expires_at: Time
    status_href: PathText | None = None
    cancel_href: PathText | None = None
    cancel_unavailable_reason: Name | None = Field(default=None, alias="cancel/unavailable-reason")
    correlation_id: Name | None = Field(default=None, alias="correlation/id")
    causal_context: CausalContext | None = Field(default=None, alias="causal/context")
    audit_outcome_ref: Name | None = Field(default=None, alias="audit/outcome-ref")
    owner_module_id: Name | None = None
    capability_id: Name | None = None
    diagnostics: Diagnostics | None = None
    extensions: OpenObject | None = None


class Signal(WireModel):
    """`signal` of a candidate."""

    rssi_dbm: Dbm


class BleDetails(WireModel):
    """`ble` details: never the address."""

    service_uuids: Annotated[list[Uuid], Field(max_length=MAX_ITEMS)] | None = None
    manufacturer_ids: Annotated[list[Uint16], Field(max_length=MAX_ITEMS)] | None = None
    connectable: bool | None = None
    tx_power: Dbm | None = None


class UsbDetails(WireModel):
    """`usb` details: never the device path or serial number."""

    vid: Uint16 | None = None
    pid: Uint16 | None = None
    manufacturer: Text | None = None
    product: Text | None = None
    interface: Label | None = None


class MdnsDetails(WireModel):
    """`mdns` details: never an address or port."""

    service_type: Text | None = None
    instance: Text | None = None


class DiscoveryCandidate(WireModel):
    """`sensorium-device-discovery-candidate.v1`."""

    schema_: Literal["sensorium-device-discovery-candidate.v1"] = Field(alias="schema")
    candidate_ref: OpaqueId = Field(alias="candidate/ref")
    transport: Transport
    generation: OpaqueId
    first_seen_at: Time
    last_seen_at: Time
    expires_at: Time
    label: Label | None = None
    signal: Signal | None = None
    ble: BleDetails | None = None
    usb: UsbDetails | None = None
    mdns: MdnsDetails | None = None
    extensions: OpenObject | None = None


Candidates = Annotated[list[DiscoveryCandidate], Field(max_length=MAX_ITEMS)]


class DiscoveryResult(WireModel):
    """`sensorium-device-discovery-result.v1`."""

    schema_: Literal["sensorium-device-discovery-result.v1"] = Field(alias="schema")
    reason: Literal["window-complete", "limit-reached", "deadline-reached"]
    partial: bool
    final_revision: Count
    candidates: Candidates
    erased_at: Time | None = None
    extensions: OpenObject | None = None


class Snapshot(WireModel):
    """`progress.snapshot`: the whole current candidate list."""

    candidates: Candidates


class SnapshotBounds(WireModel):
    """`progress.bounds`."""

    max_candidates: Positive
    max_snapshot_bytes: Positive


class DiscoveryProgress(WireModel):
    """`progress` of a v2 status."""

    type_: Literal["sensorium-device-discovery-progress.v1"] = Field(alias="type")
    revision: Positive
    generation: OpaqueId
    snapshot: Snapshot
    bounds: SnapshotBounds


class Cancellation(WireModel):
    """`cancellation` of a v2 status."""

    state: Literal["requested", "confirmed", "uncertain"]
    requested_at: Time
    confirmed_at: Time | None = None


class Cleanup(WireModel):
    """`cleanup` of a v2 status."""

    state: Literal["pending", "confirmed", "uncertain"]
    claim: Literal["held", "released"]


class _StatusFields(WireModel):
    """Members shared by both status versions."""

    operation_id: OperationId = Field(alias="operation/id")
    operation_kind: OperationKind = Field(alias="operation/kind")
    status: Status
    diagnostics: Diagnostics
    retry_after_seconds: Count | None = None
    expires_at: Time | None = None
    updated_at: Time | None = None
    attempt_no: Positive | None = None
    error: ErrorObject | None = None
    causal_context: CausalContext | None = Field(default=None, alias="causal/context")
    extensions: OpenObject | None = None


class DeferredOperationStatusV1(_StatusFields):
    """`deferred-operation-status.v1`: a completed status may carry any `result`."""

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"result"})

    schema_: Literal["deferred-operation-status.v1"] = Field(alias="schema")
    schema_v: Annotated[Literal[1], BeforeValidator(_plain_int)] = Field(alias="schema/v")
    result: Any = None


class DeferredOperationStatusV2(_StatusFields):
    """`deferred-operation-status.v2`: discovery, with typed progress, cancellation and cleanup."""

    schema_: Literal["deferred-operation-status.v2"] = Field(alias="schema")
    schema_v: Annotated[Literal[2], BeforeValidator(_plain_int)] = Field(alias="schema/v")
    result: DiscoveryResult | None = None
    progress: DiscoveryProgress | None = None
    cancellation: Cancellation | None = None
    cleanup: Cleanup | None = None


class DeviceBinding(WireModel):
    """`sensorium-device-binding.v1`: the only document with a transport address."""

    schema_: Literal["sensorium-device-binding.v1"] = Field(alias="schema")
    binding_id: OpaqueId = Field(alias="binding/id")
    operation_id: OperationId = Field(alias="operation/id")
    candidate_ref: OpaqueId = Field(alias="candidate/ref")
    transport: Transport
    bound_at: Time
    address: Name
    label: Label | None = None
    ble: BleDetails | None = None
    usb: UsbDetails | None = None
    mdns: MdnsDetails | None = None
    extensions: OpenObject | None = None


class ResumePoint(WireModel):
    """Where a flow resumes and which binding receives the result."""

    executor_id: Name
    output_binding: Name
    template_id: Name | None = None
    step_index: Count | None = None
    step_id: Name | None = None


class ContinuationCaller(WireModel):
    """Who waits on a continuation."""

    module_id: Name
    principal_id: Name | None = None


class ContinuationTrace(WireModel):
    """Trace ids carried by a continuation."""

    correlation_id: Name | None = Field(default=None, alias="correlation/id")
    trace_id: Name | None = Field(default=None, alias="trace/id")


class Continuation(WireModel):
    """`orbiplex-continuation.v1`: host-private, a value rather than a captured stack."""

    schema_: Literal["orbiplex-continuation.v1"] = Field(alias="schema")
    continuation_id: Name
    deferred_operation_id: OperationId
    resume_kind: Name
    resume_point: ResumePoint
    caller: ContinuationCaller
    capability_id: Name
    deadline_at: Time
    attempts: Count
    workflow_run_id: Name | None = None
    step_id: Name | None = None
    context: OpenObject | None = None
    envelope: OpenObject | None = None
    trace: ContinuationTrace | None = None
    idempotency_key: Name | None = None
    extensions: OpenObject | None = None


class ExecutionReceipt(WireModel):
    """`execution-receipt.v1`: projection of a terminal status."""

    schema_: Literal["execution-receipt.v1"] = Field(alias="schema")
    operation_id: Name = Field(alias="operation/id")
    deferred_operation_id: OperationId = Field(alias="deferred_operation/id")
    status: TerminalStatus
    finished_at: Time
    causal_context: CausalContext | None = Field(default=None, alias="causal/context")
    extensions: OpenObject | None = None


class ErrorDocument(WireModel):
    """`sensorium-error.v1`: every 4xx/5xx body."""

    schema_: Literal["sensorium-error.v1"] = Field(alias="schema")
    code: ErrorCode
    message: Text
    diagnostics: Diagnostics | None = None
    retry_after_seconds: Count | None = None
    extensions: OpenObject | None = None


MODELS: Mapping[str, type[BaseModel]] = {
    "sensorium-directive.v1": Directive,
    "sensorium-directive-result.v1": DirectiveResult,
    "sensorium-connector-deferred.v1": ConnectorDeferred,
    "deferred-operation.v1": DeferredOperation,
    "deferred-operation-status.v1": DeferredOperationStatusV1,
    "deferred-operation-status.v2": DeferredOperationStatusV2,
    "sensorium-device-discovery-candidate.v1": DiscoveryCandidate,
    "sensorium-device-discovery-result.v1": DiscoveryResult,
    "sensorium-device-binding.v1": DeviceBinding,
    "orbiplex-continuation.v1": Continuation,
    "execution-receipt.v1": ExecutionReceipt,
    "sensorium-error.v1": ErrorDocument,
    "sensorium-action-catalog.v1": ActionCatalog,
    "sensorium-catalog-signature.v1": CatalogSignature,
}


def validate_wire(name: str, document: Any) -> BaseModel:
    """Parse a wire document into its model, accepting aliases only (raises pydantic's ValidationError)."""
    if name not in MODELS:
        raise UnknownSchemaError("no model by that name")
    return MODELS[name].model_validate(document, by_alias=True, by_name=False)
