"""The view's NATS side: pings the nodes, lists them, follows their `op.done`, forwards cancels.

Rules of this file:
- nodes are found by `$SRV.PING.sensorium-os` answers carrying `node` metadata; every answer goes to the
  pure `LabTable`, which says when a node is due for a listing (new, back, restarted); every reconnect of
  the view re-lists every node;
- a node is asked only with that node's operator token (the nodes FILE); the view holds no authority of its
  own and ends no operation itself;
- logs carry node names and error types only.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from connector.bus.messages import DEFAULT_SERVICE
from connector.bus.node import ADMIN_LIST_MAX, MICRO_NAME, BrokerAccess, NodeSubjects, connect_options
from connector.core.lab import LabTable, node_info
from connector.errors import Code

_log = logging.getLogger("sensorium.lab")
MAX_PAGES = 1000
# Replies to the view come on an inbox of its own, so permissions can keep callers from reading them.
INBOX_PREFIX = "_INBOX_lab"


@dataclass(frozen=True, slots=True)
class LabSettings:
    """How the view meets the NATS system and how often it pings."""

    urls: tuple[str, ...]
    access: BrokerAccess = field(default_factory=BrokerAccess)
    service: str = DEFAULT_SERVICE
    ping_interval: float = 1.0
    # Between listings the view reads each node's newest page (new and changed operations come first).
    refresh_interval: float = 1.0
    request_timeout: float = 5.0
    reconnect_time_wait: float = 0.5


class LabFollower:
    """Keeps the table current from the NATS system; `cancel` forwards one operator's cancel."""

    def __init__(
        self,
        settings: LabSettings,
        tokens: Mapping[str, str],
        table: LabTable,
        clock: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self._tokens = dict(tokens)
        self.table = table
        self._clock = clock
        self.nc = NATS()
        self._due = anyio.Event()
        self.connected = anyio.Event()

    async def run(self) -> None:
        """Connect (retrying forever), subscribe, then ping and list for as long as the view runs."""
        await self.nc.connect(
            servers=list(self.settings.urls),
            name="sensorium-os-lab",
            inbox_prefix=INBOX_PREFIX,
            reconnected_cb=self._on_reconnected,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=self.settings.reconnect_time_wait,  # type: ignore[arg-type]
            **connect_options(self.settings.access),
        )
        inbox = self.nc.new_inbox()
        await self.nc.subscribe(inbox, cb=self._on_ping_answer)
        await self.nc.subscribe(f"{self.settings.service}.*.op.done", cb=self._on_done)
        await self.nc.flush()
        self.connected.set()
        async with anyio.create_task_group() as group:
            group.start_soon(self._pinger, inbox)
            group.start_soon(self._lister)
            group.start_soon(self._refresher)

    async def close(self) -> None:
        """Drop the connection."""
        with contextlib.suppress(NatsError):
            await self.nc.close()

    async def _pinger(self, inbox: str) -> None:
        while True:
            with contextlib.suppress(NatsError):
                await self.nc.publish(f"$SRV.PING.{MICRO_NAME}", b"", reply=inbox)
            await anyio.sleep(self.settings.ping_interval)

    async def _on_ping_answer(self, msg: Msg) -> None:
        try:
            answer = json.loads(msg.data)
        except ValueError:
            return
        info = node_info(answer) if isinstance(answer, dict) else None
        if info is not None and self.table.answered(info, self._clock()):
            self._due.set()

    async def _on_reconnected(self) -> None:
        _log.info("lab reconnected: listing every node again")
        self.table.relist_all()
        self._due.set()

    async def _on_done(self, msg: Msg) -> None:
        parts = msg.subject.split(".")
        try:
            message = json.loads(msg.data)
        except ValueError:
            return
        if len(parts) == 4 and isinstance(message, dict):
            self.table.done(parts[1], message)

    async def _lister(self) -> None:
        while True:
            await self._due.wait()
            self._due = anyio.Event()
            for name in self.table.due():
                await self._list(name)

    async def _refresher(self) -> None:
        while True:
            await anyio.sleep(self.settings.refresh_interval)
            for name in self.table.fresh(self._clock()):
                token = self._tokens.get(name)
                if token is None:
                    continue
                subject = NodeSubjects.of(self.settings.service, name).admin_list
                page = await self._ask(subject, token, {"limit": ADMIN_LIST_MAX})
                if page is not None and isinstance(page.get("operations"), list):
                    self.table.merge(name, page["operations"])

    async def _list(self, name: str) -> None:
        """Every page of a node's `admin.list`; the table takes them only when complete."""
        token = self._tokens.get(name)
        if token is None:
            self.table.listed(name, [])  # a node without a token in the nodes FILE: shown, never asked
            return
        rows: list[Any] = []
        after: str | None = None
        for _ in range(MAX_PAGES):
            request: dict[str, Any] = {"limit": ADMIN_LIST_MAX}
            if after is not None:
                request["after"] = after
            page = await self._ask(NodeSubjects.of(self.settings.service, name).admin_list, token, request)
            if page is None or not isinstance(page.get("operations"), list):
                error = page.get("error") if page is not None else None
                if isinstance(error, dict):
                    self.table.refused(name, str(error.get("code")))
                return  # listed again at its next answer
            rows += page["operations"]
            after = page.get("next_after")
            if not isinstance(after, str):
                break
        self.table.listed(name, rows)

    async def _ask(self, subject: str, token: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A request with the node's token; None when it did not answer or refused (logged by code)."""
        try:
            reply = await self.nc.request(
                subject,
                json.dumps(body).encode(),
                timeout=self.settings.request_timeout,
                headers={"Authorization": f"Bearer {token}"},
            )
            answer = json.loads(reply.data)
        except (NatsError, TimeoutError, ValueError) as error:
            _log.info("lab request to a node failed with %s", type(error).__name__)
            return None
        if not isinstance(answer, dict):
            return None
        return answer

    async def cancel(self, name: str, operation_id: str) -> dict[str, Any]:
        """The node's `admin.cancel` answer, else the view's own `{"error"}` (no token, no answer)."""
        token = self._tokens.get(name)
        if token is None:
            return _own_error(Code.FORBIDDEN, "no operator token for this node in the nodes file")
        subject = NodeSubjects.of(self.settings.service, name).admin_cancel
        answer = await self._ask(subject, token, {"operation/id": operation_id})
        if answer is None:
            return _own_error(Code.INTERNAL, "the node did not answer")
        operation = answer.get("operation")
        if isinstance(operation, dict):
            self.table.put(name, operation)
        return answer


def _own_error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"schema": "sensorium-error.v1", "code": code, "message": message}}
