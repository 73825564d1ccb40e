"""Pure signing and verification: every refusal code, the order of checks, and the verified view."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.catalog.keys import key_id_for
from connector.catalog.signing import VerifiedCatalog, sign_catalog, verify_catalog
from connector.core.scope import DiscoveryProfile
from connector.errors import AdmissionError, CatalogError
from tests.catalog.helpers import CANARY, NOW, error_text
from tests.support.catalogs import example_catalog

PRIVATE = Ed25519PrivateKey.generate()
TRUSTED: dict[str, Ed25519PublicKey] = {key_id_for(PRIVATE.public_key()): PRIVATE.public_key()}


def verify(catalog: Any, signature: Any, *, now: datetime = NOW, floor: int | None = None) -> VerifiedCatalog:
    """Verify against the module's trusted key."""
    return verify_catalog(catalog, signature, TRUSTED, now=now, highest_accepted_version=floor)


def refusal(catalog: Any, signature: Any, *, now: datetime = NOW, floor: int | None = None) -> CatalogError:
    """The refusal verification raises."""
    with pytest.raises(CatalogError) as refused:
        verify(catalog, signature, now=now, floor=floor)
    return refused.value


def test_round_trip_gives_the_verified_view() -> None:
    catalog = example_catalog()
    verified = verify(catalog, sign_catalog(catalog, PRIVATE))
    assert verified.catalog_id == "sensorium-os.example"
    assert verified.version == 1
    assert verified.issued_at == datetime(2026, 11, 30, tzinfo=UTC)
    assert verified.expires_at == datetime(2031, 11, 30, tzinfo=UTC)
    assert verified.key_id == key_id_for(PRIVATE.public_key())
    assert list(verified.actions) == [
        "device.discovery.scan",
        "whisper.redaction.prepare",
        "sensorium.os.info",
    ]
    assert verified.actions["sensorium.os.info"].execution_mode_support == "sync-only"
    command = verified.actions["whisper.redaction.prepare"].command
    assert command is not None and command.argv == ("python3", "-m", "connector.actions.redact")


def test_signature_document_shape() -> None:
    catalog = example_catalog()
    signature = sign_catalog(catalog, PRIVATE)
    assert set(signature) == {"schema", "alg", "key/id", "signature"}
    assert signature["schema"] == "sensorium-catalog-signature.v1"
    assert signature["alg"] == "ed25519"
    assert len(signature["signature"]) == 86 and "=" not in signature["signature"]


def test_discovery_profile_of_the_scan_action() -> None:
    catalog = example_catalog()
    verified = verify(catalog, sign_catalog(catalog, PRIVATE))
    assert verified.discovery_profile("device.discovery.scan") == DiscoveryProfile(
        transports=("ble", "usb-serial", "mdns"),
        max_window_seconds=60,
        max_candidates=64,
        max_snapshot_bytes=65536,
        min_revision_interval_ms=250,
        max_revisions=1000,
        candidate_ttl_seconds=30,
        cleanup_timeout_ms=4000,
        allow_unfiltered=False,
        result_retention_seconds=600,
    )


@pytest.mark.parametrize("action_id", ["sensorium.os.info", "no.such.action"])
def test_discovery_profile_refuses_other_actions(action_id: str) -> None:
    catalog = example_catalog()
    verified = verify(catalog, sign_catalog(catalog, PRIVATE))
    with pytest.raises(AdmissionError) as refused:
        verified.discovery_profile(action_id)
    assert refused.value.code == "unknown-action"
    assert action_id not in refused.value.message


def test_profile_defaults_apply_when_omitted() -> None:
    catalog = example_catalog()
    discovery = catalog["actions"][0]["discovery"]
    del discovery["allow_unfiltered"], discovery["result_retention_seconds"]
    del catalog["actions"][2]["execution_mode_support"]
    verified = verify(catalog, sign_catalog(catalog, PRIVATE))
    profile = verified.discovery_profile("device.discovery.scan")
    assert (profile.allow_unfiltered, profile.result_retention_seconds) == (False, 600)
    assert verified.actions["sensorium.os.info"].execution_mode_support == "sync-only"


def test_summary_lists_action_modes() -> None:
    catalog = example_catalog()
    summary = verify(catalog, sign_catalog(catalog, PRIVATE)).summary()
    assert summary == {
        "catalog/id": "sensorium-os.example",
        "catalog/version": 1,
        "actions": [
            {"action_id": "device.discovery.scan", "execution_mode_support": "async-only"},
            {"action_id": "whisper.redaction.prepare", "execution_mode_support": "either"},
            {"action_id": "sensorium.os.info", "execution_mode_support": "sync-only"},
        ],
    }


def test_key_order_and_whitespace_do_not_matter() -> None:
    catalog = example_catalog()
    signature = sign_catalog(catalog, PRIVATE)
    reordered = json.loads(json.dumps(dict(reversed(list(catalog.items()))), indent=7))
    assert verify(reordered, signature).version == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c["actions"][2]["command"]["argv"].append("-a"),
        lambda c: c["actions"][0]["discovery"].update({"allow_unfiltered": True}),
        lambda c: c["actions"][0]["discovery"]["transports"].reverse(),
        lambda c: c.update({"catalog/version": 2}),
        lambda c: c.update({"expires_at": "2031-11-30T00:00:01Z"}),
        lambda c: c["actions"].pop(),
        lambda c: c["actions"][1].update({"description": CANARY}),
    ],
    ids=["argv", "allow-unfiltered", "transport-order", "version", "expiry", "action-removed", "description"],
)
def test_any_semantic_change_breaks_the_signature(change: Any) -> None:
    catalog = example_catalog()
    signature = sign_catalog(catalog, PRIVATE)
    change(catalog)
    refused = refusal(catalog, signature)
    assert refused.code == "catalog-bad-signature"
    assert CANARY not in error_text(refused)


def test_unknown_key_is_refused() -> None:
    catalog = example_catalog()
    stranger = Ed25519PrivateKey.generate()
    assert refusal(catalog, sign_catalog(catalog, stranger)).code == "catalog-unknown-key"


def test_a_stranger_claiming_a_trusted_key_id_has_a_bad_signature() -> None:
    catalog = example_catalog()
    forged = sign_catalog(catalog, Ed25519PrivateKey.generate())
    forged["key/id"] = key_id_for(PRIVATE.public_key())
    assert refusal(catalog, forged).code == "catalog-bad-signature"


def test_signature_over_another_catalog_is_bad() -> None:
    catalog, other = example_catalog(), example_catalog()
    other["catalog/id"] = "other.catalog"
    assert refusal(catalog, sign_catalog(other, PRIVATE)).code == "catalog-bad-signature"


def test_expired_catalog_is_refused_from_its_expiry_on() -> None:
    catalog = example_catalog()
    signature = sign_catalog(catalog, PRIVATE)
    expiry = datetime(2031, 11, 30, tzinfo=UTC)
    assert verify(catalog, signature, now=expiry - timedelta(seconds=1)).version == 1
    assert refusal(catalog, signature, now=expiry).code == "catalog-expired"
    assert refusal(catalog, signature, now=expiry + timedelta(days=1)).code == "catalog-expired"


def test_catalog_without_expiry_does_not_expire() -> None:
    catalog = example_catalog()
    del catalog["expires_at"]
    verified = verify(catalog, sign_catalog(catalog, PRIVATE), now=datetime(2999, 1, 1, tzinfo=UTC))
    assert verified.expires_at is None


def test_issued_in_the_future_beyond_five_minutes_is_not_yet_valid() -> None:
    catalog = example_catalog()
    signature = sign_catalog(catalog, PRIVATE)
    issued = datetime(2026, 11, 30, tzinfo=UTC)
    assert verify(catalog, signature, now=issued - timedelta(minutes=5)).version == 1
    refused = refusal(catalog, signature, now=issued - timedelta(minutes=5, seconds=1))
    assert refused.code == "catalog-not-yet-valid"


def test_rollback_below_the_floor_is_refused_and_equal_is_fine() -> None:
    catalog = example_catalog()
    catalog["catalog/version"] = 5
    signature = sign_catalog(catalog, PRIVATE)
    assert refusal(catalog, signature, floor=6).code == "catalog-rollback"
    assert verify(catalog, signature, floor=5).version == 5
    assert verify(catalog, signature, floor=4).version == 5
    assert verify(catalog, signature, floor=None).version == 5


@pytest.mark.parametrize(
    "signature",
    [
        None,
        [],
        "signature",
        {"schema": "sensorium-catalog-signature.v1", "alg": "ed25519"},
        {"schema": "sensorium-catalog-signature.v1", "alg": "ed25519", "key/id": "0" * 16, "signature": "AA"},
    ],
    ids=["null", "array", "string", "missing-fields", "short-signature"],
)
def test_malformed_signature_document_is_refused(signature: Any) -> None:
    assert refusal(example_catalog(), signature).code == "catalog-malformed"


def test_malformed_catalog_is_refused_even_when_signed() -> None:
    catalog = example_catalog()
    catalog["actions"][2]["command"]["timeout_ms"] = 0
    refused = refusal(catalog, sign_catalog(example_catalog(), PRIVATE))
    assert refused.code == "catalog-malformed"
    assert {"code": "greater-than-equal", "message": "/actions/2/command/timeout_ms"} in refused.diagnostics


def test_refusal_diagnostics_never_echo_input_names_or_values() -> None:
    catalog = example_catalog()
    catalog[CANARY] = CANARY
    catalog["actions"][0]["discovery"]["max_candidates"] = CANARY
    catalog["actions"][1]["command"]["argv"] = [CANARY] * 65
    catalog["catalog/id"] = CANARY
    refused = refusal(catalog, sign_catalog(example_catalog(), PRIVATE))
    assert refused.code == "catalog-malformed"
    assert CANARY not in error_text(refused)
    assert {"code": "additional-properties", "message": "/"} in refused.diagnostics
    assert {"code": "int-type", "message": "/actions/0/discovery/max_candidates"} in refused.diagnostics


@pytest.mark.parametrize(
    ("first_failure", "expected"),
    [
        ("signature-shape", "catalog-malformed"),
        ("catalog-shape", "catalog-malformed"),
        ("unknown-key", "catalog-unknown-key"),
        ("bad-signature", "catalog-bad-signature"),
        ("expired", "catalog-expired"),
    ],
)
def test_checks_run_in_order(first_failure: str, expected: str) -> None:
    """Each case also breaks every later check, so only the earliest may answer."""
    catalog = example_catalog()
    catalog["expires_at"] = "2026-12-01T00:00:00Z"
    catalog["catalog/version"] = 1
    signer = (
        Ed25519PrivateKey.generate()
        if first_failure in {"signature-shape", "catalog-shape", "unknown-key"}
        else PRIVATE
    )
    signature = sign_catalog(catalog, signer)
    if first_failure in {"signature-shape", "catalog-shape", "unknown-key", "bad-signature"}:
        catalog["issued_at"] = "2026-11-30T00:00:01Z"  # breaks the signature
    if first_failure == "signature-shape":
        signature["alg"] = "rsa"
    if first_failure in {"signature-shape", "catalog-shape"}:
        catalog["actions"] = []
    refused = refusal(catalog, signature, now=datetime(2027, 6, 1, tzinfo=UTC), floor=2)
    assert refused.code == expected


def test_sign_refuses_a_malformed_catalog() -> None:
    catalog = example_catalog()
    catalog["actions"][1]["class"] = "discovery"
    with pytest.raises(CatalogError) as refused:
        sign_catalog(catalog, PRIVATE)
    assert refused.value.code == "catalog-malformed"


def test_a_catalog_without_canonical_form_is_malformed() -> None:
    catalog = example_catalog()
    catalog["extensions"] = {"too_big": 2**60}
    with pytest.raises(CatalogError) as unsignable:
        sign_catalog(catalog, PRIVATE)
    assert unsignable.value.code == "catalog-malformed"
    assert str(2**60) not in error_text(unsignable.value)
    signature = sign_catalog(example_catalog(), PRIVATE)
    assert refusal(catalog, signature).code == "catalog-malformed"


def test_naive_now_is_a_programming_error() -> None:
    catalog = example_catalog()
    with pytest.raises(ValueError):
        verify(catalog, sign_catalog(catalog, PRIVATE), now=datetime(2027, 1, 1))


def test_verified_catalog_is_immutable() -> None:
    catalog = example_catalog()
    verified = verify(catalog, sign_catalog(catalog, PRIVATE))
    with pytest.raises(AttributeError):
        verified.version = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        verified.actions["x"] = verified.actions["sensorium.os.info"]  # type: ignore[index]


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every scalar in a JSON value."""
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, (*path, key))]
    if isinstance(node, list):
        return [leaf for index, value in enumerate(node) for leaf in _leaves(value, (*path, index))]
    return [path]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_no_changed_scalar_is_ever_accepted(data: st.DataObject) -> None:
    catalog = example_catalog()
    signature = sign_catalog(catalog, PRIVATE)
    path = data.draw(st.sampled_from(_leaves(catalog)))
    parent = catalog
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    new = data.draw(
        st.one_of(st.integers(-5, 10**6), st.text(max_size=12), st.booleans(), st.none()).filter(
            lambda value: value != old or type(value) is not type(old)
        )
    )
    parent[path[-1]] = new
    assert refusal(catalog, signature).code in {"catalog-bad-signature", "catalog-malformed"}


def test_diagnostic_paths_are_json_pointers() -> None:
    catalog = example_catalog()
    catalog["catalog/id"] = "Not An Id"
    refused = refusal(catalog, sign_catalog(example_catalog(), PRIVATE))
    assert refused.diagnostics == ({"code": "string-pattern-mismatch", "message": "/catalog~1id"},)
    assert "Not An Id" not in error_text(refused)


@pytest.mark.parametrize("support", ["either", "sync-only", None])
def test_a_discovery_action_that_is_not_async_only_is_invalid(support: str | None) -> None:
    """CONTRACT §6.1 (issue D4): a sync scan would otherwise get a deferred handle; refused at
    verification."""
    catalog = example_catalog()
    scan = next(a for a in catalog["actions"] if a["action_id"] == "device.discovery.scan")
    if support is None:
        del scan["execution_mode_support"]  # absent means sync-only (CONTRACT §2)
    else:
        scan["execution_mode_support"] = support
    refused = refusal(catalog, sign_catalog(catalog, PRIVATE))
    assert refused.code == "catalog-invalid"
    assert refused.diagnostics[0]["message"].endswith("/execution_mode_support: async-only")
