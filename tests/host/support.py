"""Helpers for the host tests: principals, directives, a signed test catalog, an in-process host app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx

from connector.api.host_routes import host_router
from connector.assembly import Assembled, ConnectorConfig, assemble
from connector.contract.validate import validate
from connector.core import authority
from connector.core.admission import Identified
from connector.host.port import InProcessConnector
from connector.service.answers import Accepted, Done
from connector.timer import VirtualTimer
from providers.base import Provider
from tests.support import catalogs
from tests.support.catalogs import command_action
from tests.support.paths import HW_FIXTURES, REPO
from tests.support.principals import Tokens, bearer, create_principals
from tests.support.waiting import poll

PROGRAMS = REPO / "tests" / "runtime" / "commands" / "programs.py"
TERMINAL = {"completed", "failed", "timed-out", "cancelled", "expired", "unknown"}
KIND = "sensorium.directive.invoke"


def add_principals(data_dir: Path, extra_actions: tuple[str, ...] = ()) -> Tokens:
    """alice and bob are callers of every example action; `operator` is an operator."""
    actions = ("device.discovery.scan", "whisper.redaction.prepare", "sensorium.os.info", *extra_actions)
    return create_principals(data_dir, {"alice": actions, "bob": actions}, ["operator"])


def signed_catalog(directory: Path, marker: Path) -> tuple[Path, tuple[str, ...]]:
    """The example catalog plus slow, non-cancelable and flooding commands, signed with the test key."""
    sleep = ["python3", str(PROGRAMS), "sleep", str(marker), "60"]
    flood = ["python3", str(PROGRAMS), "flood", "4000"]
    extra = [
        command_action("test.slow", sleep, ttl_seconds=600),
        command_action("test.stubborn", sleep, cancel="none", ttl_seconds=600),
        command_action("test.flood", flood, ttl_seconds=600),
    ]
    path = catalogs.signed_catalog(directory, extra)
    return path, tuple(action["action_id"] for action in extra)


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
    timer: VirtualTimer | None = None,
    **config: Any,
) -> AsyncIterator[tuple[Assembled, httpx.AsyncClient]]:
    """An assembled connector + host (routes mounted) and an in-process HTTP client.

    With a `timer` (a `VirtualTimer`) the runtime, the poller and the replays run on it.
    """
    settings = ConnectorConfig(
        data_dir=data_dir,
        catalog=config.pop("catalog", REPO / "catalog" / "actions.json"),
        trust_dir=REPO / "catalog" / "trust",
        replay=replay if replay is not None else {"ble": HW_FIXTURES / "ble-heart-rate-lab.jsonl"},
        replay_speed=replay_speed,
        **config,
    )
    kwargs: dict[str, Any] = {"routers": lambda a: [host_router(a.host)]}
    if clock is not None:
        kwargs["clock"] = clock
    if timer is not None:
        kwargs["timer"] = timer
    if providers is not None:
        kwargs["providers"] = providers(settings)
    async with assemble(settings, **kwargs) as assembled:
        transport = httpx.ASGITransport(app=assembled.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://host.test") as client:
            yield assembled, client


async def next_due(timer: VirtualTimer, *, by_ms: int) -> None:
    """Advance the virtual clock to its next due moment, which must come by `by_ms` (else the test hangs)."""
    due_ms = timer.next_due_ms()
    assert due_ms is not None and due_ms <= by_ms, f"nothing due by {by_ms} (next {due_ms})"
    await timer.advance_to(due_ms)


async def poll_until(
    client: httpx.AsyncClient,
    path: str,
    token: str,
    done: Callable[[dict[str, Any]], bool],
    timeout: float = 15.0,
    *,
    timer: VirtualTimer | None = None,
) -> list[dict[str, Any]]:
    """GET `path` until `done(body)`; every answer is returned (in order).

    With a `timer` the virtual clock moves from due moment to due moment between the GETs (no wall wait).
    """

    async def get() -> dict[str, Any]:
        response = await client.get(path, headers=bearer(token))
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    if timer is None:
        return await poll(get, done, timeout=timeout)
    await timer.advance(0)
    answers = [await get()]
    while not done(answers[-1]):
        await next_due(timer, by_ms=timer.now_ms() + int(timeout * 1000))
        answers.append(await get())
    return answers


def terminal(body: dict[str, Any]) -> bool:
    """True for a terminal status document."""
    return body.get("status") in TERMINAL


class EndsBeforeTheHostLooks(InProcessConnector):
    """The real connector, answering its admission only once the work it admitted has ended.

    Models a connector that ends an operation during admission (a window cut to zero by the caller's
    deadline, a command that finished before its handle reached the host: `connector/host/service.py`
    `_accept` observes right after the answer): it waits on the runtime's own long poll, never on a clock.
    """

    async def admit(
        self,
        principal: authority.Principal,
        directive: Any,
        *,
        op_key: str | None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        """The connector's admission, answered after the admitted work reached its terminal status."""
        answer = await super().admit(principal, directive, op_key=op_key, identified=identified)
        if isinstance(answer, Accepted):
            op_id = answer.handle["connector_operation/id"]
            kind = self.service.catalog.actions[answer.handle["action_id"]].action_class
            with anyio.fail_after(30):
                while (seen := await self.observe(op_id, kind)) is None or seen.status not in TERMINAL:
                    await self.service.runtimes[kind].status(op_id, wait_s=5.0)
        return answer
