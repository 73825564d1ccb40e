"""Real `serve --nats` processes over a Bus test environment."""

from __future__ import annotations

from pathlib import Path

from tests.bus.support import BusEnv
from tests.support.paths import SHIPPED_TRUST
from tests.support.serving import ServeProcess, start_serve


def start_bus_serve(env: BusEnv, nats_url: str, name: str, timeout: float = 30.0) -> ServeProcess:
    """`serve --nats URL` over the environment; returns once `/healthz` is 200 (Bus subscribed)."""
    args: list[str | Path] = ["--data-dir", env.data_dir, "--nats", nats_url]
    args += ["--catalog", env.catalog, "--trust", SHIPPED_TRUST]
    for transport, fixture in env.fixtures.items():
        args += ["--replay", f"{transport}={fixture}"]
    return start_serve(*args, log=env.root / f"{name}.stderr.log", timeout=timeout)
