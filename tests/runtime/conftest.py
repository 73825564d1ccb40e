"""Fixtures for the runtime tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.paths import HW_FIXTURES


@pytest.fixture
def fixtures_dir() -> Path:
    """The shipped hw-fixtures folder."""
    return HW_FIXTURES


@pytest.fixture
def write_fixture(tmp_path: Path) -> Callable[..., Path]:
    """Write a fixture file from lines and return its path."""

    def write(lines: list[str], name: str = "case.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    return write
