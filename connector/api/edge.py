"""The HTTP edge below the application (CONTRACT §8): read deadlines, the connection cap, the `Host` check.

Rules of this file:
- a request's headers must arrive within `header_seconds` of the connection's opening or of the previous
  response; a connection that sent part of a request by then is answered 408 `request-timeout` and closed,
  an idle one is closed without an answer (a client could read a 408 there as the answer to its next
  request);
- a request's body must arrive within `body_seconds` of its headers, else 408 `request-timeout` (or only a
  close, once the answer has started);
- beyond `max_connections` open connections a new one is answered 503 `overloaded` with `Retry-After` at
  once, drained for `linger_seconds` so the answer is not lost to a reset, then closed; admitted
  connections go on as before;
- a `Host` that names neither an IP literal, nor `localhost`, nor a name the operator allowed is answered
  421 `misdirected-request` before the application sees the request (a DNS-rebinding page needs a name);
- `sensorium_http_connections_open` is the count the cap compares with: admitted connections not yet lost
  (a refused one is never counted), read from uvicorn's server state at scrape time.
Every answer of this file is a `sensorium-error.v1` built by the one refusal mapper of `api.errors`.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from connector.api.errors import refusal_response
from connector.errors import Code, SensoriumError


@dataclass(frozen=True, slots=True)
class HttpEdge:
    """The edge's bounds (defaults: CONTRACT §8) and the names it answers for besides IP literals."""

    header_seconds: float = 10.0
    body_seconds: float = 30.0
    max_connections: int = 256
    overloaded_retry_after_seconds: int = 1
    # Long enough for a client to read the 503 before the close; short, since the slot is not admitted.
    linger_seconds: float = 1.0
    # uvicorn's own default: an idle kept-alive connection is closed well before the header deadline.
    keep_alive_seconds: int = 5
    allowed_hosts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        positive = (self.header_seconds, self.body_seconds, self.max_connections, self.linger_seconds)
        if min(positive) <= 0 or min(self.overloaded_retry_after_seconds, self.keep_alive_seconds) < 0:
            raise ValueError("edge bounds must be positive")


def allowed_host_names(names: Iterable[str]) -> frozenset[str]:
    """`--allowed-host` values as compared: lower case, without a trailing dot; ValueError for a bad one."""
    normalised = {_without_root(name.strip().lower()) for name in names}
    if any(not name or any(c in name for c in ":/[]@ ") for name in normalised):
        raise ValueError("--allowed-host takes a host name (no port, no scheme)")
    return frozenset(normalised)


def host_is_allowed(value: str | None, names: frozenset[str]) -> bool:
    """Whether a `Host` header names an IP literal, `localhost` or an allowed name (absent: nothing named)."""
    if value is None:
        return True  # only HTTP/1.0 may omit it (h11 refuses an HTTP/1.1 request without one)
    host = _host_of(value.strip().lower())
    if host is None:
        return False
    return host == "localhost" or host in names or _is_ip_literal(host)


def _host_of(authority: str) -> str | None:
    """The host of `host [":" port]` (RFC 9110 7.2) without an IPv6 literal's brackets; None if malformed."""
    if authority.startswith("["):
        inner, bracket, rest = authority[1:].partition("]")
        return inner if bracket and _is_port_part(rest) and _is_ip_literal(inner) else None
    host, colon, port = authority.partition(":")
    if colon and not _is_port_part(colon + port):
        return None
    return _without_root(host) or None


def _is_port_part(rest: str) -> bool:
    """`""` or `":" digits`."""
    return rest == "" or (rest.startswith(":") and rest[1:].isdigit())


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _without_root(name: str) -> str:
    """`localhost.` names `localhost`: the root label is implied."""
    return name[:-1] if name.endswith(".") else name


class HostCheck:
    """ASGI middleware: 421 `misdirected-request` for a `Host` this server does not answer for."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a foreign `Host`, else run the app."""
        if scope["type"] == "http" and not host_is_allowed(_host_header(scope), self.allowed_hosts):
            error = SensoriumError(
                "this server answers only IP literals, localhost and the names given with --allowed-host",
                code=Code.MISDIRECTED_REQUEST,
            )
            await refusal_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _host_header(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == b"host":
            return bytes(value).decode("latin-1")
    return None


def answer_bytes(error: SensoriumError) -> bytes:
    """A whole HTTP/1.1 answer for `error` that closes the connection, written below h11's state machine."""
    response = refusal_response(error)
    status = HTTPStatus(response.status_code)
    head = [f"HTTP/1.1 {status.value} {status.phrase}".encode("ascii")]
    head += [name + b": " + value for name, value in response.raw_headers]
    head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + bytes(response.body)


class EdgeH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the connection cap of `edge` (see the file's rules)."""

    edge: ClassVar[HttpEdge] = HttpEdge()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Admit below the cap and start the header deadline; above it, answer 503 at once."""
        if len(self.connections) >= self.edge.max_connections:
            self._refuse_overloaded(transport)
            return
        super().connection_made(transport)
        self._set_deadline(self.edge.header_seconds, self._headers_late)

    def data_received(self, data: bytes) -> None:
        """Feed h11, then move the deadline if the headers or the body became complete."""
        if self._refused:
            return  # over the cap: drained until the lingering close
        cycle = self.cycle
        super().data_received(data)
        self._follow(cycle)

    def on_response_complete(self) -> None:
        """The next request's headers are due `header_seconds` from this response."""
        cycle = self.cycle
        if not self.transport.is_closing():
            self._set_deadline(self.edge.header_seconds, self._headers_late)
        super().on_response_complete()  # may parse a pipelined request at once
        self._follow(cycle)

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._clear_deadline()
        super().connection_lost(exc)

    def _follow(self, previous: object) -> None:
        """Headers just completed: the body is due, or nothing is; a body just completed: nothing is."""
        cycle = self.cycle
        if cycle is None or self.transport.is_closing():
            return
        if cycle is not previous:
            if cycle.more_body:
                self._set_deadline(self.edge.body_seconds, self._body_late)
            else:
                self._clear_deadline()
        elif not cycle.more_body and not cycle.response_complete:
            self._clear_deadline()

    def _headers_late(self) -> None:
        """408 if part of a request came, else a silent close."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:
            self.transport.write(answer_bytes(_timeout("the request headers")))
        self.transport.close()

    def _body_late(self) -> None:
        """408 unless the answer has started, then close; the app's next `receive` sees a disconnect."""
        self._deadline = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if not cycle.response_started:
            self.transport.write(answer_bytes(_timeout("the request body")))
        cycle.disconnected = True  # the app's later writes are dropped, as after a client's disconnect
        cycle.message_event.set()
        self.transport.close()

    def _refuse_overloaded(self, transport: asyncio.Transport) -> None:
        """503 `overloaded` with `Retry-After`, half-close, drain, close after the linger."""
        self.transport = transport
        self._refused = True
        error = SensoriumError(
            "too many open connections; retry later",
            code=Code.OVERLOADED,
            retry_after_seconds=self.edge.overloaded_retry_after_seconds,
        )
        transport.write(answer_bytes(error))
        if transport.can_write_eof():
            transport.write_eof()
        self._deadline = self.loop.call_later(self.edge.linger_seconds, transport.close)

    def _set_deadline(self, seconds: float, callback: Any) -> None:
        self._clear_deadline()
        self._deadline = self.loop.call_later(seconds, callback)

    def _clear_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def _timeout(what: str) -> SensoriumError:
    return SensoriumError(f"{what} did not arrive in time", code=Code.REQUEST_TIMEOUT)


def watch_connections(state: ServerState, metrics: CollectorRegistry) -> None:
    """Register `sensorium_http_connections_open` over the connections of `state` (those the cap counts)."""
    gauge = Gauge(
        "sensorium_http_connections_open",
        "Admitted HTTP connections not yet closed: the count the connection cap compares with",
        registry=metrics,
    )
    gauge.set_function(lambda: float(len(state.connections)))


def edge_protocol(edge: HttpEdge) -> type[EdgeH11Protocol]:
    """The protocol class uvicorn instantiates per connection, bound to `edge`."""

    class BoundEdgeH11Protocol(EdgeH11Protocol):
        pass

    BoundEdgeH11Protocol.edge = edge
    return BoundEdgeH11Protocol
