"""No violation ever carries a value of the document: canaries planted everywhere never come back."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from connector.cli.main import main
from connector.contract.validate import validate
from tests.contract.vectors import VECTORS, Vector

_counter = itertools.count()


def _canary() -> str:
    return f"CANARY{next(_counter):05d}q"


def _plant(node: Any) -> Any:
    """Every string becomes a canary, and every object gains a member whose name and value are canaries."""
    if isinstance(node, dict):
        planted = {key: _plant(value) for key, value in node.items()}
        planted[_canary()] = _canary()
        return planted
    if isinstance(node, list):
        return [_plant(item) for item in node]
    return _canary() if isinstance(node, str) else node


def _plant_values_only(node: Any) -> Any:
    """Every string value becomes a canary; the member names stay, so the rules still find their way."""
    if isinstance(node, dict):
        return {key: _plant_values_only(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plant_values_only(item) for item in node]
    return _canary() if isinstance(node, str) else node


@pytest.mark.parametrize("plant", [_plant, _plant_values_only])
@pytest.mark.parametrize("via", ["schema", "model"])
@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.id)
def test_violations_never_echo_a_value(vector: Vector, via: Literal["schema", "model"], plant: Any) -> None:
    planted = plant(vector.document())
    found = validate(vector.schema, planted, via=via)
    assert found  # every string changed, so every document is now wrong somewhere
    assert not any("CANARY" in str(v) for v in found)


@pytest.mark.parametrize(
    "document",
    [
        # An unknown member, a wrong type, a broken pattern, a long string and a bad enum, all canaries.
        {"schema": "sensorium-error.v1", "code": "CANARY-code", "message": "CANARY" * 50, "CANARY-key": 1},
        {"schema": "sensorium-error.v1", "code": "internal", "message": ["CANARY-in-list"]},
        {
            "schema": "CANARY-schema",
            "code": "internal",
            "message": "m",
            "diagnostics": [{"code": 7, "x": "CANARY"}],
        },
    ],
)
def test_cli_output_never_echoes_a_value(
    document: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert main(["schema", "validate", "sensorium-error.v1", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out and "CANARY" not in out + err


def test_malformed_json_reason_never_quotes_the_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema": "sensorium-error.v1", "code": CANARY-unquoted}', encoding="utf-8")
    assert main(["schema", "validate", "sensorium-error.v1", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "CANARY" not in err and err.count("\n") == 1
