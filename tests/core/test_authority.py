"""The pure authority checks: authentication, grants, transport narrowing, reads, revocation diffs."""

from __future__ import annotations

import hmac

import pytest

from connector.core import authority
from connector.core.authority import (
    Grant,
    Principal,
    authenticate,
    find_grant,
    format_grant,
    hash_token,
    lost_actions,
    make_grant,
    may_forget_binding,
    may_see,
    parse_grant_spec,
    require_grant,
    require_operator,
)
from connector.errors import SensoriumError

SCAN = "device.discovery.scan"
REDACT = "whisper.redaction.prepare"


def _principal(
    pid: str, token: str, *grants: Grant, role: str = "caller", revoked: bool = False
) -> Principal:
    checked = authority.check_role(role)
    return Principal(pid, checked, hash_token(token), tuple(grants), revoked)


ALICE = _principal("alice", "tok-alice", Grant(SCAN, ("ble",)), Grant(REDACT))
BOB = _principal("bob", "tok-bob", Grant(SCAN))
OPS = _principal("ops", "tok-ops", role="operator")
GONE = _principal("gone", "tok-gone", revoked=True)
EVERYONE = (ALICE, BOB, OPS, GONE)


def test_hash_token_is_sha256_hex() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize(
    ("token", "expected"), [("tok-alice", "alice"), ("tok-bob", "bob"), ("tok-ops", "ops")]
)
def test_authenticate_good_tokens(token: str, expected: str) -> None:
    assert authenticate(token, EVERYONE).principal_id == expected


@pytest.mark.parametrize(
    "token", [None, "", "tok-nobody", "TOK-ALICE", "tok-alice ", hash_token("tok-alice")]
)
def test_authenticate_refuses_missing_and_unknown(token: str | None) -> None:
    with pytest.raises(SensoriumError) as refused:
        authenticate(token, EVERYONE)
    assert refused.value.code == "unauthenticated"
    assert refused.value.http_status == 401


def test_authenticate_refuses_a_revoked_principal() -> None:
    with pytest.raises(SensoriumError) as refused:
        authenticate("tok-gone", EVERYONE)
    assert refused.value.code == "unauthenticated"


def test_authenticate_with_no_principals_refuses() -> None:
    with pytest.raises(SensoriumError):
        authenticate("anything", ())


def test_authenticate_compares_against_every_principal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = hmac.compare_digest

    def counting(a: str, b: str) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    # The match is the first entry: a loop with an early exit would compare once.
    assert authenticate("tok-alice", EVERYONE) is ALICE
    assert calls == [p.token_sha256 for p in EVERYONE]


def test_refusal_message_never_holds_the_token() -> None:
    with pytest.raises(SensoriumError) as refused:
        authenticate("canary-token-4242", EVERYONE)
    assert "canary" not in str(refused.value) and "canary" not in str(refused.value.to_document())


def test_grant_without_transports_covers_every_transport() -> None:
    assert require_grant(BOB, SCAN, "usb-serial") == Grant(SCAN)
    assert require_grant(BOB, SCAN, "mdns") == Grant(SCAN)


def test_grant_narrowed_to_transports() -> None:
    assert require_grant(ALICE, SCAN, "ble").transports == ("ble",)
    for transport in ("usb-serial", "mdns"):
        with pytest.raises(SensoriumError) as refused:
            require_grant(ALICE, SCAN, transport)
        assert refused.value.code == "forbidden"
        assert refused.value.http_status == 403


def test_command_actions_have_no_transport() -> None:
    assert require_grant(ALICE, REDACT, None) == Grant(REDACT)
    with pytest.raises(SensoriumError):
        require_grant(BOB, REDACT, None)


def test_operators_hold_no_caller_grants() -> None:
    operator_with_grant = Principal("ops2", "operator", hash_token("x"), (Grant(SCAN),))
    for principal in (OPS, operator_with_grant):
        with pytest.raises(SensoriumError) as refused:
            require_grant(principal, SCAN, "ble")
        assert refused.value.code == "forbidden"
        assert not may_see(principal, principal.principal_id, SCAN, "ble")


def test_revoked_principal_holds_no_grant() -> None:
    revoked = Principal("alice", "caller", ALICE.token_sha256, ALICE.grants, revoked=True)
    assert find_grant(revoked, SCAN, "ble") is None
    assert not may_see(revoked, "alice", SCAN, "ble")


def test_may_see_needs_owner_and_current_grant() -> None:
    assert may_see(ALICE, "alice", SCAN, "ble")
    assert not may_see(BOB, "alice", SCAN, "ble")  # an id in hand authorises nothing
    assert not may_see(ALICE, "alice", SCAN, "mdns")  # grant no longer covers the scope
    narrowed = Principal("alice", "caller", ALICE.token_sha256, (Grant(REDACT),))
    assert not may_see(narrowed, "alice", SCAN, "ble")  # grant revoked since the start


def test_require_operator() -> None:
    require_operator(OPS)
    for principal in (ALICE, Principal("ops", "operator", OPS.token_sha256, revoked=True)):
        with pytest.raises(SensoriumError) as refused:
            require_operator(principal)
        assert refused.value.code == "forbidden"


def test_may_forget_binding() -> None:
    no_grants = Principal("alice", "caller", ALICE.token_sha256)
    assert may_forget_binding(no_grants, "alice")  # erasing needs no grant
    assert not may_forget_binding(BOB, "alice")
    assert may_forget_binding(OPS, "alice")
    assert not may_forget_binding(GONE, "gone")


@pytest.mark.parametrize(
    ("before", "after", "lost"),
    [
        (ALICE, ALICE, frozenset()),
        (ALICE, None, frozenset({SCAN, REDACT})),
        (
            ALICE,
            Principal("alice", "caller", ALICE.token_sha256, ALICE.grants, True),
            frozenset({SCAN, REDACT}),
        ),
        (ALICE, Principal("alice", "caller", ALICE.token_sha256, (Grant(REDACT),)), frozenset({SCAN})),
        (BOB, Principal("bob", "caller", BOB.token_sha256, (Grant(SCAN, ("ble",)),)), frozenset({SCAN})),
        (ALICE, Principal("alice", "caller", ALICE.token_sha256, (Grant(SCAN), Grant(REDACT))), frozenset()),
        (None, ALICE, frozenset()),
        (GONE, None, frozenset()),
    ],
)
def test_lost_actions(before: Principal | None, after: Principal | None, lost: frozenset[str]) -> None:
    assert lost_actions(before, after) == lost


@pytest.mark.parametrize(
    ("spec", "grant"),
    [
        (SCAN, Grant(SCAN)),
        (f"{SCAN}:ble", Grant(SCAN, ("ble",))),
        (f"{SCAN}:ble,mdns", Grant(SCAN, ("ble", "mdns"))),
        (REDACT, Grant(REDACT)),
    ],
)
def test_parse_grant_spec_round_trip(spec: str, grant: Grant) -> None:
    assert parse_grant_spec(spec) == grant
    assert format_grant(grant) == spec


@pytest.mark.parametrize(
    "spec", ["", ":ble", "Device.Scan", f"{SCAN}:", f"{SCAN}:wifi", f"{SCAN}:ble,ble", "a" * 129, "-x"]
)
def test_parse_grant_spec_refuses(spec: str) -> None:
    with pytest.raises(SensoriumError) as refused:
        parse_grant_spec(spec)
    assert refused.value.code == "invalid-input"


def test_make_grant_checks_transports() -> None:
    assert make_grant(SCAN, ["usb-serial"]).transports == ("usb-serial",)
    with pytest.raises(SensoriumError):
        make_grant(SCAN, [])


@pytest.mark.parametrize("pid", ["", "-a", "a b", "a/b", "x" * 129, "ä"])
def test_principal_id_is_checked(pid: str) -> None:
    with pytest.raises(SensoriumError):
        authority.check_principal_id(pid)


def test_role_is_checked() -> None:
    assert authority.check_role("operator") == "operator"
    with pytest.raises(SensoriumError):
        authority.check_role("admin")
