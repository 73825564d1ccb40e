"""Fixtures of the catalog tests: an operator key pair and a trust dir holding its public half."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.catalogs import Operator, new_operator


@pytest.fixture
def operator(tmp_path: Path) -> Operator:
    """A fresh operator key pair, its public half copied into a trust dir."""
    return new_operator(tmp_path / "operator")
