"""The rollback floor file: highest accepted version per catalog id, written atomically, never lowered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connector.catalog.state import (
    STATE_FILE,
    highest_accepted_version,
    read_accepted_versions,
    record_accepted_version,
)
from connector.errors import CatalogError


def test_nothing_recorded_in_a_fresh_data_dir(tmp_path: Path) -> None:
    assert dict(read_accepted_versions(tmp_path / "absent")) == {}
    assert highest_accepted_version(tmp_path, "sensorium-os.example") is None


def test_record_creates_the_data_dir_and_the_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert record_accepted_version(data_dir, "sensorium-os.example", 3) == 3
    document = json.loads((data_dir / STATE_FILE).read_text(encoding="utf-8"))
    assert document == {
        "schema": "sensorium-catalog-state.v1",
        "catalogs": {"sensorium-os.example": {"highest_accepted_version": 3}},
    }


def test_the_floor_only_rises(tmp_path: Path) -> None:
    record_accepted_version(tmp_path, "a", 3)
    assert record_accepted_version(tmp_path, "a", 2) == 3
    assert record_accepted_version(tmp_path, "a", 3) == 3
    assert record_accepted_version(tmp_path, "a", 4) == 4
    assert highest_accepted_version(tmp_path, "a") == 4


def test_catalog_ids_keep_separate_floors(tmp_path: Path) -> None:
    record_accepted_version(tmp_path, "a", 5)
    record_accepted_version(tmp_path, "b", 1)
    assert dict(read_accepted_versions(tmp_path)) == {"a": 5, "b": 1}


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    for version in range(1, 4):
        record_accepted_version(tmp_path, "a", version)
    leftovers = {p.name for p in tmp_path.iterdir()} - {STATE_FILE, "catalog-state.lock"}
    assert leftovers == set()


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_accepted_version(tmp_path, "a", 1)
    before = (tmp_path / STATE_FILE).read_bytes()

    def refuse_replace(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("connector.catalog.state.os.replace", refuse_replace)
    with pytest.raises(OSError):
        record_accepted_version(tmp_path, "a", 2)
    assert (tmp_path / STATE_FILE).read_bytes() == before
    assert {p.name for p in tmp_path.iterdir()} == {STATE_FILE, "catalog-state.lock"}


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"catalogs": {}}',
        '{"schema": "sensorium-catalog-state.v1", "catalogs": []}',
        '{"schema": "sensorium-catalog-state.v1", "catalogs": {"a": {"highest_accepted_version": "3"}}}',
        '{"schema": "sensorium-catalog-state.v1", "catalogs": {"a": {"highest_accepted_version": 0}}}',
        '{"schema": "sensorium-catalog-state.v1", "catalogs": {"a": {"highest_accepted_version": true}}}',
        '{"schema": "sensorium-catalog-state.v1", "catalogs": {"a": 3}}',
    ],
    ids=["not-json", "array", "no-schema", "catalogs-list", "string", "zero", "bool", "bare-int"],
)
def test_an_unreadable_state_refuses_instead_of_forgetting_the_floor(tmp_path: Path, content: str) -> None:
    (tmp_path / STATE_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(CatalogError) as refused:
        highest_accepted_version(tmp_path, "a")
    assert refused.value.code == "catalog-state-invalid"
    with pytest.raises(CatalogError):
        record_accepted_version(tmp_path, "a", 9)
    assert (tmp_path / STATE_FILE).read_text(encoding="utf-8") == content
