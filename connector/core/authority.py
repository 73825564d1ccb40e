"""Authority (CONTRACT §8): principals, token hashes, grants and the checks every request goes through.

Rules held here:
- only SHA-256 hex digests of bearer tokens are ever stored or compared, always in constant time and
  against every principal (no early exit that would time which entry matched);
- a grant names an action and may narrow its transports; operators hold no caller grants, so they cannot
  start, select or bind, and see operations only through the durable admin views;
- possession of an operation id authorises nothing: reads need the owner AND a grant that still covers it;
- a revoked principal authenticates no more.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from connector.contract.transports import TRANSPORTS
from connector.errors import Code, SensoriumError

Role = Literal["caller", "operator"]
ROLES: tuple[Role, ...] = ("caller", "operator")

ACTION_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
PRINCIPAL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TOKEN_SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class Grant:
    """Permission to run one action; `transports` None means every transport the action allows."""

    action_id: str
    transports: tuple[str, ...] | None = None

    def covers(self, action_id: str, transport: str | None) -> bool:
        """True when this grant allows `action_id` on `transport` (None: the action has no transport)."""
        if action_id != self.action_id:
            return False
        return transport is None or self.transports is None or transport in self.transports


@dataclass(frozen=True, slots=True)
class Principal:
    """One authenticated party; the token itself is never held, only its SHA-256 hex digest."""

    principal_id: str
    role: Role
    token_sha256: str
    grants: tuple[Grant, ...] = ()
    revoked: bool = False

    @property
    def action_ids(self) -> frozenset[str]:
        """Every action id this principal holds a grant for."""
        return frozenset(grant.action_id for grant in self.grants)


def hash_token(token: str) -> str:
    """SHA-256 hex digest of a bearer token (UTF-8)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authenticate(token: str | None, principals: Sequence[Principal]) -> Principal:
    """The principal holding `token`; `unauthenticated` for none, unknown or revoked."""
    found = _holder(hash_token(token or ""), principals)
    if token and found is not None and not found.revoked:
        return found
    raise _unauthenticated()


def still_authenticated(principal: Principal, principals: Sequence[Principal]) -> Principal:
    """The current version of the principal holding the same token (after a long wait), as `authenticate`
    would answer for that token now; `unauthenticated` once it is unknown or revoked."""
    found = _holder(principal.token_sha256, principals)
    if found is not None and not found.revoked:
        return found
    raise _unauthenticated()


def _holder(presented: str, principals: Sequence[Principal]) -> Principal | None:
    found: Principal | None = None
    for principal in principals:
        # Every entry is compared; the match is remembered, never returned early.
        if hmac.compare_digest(presented, principal.token_sha256) and found is None:
            found = principal
    return found


def _unauthenticated() -> SensoriumError:
    return SensoriumError("missing, unknown or revoked bearer token", code=Code.UNAUTHENTICATED)


def find_grant(principal: Principal, action_id: str, transport: str | None) -> Grant | None:
    """The first current grant covering (action, transport), or None."""
    if principal.revoked or principal.role != "caller":
        return None
    return next((grant for grant in principal.grants if grant.covers(action_id, transport)), None)


def require_grant(principal: Principal, action_id: str, transport: str | None) -> Grant:
    """The grant that lets this caller run the action on the transport; `forbidden` otherwise."""
    grant = find_grant(principal, action_id, transport)
    if grant is None:
        raise SensoriumError("no grant for this action or scope", code=Code.FORBIDDEN)
    return grant


def may_see(principal: Principal, owner_id: str, action_id: str, transport: str | None) -> bool:
    """True when the principal owns the operation AND a current grant still covers it."""
    if principal.principal_id != owner_id:
        return False
    return find_grant(principal, action_id, transport) is not None


def require_operator(principal: Principal) -> None:
    """Refuse (`forbidden`) anyone but a non-revoked operator (admin routes)."""
    if principal.revoked or principal.role != "operator":
        raise SensoriumError("operator role required", code=Code.FORBIDDEN)


def may_forget_binding(principal: Principal, owner_id: str) -> bool:
    """The owner may always forget its own binding (erasure needs no grant); an operator any."""
    if principal.revoked:
        return False
    return principal.role == "operator" or principal.principal_id == owner_id


def lost_actions(before: Principal | None, after: Principal | None) -> frozenset[str]:
    """Action ids whose coverage shrank from `before` to `after` (grant removed or transports narrowed).

    A principal that was revoked or removed loses every action it held.
    """
    if before is None or before.revoked:
        return frozenset()
    if after is None or after.revoked:
        return before.action_ids
    return frozenset(old.action_id for old in before.grants if not _still_covered(old, after.grants))


def _still_covered(old: Grant, grants: Iterable[Grant]) -> bool:
    """True when some grant of the same action allows every transport `old` allowed."""
    for new in grants:
        if new.action_id != old.action_id:
            continue
        if new.transports is None:
            return True
        if old.transports is not None and set(old.transports) <= set(new.transports):
            return True
    return False


def check_principal_id(principal_id: str) -> str:
    """Validate a principal id (it appears in admin paths); `invalid-input` when malformed."""
    if not PRINCIPAL_ID_PATTERN.fullmatch(principal_id):
        raise SensoriumError(
            "principal id must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", code=Code.INVALID_INPUT
        )
    return principal_id


def check_role(role: str) -> Role:
    """Validate a role name; `invalid-input` when it is neither caller nor operator."""
    for known in ROLES:
        if role == known:
            return known
    raise SensoriumError("role must be caller or operator", code=Code.INVALID_INPUT)


def make_grant(action_id: str, transports: Iterable[str] | None = None) -> Grant:
    """A validated grant; `invalid-input` for a malformed action id or an unknown/duplicate transport."""
    if not ACTION_ID_PATTERN.fullmatch(action_id):
        raise SensoriumError("grant action id is malformed", code=Code.INVALID_INPUT)
    if transports is None:
        return Grant(action_id)
    listed = tuple(transports)
    if not listed or len(set(listed)) != len(listed) or any(t not in TRANSPORTS for t in listed):
        raise SensoriumError(
            "grant transports must be unique values of ble, usb-serial, mdns", code=Code.INVALID_INPUT
        )
    return Grant(action_id, listed)


def parse_grant_spec(spec: str) -> Grant:
    """Parse the CLI form `ACTION[:TRANSPORT,...]` into a grant."""
    action_id, sep, transports = spec.partition(":")
    return make_grant(action_id, transports.split(",") if sep else None)


def format_grant(grant: Grant) -> str:
    """The CLI form of a grant (`ACTION` or `ACTION:T1,T2`)."""
    if grant.transports is None:
        return grant.action_id
    return f"{grant.action_id}:{','.join(grant.transports)}"
