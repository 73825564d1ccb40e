"""Helpers for the host tests: principals, directives, a signed test catalog, an in-process host app."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx

from connector.api.host_routes import host_router
from connector.assembly import Assembled, ConnectorConfig, assemble
from connector.catalog.keys import load_private_key
from connector.catalog.signing import sign_catalog
from connector.contract.validate import validate
from connector.core.authority import make_grant
from connector.storage.principals import add_principal
from providers.base import Provider

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "hw-fixtures"
HEART_RATE = "0000180d-0000-1000-8000-00805f9b34fb"
PROGRAMS = REPO / "tests" / "commands" / "programs.py"
TERMINAL = {"completed", "failed", "timed-out", "cancelled", "expired", "unknown"}
KIND = "sensorium.directive.invoke"


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens of the test principals."""

    alice: str
    bob: str
    operator: str


def add_principals(data_dir: Path, extra_actions: tuple[str, ...] = ()) -> Tokens:
    """alice and bob are callers of every example action; `operator` is an operator."""
    actions = ("device.discovery.scan", "whisper.redaction.prepare", "sensorium.os.info", *extra_actions)
    grants = [make_grant(a) for a in actions]
    return Tokens(
        alice=add_principal(data_dir, "alice", "caller", grants),
        bob=add_principal(data_dir, "bob", "caller", grants),
        operator=add_principal(data_dir, "operator", "operator"),
    )


def bearer(token: str) -> dict[str, str]:
    """The Authorization header of a token."""
    return {"Authorization": f"Bearer {token}"}


def scan_directive(window: int = 1, **extra: Any) -> dict[str, Any]:
    """A heart-rate BLE scan (async, status v2)."""
    timing: dict[str, Any] = {"mode": "async", "status_versions": [2]}
    timing.update(extra.pop("timing", {}))
    directive: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "action_id": "device.discovery.scan",
        "timing": timing,
        "input": {"transport": "ble", "window_seconds": window, "filters": {"service_uuids": [HEART_RATE]}},
    }
    directive.update(extra)
    return directive


def command_directive(
    action_id: str, mode: str = "async", input: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """A command action directive."""
    timing: dict[str, Any] = {"mode": mode}
    timing.update(extra.pop("timing", {}))
    directive: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "action_id": action_id,
        "timing": timing,
        "input": input if input is not None else {},
    }
    directive.update(extra)
    return directive


def signed_catalog(directory: Path, marker: Path) -> tuple[Path, tuple[str, ...]]:
    """The example catalog plus slow, non-cancelable and flooding commands, signed with the test key."""
    document: dict[str, Any] = json.loads((REPO / "catalog" / "actions.json").read_text())
    document = copy.deepcopy(document)
    program = ["python3", str(PROGRAMS)]
    profile = {"preferred_max_ttl_seconds": 600, "retry_after_seconds": 1}
    extra = [
        ("test.slow", ["sleep", str(marker), "60"], "terminate"),
        ("test.stubborn", ["sleep", str(marker), "60"], "none"),
        ("test.flood", ["flood", "4000"], "terminate"),
    ]
    for action_id, args, cancel in extra:
        document["actions"].append(
            {
                "action_id": action_id,
                "class": "command",
                "execution_mode_support": "async-only",
                "deferred_profile": profile,
                "command": {"argv": program + args, "timeout_ms": 60000, "cancel": cancel, "input": "none"},
            }
        )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "actions.json"
    key = load_private_key(REPO / "tests" / "keys" / "26d160dae106b7bb.key")
    path.write_text(json.dumps(document, indent=2))
    path.with_name("actions.json.sig").write_text(json.dumps(sign_catalog(document, key)))
    return path, tuple(action_id for action_id, _, _ in extra)


def check(schema: str, document: Any) -> None:
    """The contract validator finds nothing wrong."""
    violations = validate(schema, document, via="schema")
    assert not violations, [str(v) for v in violations]


def parse_time(text: str) -> datetime:
    """An RFC 3339 `Z` time."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


@asynccontextmanager
async def host_app(
    data_dir: Path,
    *,
    replay: dict[str, Path] | None = None,
    replay_speed: float = 20.0,
    clock: Callable[[], datetime] | None = None,
    providers: Callable[[ConnectorConfig], Callable[[str, str | None], Provider]] | None = None,
    **config: Any,
) -> AsyncIterator[tuple[Assembled, httpx.AsyncClient]]:
    """An assembled connector + host (routes mounted) and an in-process HTTP client."""
    settings = ConnectorConfig(
        data_dir=data_dir,
        catalog=config.pop("catalog", REPO / "catalog" / "actions.json"),
        trust_dir=REPO / "catalog" / "trust",
        replay=replay if replay is not None else {"ble": FIXTURES / "ble-heart-rate-lab.jsonl"},
        replay_speed=replay_speed,
        **config,
    )
    kwargs: dict[str, Any] = {"routers": lambda a: [host_router(a.host)]}
    if clock is not None:
        kwargs["clock"] = clock
    if providers is not None:
        kwargs["providers"] = providers(settings)
    async with assemble(settings, **kwargs) as assembled:
        transport = httpx.ASGITransport(app=assembled.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://host.test") as client:
            yield assembled, client


async def poll_until(
    client: httpx.AsyncClient,
    path: str,
    token: str,
    done: Callable[[dict[str, Any]], bool],
    timeout: float = 15.0,
) -> list[dict[str, Any]]:
    """GET `path` until `done(body)`; every answer is returned (in order)."""
    seen: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        while True:
            response = await client.get(path, headers=bearer(token))
            assert response.status_code == 200, response.text
            seen.append(response.json())
            if done(seen[-1]):
                return seen
            await anyio.sleep(0.05)


def terminal(body: dict[str, Any]) -> bool:
    """True for a terminal status document."""
    return body.get("status") in TERMINAL
