"""The connector's Prometheus metrics and the telemetry sink that feeds them (and the lifecycle log).

Rules of this file:
- labels are fixed vocabularies: transport, status, reason or error code, cleanup outcome, HTTP method,
  route TEMPLATE (never a concrete path: paths hold operation ids) and status code. No operation id, owner,
  adapter name chosen by a caller, or candidate data ever becomes a label or a value;
- gauges of live state (claims held, uncertain cleanups) are read from the runtime at scrape time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connector.contract.transports import TRANSPORTS
from connector.telemetry.events import LifecycleEvent, safe_word
from connector.telemetry.logs import log_event

_log = logging.getLogger("sensorium.telemetry")
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SessionState(Protocol):
    """What the claims gauges read of one retained discovery session."""

    @property
    def transport(self) -> str: ...
    @property
    def claim_held(self) -> bool: ...
    @property
    def cleanup_uncertain(self) -> bool: ...


class _ClaimsCollector(Collector):
    """Claims held and uncertain cleanups per transport, counted from the runtime when scraped."""

    def __init__(self, sessions: Callable[[], Iterable[SessionState]]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        """Two gauge families with one sample per transport (zeros included)."""
        held = {transport: 0 for transport in TRANSPORTS}
        uncertain = dict(held)
        for session in self._sessions():
            if session.transport in held:
                held[session.transport] += int(session.claim_held)
                uncertain[session.transport] += int(session.cleanup_uncertain)
        claims = GaugeMetricFamily(
            "sensorium_claims_held",
            "Discovery sessions holding a (transport, adapter) claim: live sessions and uncertain cleanups",
            labels=["transport"],
        )
        cleanups = GaugeMetricFamily(
            "sensorium_cleanups_uncertain",
            "Ended sessions whose provider stop is not confirmed yet (claim held, retried in the background)",
            labels=["transport"],
        )
        for transport in TRANSPORTS:
            claims.add_metric([transport], held[transport])
            cleanups.add_metric([transport], uncertain[transport])
        yield claims
        yield cleanups

    def describe(self) -> Iterator[Metric]:
        """Nothing up front: the families are produced at scrape time."""
        return iter(())


class Telemetry:
    """Receives lifecycle events: writes one log line each and updates the counters and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.sessions = Counter(
            "sensorium_discovery_sessions",
            "Discovery sessions that ended, by transport, status and outcome (reason or error code)",
            ["transport", "status", "outcome"],
            registry=registry,
        )
        self.commands = Counter(
            "sensorium_command_operations",
            "Command operations that ended, by status and outcome (error code, or none)",
            ["status", "outcome"],
            registry=registry,
        )
        self.cancellation_latency = Histogram(
            "sensorium_cancellation_latency_seconds",
            "From a cancel request to its confirmed termination, by transport",
            ["transport"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cleanup_duration = Histogram(
            "sensorium_cleanup_duration_seconds",
            "How long a session's provider stop took, by transport and cleanup outcome",
            ["transport", "cleanup"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests = Histogram(
            "sensorium_http_request_duration_seconds",
            "HTTP request latency by method, route template and status code",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def watch_sessions(self, sessions: Callable[[], Iterable[SessionState]]) -> None:
        """Register the claims gauges over the runtime's retained sessions."""
        self.registry.register(_ClaimsCollector(sessions))

    def emit(self, event: LifecycleEvent) -> None:
        """Log the event and count it; a telemetry failure never reaches the operation."""
        try:
            log_event(event)
            self._count(event)
        except Exception as error:  # the type only: never let telemetry end a session
            _log.error("telemetry failed with %s", type(error).__name__)

    def _count(self, event: LifecycleEvent) -> None:
        if event.event == "cleanup-confirmed" and event.cleanup_ms is not None:
            late = self.cleanup_duration.labels(_label(event.transport), "confirmed-late")
            late.observe(event.cleanup_ms / 1000.0)
        if event.event != "ended":
            return
        outcome = safe_word(event.code) or "none"
        status = safe_word(event.status) or "unknown"
        if event.kind == "command":
            self.commands.labels(status, outcome).inc()
            return
        transport = _label(event.transport)
        self.sessions.labels(transport, status, outcome).inc()
        if event.cleanup_ms is not None:
            cleanup = safe_word(event.cleanup) or "unknown"
            self.cleanup_duration.labels(transport, cleanup).observe(event.cleanup_ms / 1000.0)
        if event.cancel_latency_ms is not None:
            self.cancellation_latency.labels(transport).observe(event.cancel_latency_ms / 1000.0)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The current value of one sample (tests)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


def _label(transport: str | None) -> str:
    return transport if transport in TRANSPORTS else "none"


class RequestTimer:
    """ASGI middleware: observes every HTTP request's latency under its route template."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Time the request; the route label is the matched template, else `unmatched`."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.telemetry.requests.labels(
                _method(scope), _route_template(scope), str(status[0])
            ).observe(time.perf_counter() - started)


_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _method(scope: Scope) -> str:
    method = str(scope.get("method", ""))
    return method if method in _METHODS else "OTHER"


def _route_template(scope: Scope) -> str:
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path.startswith("/") else "unmatched"
