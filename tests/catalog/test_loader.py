"""Loading `CATALOG` + `CATALOG.sig` from disk: refusals by file, rollback state, the shipped example."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from connector.catalog.loader import load_verified_catalog
from connector.catalog.signing import VerifiedCatalog
from connector.catalog.state import STATE_FILE, highest_accepted_version, record_accepted_version
from connector.errors import CatalogError
from tests.catalog.helpers import CANARY, NOW, error_text
from tests.support.catalogs import Operator, example_catalog, new_operator, write_signed
from tests.support.paths import SHIPPED_CATALOG, SHIPPED_TRUST, TEST_KEYS


def load(operator: Operator, catalog_path: Path, data_dir: Path | None = None) -> VerifiedCatalog:
    """Load with the operator's trust dir at the test clock."""
    return load_verified_catalog(catalog_path, trust_dir=operator.trust_dir, data_dir=data_dir, now=NOW)


def refusal(operator: Operator, catalog_path: Path, data_dir: Path | None = None) -> CatalogError:
    """The refusal loading raises."""
    with pytest.raises(CatalogError) as refused:
        load(operator, catalog_path, data_dir)
    return refused.value


def test_round_trip_from_files(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    verified = load(operator, path)
    assert (verified.catalog_id, verified.version, verified.key_id) == (
        "sensorium-os.example",
        1,
        operator.key_id,
    )
    assert len(verified.actions) == 3


def test_one_flipped_byte_in_the_file_breaks_the_signature(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    data = bytearray(path.read_bytes())
    offset = data.index(b"uname")
    data[offset] ^= 0x01  # "u" -> "t": still valid JSON, still a well-formed catalog
    path.write_bytes(bytes(data))
    assert json.loads(path.read_bytes())["actions"][2]["command"]["argv"][0] == "tname"
    assert refusal(operator, path).code == "catalog-bad-signature"


def test_a_semantically_changed_value_breaks_the_signature(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    catalog = example_catalog()
    write_signed(path, catalog, operator.private_key)
    catalog["actions"][0]["discovery"]["max_window_seconds"] = 3600
    catalog["actions"][0]["description"] = CANARY
    path.write_text(json.dumps(catalog), encoding="utf-8")
    refused = refusal(operator, path)
    assert refused.code == "catalog-bad-signature"
    assert CANARY not in error_text(refused)


def test_a_catalog_signed_by_an_untrusted_key_is_refused(operator: Operator, tmp_path: Path) -> None:
    stranger = new_operator(tmp_path / "stranger")
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), stranger.private_key)
    assert refusal(operator, path).code == "catalog-unknown-key"


def test_an_expired_catalog_is_refused(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    catalog = example_catalog()
    catalog["issued_at"], catalog["expires_at"] = "2026-01-01T00:00:00Z", "2026-06-01T00:00:00Z"
    write_signed(path, catalog, operator.private_key)
    assert refusal(operator, path).code == "catalog-expired"


def test_rollback_against_the_recorded_floor(operator: Operator, tmp_path: Path) -> None:
    data_dir, path = tmp_path / "data", tmp_path / "actions.json"
    catalog = example_catalog()
    catalog["catalog/version"] = 2
    write_signed(path, catalog, operator.private_key)
    assert load(operator, path, data_dir).version == 2
    assert highest_accepted_version(data_dir, "sensorium-os.example") == 2

    catalog["catalog/version"] = 1
    write_signed(path, catalog, operator.private_key)
    assert refusal(operator, path, data_dir).code == "catalog-rollback"
    assert highest_accepted_version(data_dir, "sensorium-os.example") == 2

    catalog["catalog/version"] = 2
    write_signed(path, catalog, operator.private_key)
    assert load(operator, path, data_dir).version == 2

    catalog["catalog/version"] = 3
    write_signed(path, catalog, operator.private_key)
    assert load(operator, path, data_dir).version == 3
    assert highest_accepted_version(data_dir, "sensorium-os.example") == 3


def test_a_higher_recorded_version_refuses_the_catalog(operator: Operator, tmp_path: Path) -> None:
    data_dir, path = tmp_path / "data", tmp_path / "actions.json"
    record_accepted_version(data_dir, "sensorium-os.example", 7)
    record_accepted_version(data_dir, "another.catalog", 1)
    write_signed(path, example_catalog(), operator.private_key)
    assert refusal(operator, path, data_dir).code == "catalog-rollback"


def test_the_floor_is_global_across_catalog_ids(operator: Operator, tmp_path: Path) -> None:
    """CONTRACT §12: "the highest recorded": a fresh `catalog/id` cannot reset the floor (issue D8)."""
    data_dir, path = tmp_path / "data", tmp_path / "actions.json"
    record_accepted_version(data_dir, "another.catalog", 5)
    write_signed(path, example_catalog(), operator.private_key)  # version 1, another id
    assert refusal(operator, path, data_dir).code == "catalog-rollback"
    catalog = example_catalog()
    catalog["catalog/version"] = 5
    write_signed(path, catalog, operator.private_key)
    assert load(operator, path, data_dir).version == 5  # equal is fine


def test_refused_catalogs_are_not_recorded(operator: Operator, tmp_path: Path) -> None:
    data_dir, path = tmp_path / "data", tmp_path / "actions.json"
    catalog = example_catalog()
    write_signed(path, catalog, operator.private_key)
    catalog["catalog/version"] = 50
    path.write_text(json.dumps(catalog), encoding="utf-8")
    assert refusal(operator, path, data_dir).code == "catalog-bad-signature"
    assert not (data_dir / STATE_FILE).exists()


def test_without_a_data_dir_nothing_is_written(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    load(operator, path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    "content",
    [
        b'{"schema": "sensorium-action-catalog.v1", ' + CANARY.encode(),
        b"",
        b"\xff\xfe{}",
        b'{"catalog/id": "a", "catalog/id": "b"}',
        b'{"catalog/version": NaN}',
        b"[" * 100_000,
        b'{"x": 1' + b"0" * 5000 + b"}",
    ],
    ids=["truncated", "empty", "not-utf8", "duplicate-key", "nan", "deep", "huge-int"],
)
def test_malformed_json_catalog_is_refused(operator: Operator, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    path.write_bytes(content)
    refused = refusal(operator, path)
    assert refused.code == "catalog-malformed"
    assert CANARY not in error_text(refused)


def test_an_oversized_catalog_file_is_refused(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    path.write_bytes(b" " * (1024 * 1024 + 1) + b"{}")
    assert refusal(operator, path).code == "catalog-malformed"


def test_malformed_json_signature_is_refused(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    (tmp_path / "actions.json.sig").write_text(
        '{"schema": "sensorium-catalog-signature.v1",', encoding="utf-8"
    )
    assert refusal(operator, path).code == "catalog-malformed"


def test_a_signature_document_of_the_wrong_shape_is_refused(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    signature = write_signed(path, example_catalog(), operator.private_key)
    signature["comment"] = CANARY
    (tmp_path / "actions.json.sig").write_text(json.dumps(signature), encoding="utf-8")
    refused = refusal(operator, path)
    assert refused.code == "catalog-malformed"
    assert CANARY not in error_text(refused)


def test_a_missing_signature_is_unsigned(operator: Operator, tmp_path: Path) -> None:
    path = tmp_path / "actions.json"
    write_signed(path, example_catalog(), operator.private_key)
    (tmp_path / "actions.json.sig").unlink()
    assert refusal(operator, path).code == "catalog-unsigned"


def test_a_missing_catalog_is_refused(operator: Operator, tmp_path: Path) -> None:
    assert refusal(operator, tmp_path / "absent.json").code == "catalog-missing"


def test_the_shipped_example_verifies_with_the_shipped_trust_dir(tmp_path: Path) -> None:
    for now in (NOW, datetime.now(UTC)):
        verified = load_verified_catalog(SHIPPED_CATALOG, trust_dir=SHIPPED_TRUST, data_dir=tmp_path, now=now)
        assert (verified.catalog_id, verified.version) == ("sensorium-os.example", 1)
        assert set(verified.actions) == {
            "device.discovery.scan",
            "whisper.redaction.prepare",
            "sensorium.os.info",
        }
    assert highest_accepted_version(tmp_path, "sensorium-os.example") == 1


def test_the_shipped_trust_dir_holds_the_public_half_of_the_test_key() -> None:
    key_files = sorted(TEST_KEYS.glob("*.key"))
    assert len(key_files) == 1
    assert (SHIPPED_TRUST / f"{key_files[0].stem}.pub").is_file()
    assert (
        json.loads((SHIPPED_CATALOG.parent / "actions.json.sig").read_text())["key/id"] == key_files[0].stem
    )
