"""Signing and verifying the action catalog (CONTRACT §1, 12); pure: documents in, verdicts out, `now` passed
in.

Verification checks, in this order, and refuses at the first failure: the signature document's shape, the
catalog's shape, a trusted key, the Ed25519 signature over the catalog's RFC 8785 bytes, the validity
window, and the rollback floor. Refusal messages name the reason and JSON paths, never document values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError

from connector.catalog.keys import b64url_decode, b64url_encode, key_id_for
from connector.contract.canonical import canonical_bytes
from connector.contract.catalog_models import (
    CATALOG_SCHEMA,
    SIGNATURE_SCHEMA,
    ActionCatalog,
    CatalogAction,
    CatalogSignature,
    CommandSpec,
    DeferredProfileModel,
    DiscoveryProfileModel,
)
from connector.core.scope import DiscoveryProfile
from connector.errors import AdmissionError, CatalogError, Code

# An issuer's clock may run a little ahead of ours.
ISSUED_AT_SKEW = timedelta(minutes=5)
SIGNATURE_BYTES = 64
MAX_DIAGNOSTICS = 16

MALFORMED = Code.CATALOG_MALFORMED
UNKNOWN_KEY = Code.CATALOG_UNKNOWN_KEY
BAD_SIGNATURE = Code.CATALOG_BAD_SIGNATURE
EXPIRED = Code.CATALOG_EXPIRED
NOT_YET_VALID = Code.CATALOG_NOT_YET_VALID
ROLLBACK = Code.CATALOG_ROLLBACK
INVALID = Code.CATALOG_INVALID

_MODELS: tuple[type[BaseModel], ...] = (
    ActionCatalog,
    CatalogAction,
    CatalogSignature,
    CommandSpec,
    DeferredProfileModel,
    DiscoveryProfileModel,
)
# Only names the models define may appear in a diagnostic path; anything else came from the input.
_KNOWN_NAMES: frozenset[str] = frozenset(
    field.alias or name for model in _MODELS for name, field in model.model_fields.items()
)


@dataclass(frozen=True, slots=True)
class VerifiedCatalog:
    """A catalog whose signature, validity window and version were accepted."""

    catalog_id: str
    version: int
    issued_at: datetime
    expires_at: datetime | None
    actions: Mapping[str, CatalogAction]
    key_id: str

    def discovery_profile(self, action_id: str) -> DiscoveryProfile:
        """The discovery profile of a discovery action (`unknown-action` when there is none)."""
        action = self.actions.get(action_id)
        if action is None or action.discovery is None:
            raise AdmissionError("no discovery action with this id in the catalog", code=Code.UNKNOWN_ACTION)
        return _to_profile(action.discovery)

    def summary(self) -> dict[str, Any]:
        """The `GET /v1/catalog` summary document (CONTRACT §9)."""
        return {
            "catalog/id": self.catalog_id,
            "catalog/version": self.version,
            "actions": [
                {"action_id": a.action_id, "execution_mode_support": a.execution_mode_support}
                for a in self.actions.values()
            ],
        }


def _to_profile(model: DiscoveryProfileModel) -> DiscoveryProfile:
    """The core's frozen profile from the contract model."""
    return DiscoveryProfile(
        transports=model.transports,
        max_window_seconds=model.max_window_seconds,
        max_candidates=model.max_candidates,
        max_snapshot_bytes=model.max_snapshot_bytes,
        min_revision_interval_ms=model.min_revision_interval_ms,
        max_revisions=model.max_revisions,
        candidate_ttl_seconds=model.candidate_ttl_seconds,
        cleanup_timeout_ms=model.cleanup_timeout_ms,
        allow_unfiltered=model.allow_unfiltered,
        result_retention_seconds=model.result_retention_seconds,
    )


def sign_catalog(catalog_doc: Mapping[str, Any], private_key: Ed25519PrivateKey) -> dict[str, Any]:
    """A `sensorium-catalog-signature.v1` document over a well-formed catalog."""
    parse_catalog(catalog_doc)
    signature = private_key.sign(_canonical(catalog_doc))
    return {
        "schema": SIGNATURE_SCHEMA,
        "alg": "ed25519",
        "key/id": key_id_for(private_key.public_key()),
        "signature": b64url_encode(signature),
    }


def verify_catalog(
    catalog_doc: object,
    signature_doc: object,
    trusted_keys: Mapping[str, Ed25519PublicKey],
    *,
    now: datetime,
    highest_accepted_version: int | None,
) -> VerifiedCatalog:
    """Accept a signed catalog or raise `CatalogError` with the first failing reason's code."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    signature = parse_signature(signature_doc)
    catalog = parse_catalog(catalog_doc)
    public_key = trusted_keys.get(signature.key_id)
    if public_key is None:
        raise CatalogError("catalog signed by a key that is not trusted", code=UNKNOWN_KEY)
    _check_signature(public_key, signature, catalog_doc)
    _check_validity_window(catalog, now)
    _check_version(catalog, highest_accepted_version)
    _check_spec_rules(catalog)
    return VerifiedCatalog(
        catalog_id=catalog.catalog_id,
        version=catalog.catalog_version,
        issued_at=catalog.issued_at,
        expires_at=catalog.expires_at,
        actions=MappingProxyType({action.action_id: action for action in catalog.actions}),
        key_id=signature.key_id,
    )


def parse_catalog(catalog_doc: object) -> ActionCatalog:
    """The catalog model, or `catalog-malformed` with paths and rule names."""
    try:
        return ActionCatalog.model_validate(catalog_doc)
    except ValidationError as error:
        raise _malformed(CATALOG_SCHEMA, error) from None


def parse_signature(signature_doc: object) -> CatalogSignature:
    """The signature model, or `catalog-malformed` with paths and rule names."""
    try:
        return CatalogSignature.model_validate(signature_doc)
    except ValidationError as error:
        raise _malformed(SIGNATURE_SCHEMA, error) from None


def _check_signature(public_key: Ed25519PublicKey, signature: CatalogSignature, catalog_doc: object) -> None:
    """Ed25519 over the canonical bytes, or `catalog-bad-signature`."""
    raw = b64url_decode(signature.signature, SIGNATURE_BYTES)
    if raw is None:
        raise CatalogError("catalog signature is not 64 bytes of base64url", code=MALFORMED)
    try:
        public_key.verify(raw, _canonical(catalog_doc))
    except InvalidSignature:
        raise CatalogError("catalog signature does not match the catalog", code=BAD_SIGNATURE) from None


def _check_validity_window(catalog: ActionCatalog, now: datetime) -> None:
    """Refuse an expired catalog or one issued in the future beyond the allowed skew."""
    if catalog.expires_at is not None and now >= catalog.expires_at:
        raise CatalogError("catalog has expired", code=EXPIRED)
    if catalog.issued_at > now + ISSUED_AT_SKEW:
        raise CatalogError("catalog is issued in the future", code=NOT_YET_VALID)


def _check_version(catalog: ActionCatalog, highest_accepted_version: int | None) -> None:
    """Refuse a version lower than the highest accepted one; equal is fine."""
    if highest_accepted_version is not None and catalog.catalog_version < highest_accepted_version:
        raise CatalogError(
            "catalog/version is lower than the highest version already accepted", code=ROLLBACK
        )


def _check_spec_rules(catalog: ActionCatalog) -> None:
    """CONTRACT §6.1: a discovery action is `async-only` (a sync scan would need a deferred handle)."""
    for index, action in enumerate(catalog.actions):
        if action.action_class == "discovery" and action.execution_mode_support != "async-only":
            raise CatalogError(
                "a discovery action must be async-only",
                code=INVALID,
                diagnostics=[
                    {"code": INVALID, "message": f"/actions/{index}/execution_mode_support: async-only"}
                ],
            )


def _canonical(catalog_doc: object) -> bytes:
    """RFC 8785 bytes of the catalog as written (not as modelled), or `catalog-malformed`."""
    try:
        return canonical_bytes(catalog_doc)
    except (ValueError, RecursionError):
        # The canonicaliser's own message may quote the offending value.
        raise CatalogError("catalog has no RFC 8785 canonical form", code=MALFORMED) from None


def _malformed(schema: str, error: ValidationError) -> CatalogError:
    """`catalog-malformed` carrying paths and rule names only."""
    diagnostics = [_diagnostic(item) for item in error.errors(include_input=False, include_url=False)]
    first = diagnostics[0]
    return CatalogError(
        f"document does not match {schema}: {first['message']} ({first['code']})",
        code=MALFORMED,
        diagnostics=diagnostics[:MAX_DIAGNOSTICS],
    )


def _diagnostic(item: Mapping[str, Any]) -> dict[str, str]:
    """One `{code: rule, message: path}` from a pydantic error, with input-chosen names masked."""
    loc: tuple[int | str, ...] = tuple(item["loc"])
    kind: str = item["type"]
    if kind == "extra_forbidden":
        return {"code": "additional-properties", "message": _path(loc[:-1])}
    return {"code": _rule(kind, item.get("msg", "")), "message": _path(loc)}


def _rule(kind: str, msg: str) -> str:
    """The rule name: ours for semantic checks, else pydantic's error type in kebab case."""
    prefix = "Value error, "
    if kind == "value_error" and msg.startswith(prefix) and ":" in msg:
        return msg[len(prefix) :].split(":", 1)[0]
    return kind.replace("_", "-")


def _path(loc: tuple[int | str, ...]) -> str:
    """An RFC 6901 pointer ("/" for the root); segments the models do not define are masked as `*`."""
    parts = [str(part) if isinstance(part, int) or part in _KNOWN_NAMES else "*" for part in loc]
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts) or "/"
