"""Shared test configuration."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import leaks
from tests.support.paths import REPO


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--hw` opts in to tests that need real adapters."""
    parser.addoption("--hw", action="store_true", default=False, help="run tests that need real hardware")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests on real peers and processes `realtime`; skip hardware tests unless asked for."""
    for item in items:
        _mark_realtime(item)
    if config.getoption("--hw") or os.environ.get("SENSORIUM_HW") == "1":
        return
    skip = pytest.mark.skip(reason="needs a real adapter: pass --hw or set SENSORIUM_HW=1")
    for item in items:
        if "hw" in item.keywords:
            item.add_marker(skip)


# A test that uses one of these fixtures waits on a real peer (a nats-server, the emulated BlueZ on its
# dbus-daemon, avahi in a network namespace, a lab of processes) in real time.
_REAL_PEER_FIXTURES = frozenset(
    {"broker", "bluez", "lab", "shared_lo_lab", "fresh_lo_lab", "veth_lab", "ipv6_lab"}
)
# Markers that already say a test drives real processes.
_REAL_PROCESS_MARKERS = ("serve", "lab", "browser", "terminal", "hw")


def _mark_realtime(item: pytest.Item) -> None:
    """`realtime` for a test on a real peer or process, when its module did not say so itself."""
    if item.get_closest_marker("realtime") is not None:
        return
    uses_peer = not _REAL_PEER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
    if uses_peer or any(item.get_closest_marker(name) for name in _REAL_PROCESS_MARKERS):
        item.add_marker(pytest.mark.realtime)


@pytest.fixture
def repo_root() -> Path:
    """The repository root."""
    return REPO


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


# ---- no test leaves a task, a thread or a child process behind (see tests/support/leaks.py) ------------

_RUNNER = "_function_scoped_runner"  # pytest-asyncio's per-test event loop


@pytest.fixture(autouse=True)
def _leaves_nothing_running(request: pytest.FixtureRequest) -> Any:
    """Fail a test that leaves a pending task, a live thread or a running child process behind.

    Set up after the session- and module-scoped fixtures (their services are not counted), and, for an
    async test, after its event loop, so that the loop is still open when this teardown looks at it.
    """
    loop = request.getfixturevalue(_RUNNER).get_loop() if _RUNNER in request.fixturenames else None
    before = leaks.snapshot()
    yield
    found = leaks.leaks(before, loop)
    assert not found, "left running after the test:\n" + "\n".join(found)
