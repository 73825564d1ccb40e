"""Shared test configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--hw` opts in to tests that need real adapters."""
    parser.addoption("--hw", action="store_true", default=False, help="run tests that need real hardware")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip hardware tests unless `--hw` or SENSORIUM_HW=1."""
    if config.getoption("--hw") or os.environ.get("SENSORIUM_HW") == "1":
        return
    skip = pytest.mark.skip(reason="needs a real adapter: pass --hw or set SENSORIUM_HW=1")
    for item in items:
        if "hw" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def repo_root() -> Path:
    """The repository root."""
    return REPO_ROOT
