"""Operation ids (CONTRACT §4) and the opaque random ids of candidates, bindings and correlations.

Entropy is passed in (the caller owns `secrets.token_bytes`), so every function here is deterministic.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

from connector.contract.canonical import canonical_bytes

OPERATION_KIND = "sensorium.directive.invoke"
OPERATION_ID_PREFIX = "deferred"
SUFFIX_BYTES = 16
MIN_OPAQUE_ENTROPY_BYTES = 16
MAX_OPAQUE_ID_LENGTH = 128

_KIND = re.compile(r"[a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)*")


def operation_id(kind: str, *, principal_id: str, action_id: str, idempotency_key: str) -> str:
    """The id of a keyed operation, derived from (principal, action, key) only."""
    digest = hashlib.sha256(canonical_bytes([principal_id, action_id, idempotency_key])).digest()
    return _format(kind, digest[:SUFFIX_BYTES])


def keyed_operation_id(principal_id: str, action_id: str, idempotency_key: str) -> str:
    """The id of a keyed directive (CONTRACT §4): every face (HTTP, Bus, host) derives it here."""
    return operation_id(
        OPERATION_KIND, principal_id=principal_id, action_id=action_id, idempotency_key=idempotency_key
    )


def random_operation_id(kind: str, entropy: bytes) -> str:
    """The id of an unkeyed operation from 16 bytes (128 bits) of fresh entropy."""
    if len(entropy) != SUFFIX_BYTES:
        raise ValueError("an operation id needs exactly 16 bytes of entropy")
    return _format(kind, entropy)


def opaque_id(entropy: bytes) -> str:
    """A random url-safe id (base64url, no padding) for candidate refs, binding ids and correlation ids."""
    if len(entropy) < MIN_OPAQUE_ENTROPY_BYTES:
        raise ValueError("an opaque id needs at least 16 bytes of entropy")
    text = base64.urlsafe_b64encode(entropy).rstrip(b"=").decode("ascii")
    if len(text) > MAX_OPAQUE_ID_LENGTH:
        raise ValueError("an opaque id is at most 128 characters")
    return text


def _format(kind: str, raw: bytes) -> str:
    if _KIND.fullmatch(kind) is None:
        raise ValueError("operation kind is not well formed")
    return f"{OPERATION_ID_PREFIX}:{kind}:{_b32(raw)}"


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).rstrip(b"=").decode("ascii")



def bind_replay_digest(
    key: bytes, *, principal_id: str, operation_id: str, idempotency_key: str
) -> str:
    """The keyed digest that lets a bind retry find its binding after a restart (CONTRACT §6.8).

    It covers the caller's own words only (principal, operation, idempotency key), never the candidate ref:
    CONTRACT §6.6 keeps refs, and every digest of them, out of storage. So after a restart a keyed retry
    answers the recorded binding without comparing refs, as a keyed directive repeat answers its recorded
    first answer without comparing directives once the fingerprint is gone (CONTRACT §4). `key` is a random
    secret of the connector's state, so the stored digest names no key that a reader could test guesses of.
    """
    message = canonical_bytes([principal_id, operation_id, idempotency_key])
    return hmac.new(key, message, hashlib.sha256).hexdigest()
