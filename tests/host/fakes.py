"""A scripted connector behind the host's port, a settable clock and jitter: host tests without I/O timing."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connector.catalog.signing import VerifiedCatalog
from connector.contract.catalog_models import CatalogAction
from connector.core import admission, authority
from connector.core.admission import Identified
from connector.core.authority import Grant, Principal, hash_token
from connector.core.policy import DeferredHostPolicy
from connector.errors import SensoriumError
from connector.host.metrics import HostMetrics
from connector.host.port import ActionInfo
from connector.host.service import HostService
from connector.runtime.operations import Kind, Observed
from connector.service.answers import Accepted, Done
from connector.storage.registry import DeferredRegistry
from tests.host.records import T0, command_metadata, discovery_metadata, new_op_id
from tests.support.catalogs import command_action, example_catalog
from tests.support.clocks import ManualClock
from tests.support.directives import command_directive

ACTIONS = {
    "device.discovery.scan": ActionInfo("device.discovery.scan", "discovery", 1, 300),
    "whisper.redaction.prepare": ActionInfo("whisper.redaction.prepare", "command", 1, 120),
    "test.free": ActionInfo("test.free", "command", 1, None),
}
TOKENS = {"alice": "token-alice", "bob": "token-bob", "operator": "token-operator"}
# What `identify` checks a directive against: the shipped example's actions and `test.free`.
CATALOG = VerifiedCatalog(
    catalog_id="host-fakes",
    version=1,
    issued_at=T0,
    expires_at=None,
    actions={
        entry["action_id"]: CatalogAction.model_validate(entry)
        for entry in (*example_catalog()["actions"], command_action("test.free", ["true"]))
    },
    key_id="0" * 16,
)


class Jitter:
    """Jitter draws from a list (cycled), or one fixed value."""

    def __init__(self, *values: float) -> None:
        self.values = list(values) or [0.0]
        self.calls = 0

    def __call__(self) -> float:
        value = self.values[self.calls % len(self.values)]
        self.calls += 1
        return value


@dataclass
class FakeOp:
    """One operation as the scripted connector sees it."""

    kind: Kind
    status: str = "running"
    retry_hint: int | None = None
    document_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def metadata(self, op_id: str) -> dict[str, Any]:
        if self.kind == "discovery":
            return discovery_metadata(op_id, self.status, **self.extra)
        return command_metadata(op_id, self.status, **self.extra)

    def document(self, op_id: str) -> dict[str, Any]:
        doc = command_metadata(op_id, self.status, **self.extra)
        if self.kind == "discovery":
            doc = {**doc, "schema": "deferred-operation-status.v2", "schema/v": 2}
            doc["cleanup"] = self.extra.get("cleanup", {"state": "pending", "claim": "held"})
        if self.retry_hint is not None and "retry_after_seconds" in doc:
            doc["retry_after_seconds"] = self.retry_hint
        if self.status == "completed":
            doc["result"] = {"json": "x" * self.document_bytes}
        return doc


@dataclass
class FakePort:
    """The host's `ConnectorPort`, answering from `ops`; records stops and cancels."""

    ops: dict[str, FakeOp] = field(default_factory=dict)
    stops: list[tuple[str, str, str]] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    failing: Exception | None = None
    next_handle: dict[str, Any] = field(default_factory=dict)
    sync_answer: Done | SensoriumError | None = None  # answered instead of a handle (raised if an error)
    principals: tuple[Principal, ...] = (
        Principal(
            "alice",
            "caller",
            hash_token(TOKENS["alice"]),
            (Grant("device.discovery.scan"), Grant("whisper.redaction.prepare")),
        ),
        Principal("bob", "caller", hash_token(TOKENS["bob"]), (Grant("device.discovery.scan"),)),
        Principal("operator", "operator", hash_token(TOKENS["operator"])),
    )

    def authenticate(self, token: str | None) -> Principal:
        return authority.authenticate(token, self.principals)

    def action(self, action_id: str) -> ActionInfo | None:
        return ACTIONS.get(action_id)

    def identify(
        self, principal: Principal, directive: Any, *, op_key: str | None, operations_only: bool
    ) -> Identified:
        return admission.identify(
            directive, principal=principal, catalog=CATALOG, op_key=op_key, operations_only=operations_only
        )

    async def admit(
        self,
        principal: Principal,
        directive: Any,
        *,
        op_key: str | None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        if isinstance(self.sync_answer, SensoriumError):
            raise self.sync_answer
        if self.sync_answer is not None:
            return self.sync_answer
        action = ACTIONS[directive["action_id"]]
        op_id = self.next_handle.pop("connector_operation/id", None) or new_op_id()
        self.ops.setdefault(op_id, FakeOp(action.kind, status="pending"))
        handle: dict[str, Any] = {
            "schema": "sensorium-connector-deferred.v1",
            "connector_operation/id": op_id,
            "action_id": action.action_id,
            "retry_after_seconds": 1,
            "status_path": f"/v1/operations/{op_id}",
            "cancel_path": f"/v1/operations/{op_id}/cancel",
            "diagnostics": [],
        }
        handle.update(self.next_handle)
        if "cancel/unavailable-reason" in handle:
            handle.pop("cancel_path")
        return Accepted(handle, handle["status_path"])

    async def observe(self, operation_id: str, kind: Kind) -> Observed | None:
        if self.failing is not None:
            raise self.failing
        op = self.ops.get(operation_id)
        if op is None:
            return None
        document = op.document(operation_id) if op.kind == "command" else None
        return Observed(op.status, op.metadata(operation_id), op.retry_hint, document)

    async def caller_status(
        self, operation_id: str, kind: Kind, *, wait_seconds: float | None, after_revision: int | None
    ) -> dict[str, Any] | None:
        op = self.ops.get(operation_id)
        return None if op is None else copy.deepcopy(op.document(operation_id))

    async def cancel(self, operation_id: str, kind: Kind) -> tuple[bool, dict[str, Any]] | None:
        self.cancels.append(operation_id)
        op = self.ops.get(operation_id)
        if op is None:
            return None
        return op.status in ("pending", "running"), copy.deepcopy(op.document(operation_id))

    async def stop(self, operation_id: str, kind: Kind, error_code: str) -> None:
        self.stops.append((operation_id, kind, error_code))


async def fake_host(
    data_dir: Path,
    *,
    policy: DeferredHostPolicy | None = None,
    clock: ManualClock | None = None,
    jitter: Jitter | None = None,
    port: FakePort | None = None,
) -> tuple[HostService, FakePort, ManualClock]:
    """A host over a scripted connector and a fresh registry (close `host.registry` afterwards)."""
    registry = await DeferredRegistry.open(data_dir)
    port = port or FakePort()
    clock = clock or ManualClock(T0)
    host = HostService(
        port, registry, policy or DeferredHostPolicy(), clock, jitter or Jitter(0.0), metrics=HostMetrics()
    )
    return host, port, clock


def directive(action_id: str = "device.discovery.scan", **timing: Any) -> dict[str, Any]:
    """A directive the scripted connector accepts (its contents are not checked)."""
    return command_directive(action_id, timing=timing)
