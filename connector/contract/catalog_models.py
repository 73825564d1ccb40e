"""Models of the operator-signed action catalog and its detached signature (CONTRACT §1, 2, 6.1).

They mirror `schemas/sensorium-action-catalog.v1.schema.json` and
`schemas/sensorium-catalog-signature.v1.schema.json`; the vectors under `schemas/vectors/` hold both to
the same verdicts. Rules a JSON Schema cannot express (unique action ids, expiry after issue) live here.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from connector.contract.transports import Transport

CATALOG_SCHEMA = "sensorium-action-catalog.v1"
SIGNATURE_SCHEMA = "sensorium-catalog-signature.v1"

# I-JSON safe integers: RFC 8785 cannot canonicalise anything larger.
MAX_SAFE_INT = 2**53 - 1
MAX_ACTIONS = 64

ACTION_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
# 64 bytes in unpadded base64url: 86 characters, the last one carrying 2 bits and 4 zero bits.
SIGNATURE_PATTERN = r"^[A-Za-z0-9_-]{85}[AQgw]$"
UTC_TIME_PATTERN = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?Z$"
)
_UTC_TIME = re.compile(UTC_TIME_PATTERN)

ExecutionModeSupport = Literal["sync-only", "either", "async-only"]
ActionClass = Literal["discovery", "command"]


def _parse_utc_time(value: object) -> datetime:
    """Accept only an RFC 3339 UTC string with `Z`; answer an aware datetime."""
    if not isinstance(value, str) or not _UTC_TIME.fullmatch(value):
        raise ValueError("utc-time: expected an RFC 3339 UTC time ending in Z")
    return datetime.fromisoformat(value)


def format_utc_time(value: datetime) -> str:
    """RFC 3339 UTC with `Z`, whole seconds unless the time carries a fraction."""
    text = value.isoformat(timespec="milliseconds" if value.microsecond else "seconds")
    return text.replace("+00:00", "Z")


UtcTime = Annotated[
    datetime,
    BeforeValidator(_parse_utc_time),
    PlainSerializer(format_utc_time, return_type=str),
    WithJsonSchema({"type": "string", "pattern": UTC_TIME_PATTERN}),  # what `_parse_utc_time` checks
]
BoundedStr = Annotated[StrictStr, Field(max_length=256)]
Identifier = Annotated[StrictStr, Field(min_length=1, max_length=128, pattern=ACTION_ID_PATTERN)]
PositiveInt = Annotated[StrictInt, Field(ge=1, le=MAX_SAFE_INT)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INT)]


class _Closed(BaseModel):
    """Closed, frozen, alias-aware base of every catalog model."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        # The schemas never allow null: an optional field is absent, not null.
        if value is None:
            raise ValueError("no-null-values: an optional field is omitted, never null")
        return value


class DeferredProfileModel(_Closed):
    """An action's hints for deferred work (CONTRACT §3)."""

    preferred_max_ttl_seconds: PositiveInt | None = None
    retry_after_seconds: NonNegativeInt | None = None


class DiscoveryProfileModel(_Closed):
    """The `discovery` profile of a discovery action (CONTRACT §6.1)."""

    transports: tuple[Transport, ...] = Field(min_length=1, max_length=3)
    max_window_seconds: PositiveInt
    max_candidates: Annotated[StrictInt, Field(ge=1, le=64)]
    max_snapshot_bytes: PositiveInt
    min_revision_interval_ms: NonNegativeInt
    max_revisions: PositiveInt
    candidate_ttl_seconds: PositiveInt
    cleanup_timeout_ms: PositiveInt
    allow_unfiltered: StrictBool = False
    result_retention_seconds: NonNegativeInt = 600

    @field_validator("transports")
    @classmethod
    def _unique_transports(cls, value: tuple[Transport, ...]) -> tuple[Transport, ...]:
        if len(set(value)) != len(value):
            raise ValueError("unique-transports: transports must be unique")
        return value


class CommandSpec(_Closed):
    """The `command` of a command action: what to spawn and how to stop it."""

    argv: tuple[BoundedStr, ...] = Field(min_length=1, max_length=64)
    timeout_ms: PositiveInt
    cancel: Literal["terminate", "none"]
    input: Literal["stdin-json", "none"]


class CatalogAction(_Closed):
    """One action of the catalog; its class decides which profile it carries."""

    action_id: Identifier
    action_class: ActionClass = Field(alias="class")
    execution_mode_support: ExecutionModeSupport = "sync-only"
    deferred_profile: DeferredProfileModel | None = None
    discovery: DiscoveryProfileModel | None = None
    command: CommandSpec | None = None
    description: BoundedStr | None = None
    extensions: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _profile_matches_class(self) -> CatalogAction:
        wants_discovery = self.action_class == "discovery"
        if (self.discovery is not None) != wants_discovery or (self.command is not None) == wants_discovery:
            raise ValueError(
                "profile-matches-class: a discovery action carries `discovery`, "
                "a command action carries `command`"
            )
        return self


class ActionCatalog(_Closed):
    """A `sensorium-action-catalog.v1` document."""

    schema_: Literal["sensorium-action-catalog.v1"] = Field(alias="schema")
    catalog_id: Identifier = Field(alias="catalog/id")
    catalog_version: PositiveInt = Field(alias="catalog/version")
    issued_at: UtcTime
    expires_at: UtcTime | None = None
    actions: tuple[CatalogAction, ...] = Field(min_length=1, max_length=MAX_ACTIONS)
    extensions: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _semantic_rules(self) -> ActionCatalog:
        ids = [action.action_id for action in self.actions]
        if len(set(ids)) != len(ids):
            raise ValueError("unique-action-ids: two actions share an action_id")
        if self.expires_at is not None and self.expires_at <= self.issued_at:
            raise ValueError("expires-after-issued: expires_at is not after issued_at")
        return self


class CatalogSignature(_Closed):
    """A `sensorium-catalog-signature.v1` detached signature document."""

    schema_: Literal["sensorium-catalog-signature.v1"] = Field(alias="schema")
    alg: Literal["ed25519"]
    key_id: Annotated[StrictStr, Field(pattern=KEY_ID_PATTERN)] = Field(alias="key/id")
    signature: Annotated[StrictStr, Field(pattern=SIGNATURE_PATTERN)]
    extensions: dict[str, Any] | None = None
