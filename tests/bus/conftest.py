"""Bus test fixtures: a real nats-server per test, torn down after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bus.broker import NatsServer


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server on 127.0.0.1 with a random port (learnt from its ports file)."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()
