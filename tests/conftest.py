"""Shared test configuration."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


# ---- every HTTP answer the suite sees against /openapi.json (see tests/openapi_check.py) -----------

_MISMATCHES: list[str] = []


def _install_openapi_check() -> None:
    from tests.openapi_check import install

    install(_MISMATCHES)


_install_openapi_check()


@pytest.fixture(autouse=True)
def _responses_match_openapi() -> Any:
    """Fail a test during which an answer contradicted the OpenAPI document (even if code swallowed it)."""
    from tests.openapi_check import forget_served

    _MISMATCHES.clear()
    forget_served()
    yield
    seen = list(_MISMATCHES)
    _MISMATCHES.clear()
    assert not seen, "answers the OpenAPI document does not describe:\n" + "\n".join(seen)
