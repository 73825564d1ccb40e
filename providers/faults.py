"""A fault-injecting provider FOR TESTS ONLY: plays a given timeline and misbehaves on request.

It can refuse to start, fail or restart mid-session, make `stop()` raise, hang, or acknowledge late, and
flood the sink with observations that skip the provider-side filter (to prove the host revalidates). Every
call is recorded so tests can assert that a refused admission never reached the provider.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio

from connector.contract.transports import Transport
from connector.core.observations import Observation
from connector.core.scope import DiscoveryScope
from connector.errors import ProviderError, ProviderRestarted
from connector.timer import WALL_TIMER, Timer, sleep_ms
from providers.base import BaseSession, ObservationSink, ProviderCapabilities, StopOutcome, finish_cleanup
from providers.replay import Timeline, check_speed, finish_task, play_timeline


@dataclass(frozen=True, slots=True)
class StopStep:
    """How one `stop()` call behaves: acknowledge, raise or hang, after `delay_ms`."""

    kind: Literal["ack", "raise", "hang"] = "ack"
    delay_ms: int = 0


ACK = StopStep("ack")
RAISE = StopStep("raise")
HANG = StopStep("hang")


@dataclass(frozen=True, slots=True)
class Fault:
    """What goes wrong in a session (all optional; the default plays the timeline and stops cleanly)."""

    start_error: ProviderError | None = None
    start_delay_ms: int = 0
    # At this offset the session reports `fail_error` (default: a provider restart) and plays no more.
    fail_at_ms: int | None = None
    fail_error: ProviderError | None = None
    # One step per stop() call; the last step repeats for later calls.
    stop_plan: tuple[StopStep, ...] = (ACK,)
    # `flood_count` observations from `flood` delivered straight to the sink at `flood_at_ms`, unfiltered.
    flood: Callable[[int], Observation] | None = None
    flood_count: int = 0
    flood_at_ms: int = 0


class FaultSession(BaseSession):
    """One session of the fault provider (on the shared base: gate, scope filter, cleanup bound)."""

    # Each stop() call plays the next step of the plan; a hanging step is dropped, not joined.
    rejoin_stalled_attempt = False

    def __init__(self, provider: FaultProvider, scope: DiscoveryScope, sink: ObservationSink) -> None:
        super().__init__(scope, sink, provider.timer)
        self._provider = provider
        self._stop_calls = 0
        self.acknowledged = False
        self.opened()
        self._task = asyncio.get_running_loop().create_task(provider.run(self, sink))

    async def stop(self) -> StopOutcome:
        """Record the call, then the base's bounded, idempotent stop."""
        self._provider.calls.append("stop")
        return await super().stop()

    async def _stop_backend(self) -> str | None:
        """Behave as the next step of the stop plan says."""
        plan = self._provider.fault.stop_plan
        step = plan[min(self._stop_calls, len(plan) - 1)]
        self._stop_calls += 1
        if step.delay_ms:
            await sleep_ms(self._timer, step.delay_ms)
        if step.kind == "hang":
            await anyio.sleep_forever()
        if step.kind == "raise":
            return "provider-stop-refused"
        await finish_task(self._task)
        self.acknowledged = True
        self._provider.calls.append("stop-ack")
        return None

    async def unplug(self) -> None:
        """The adapter goes away: the simulated backend ends, and a stop attempt still hanging on it."""
        if self._attempt is not None and not self._attempt.done:
            self._attempt.cancel()
            await finish_cleanup(self._attempt.finished())
        await finish_task(self._task)


class FaultProvider:
    """Plays `(t_ms, observation)` pairs through the provider-side filter and injects the given fault."""

    def __init__(
        self,
        timeline: Sequence[tuple[int, Observation]] = (),
        *,
        transport: Transport = "ble",
        concurrent_sessions: bool = False,
        fault: Fault | None = None,
        speed: float = 1.0,
        timer: Timer = WALL_TIMER,
    ) -> None:
        self.timer = timer
        self._timeline: Timeline = tuple(sorted(timeline, key=lambda item: item[0]))
        self._capabilities = ProviderCapabilities(
            transport=transport, concurrent_sessions=concurrent_sessions
        )
        self.fault = fault or Fault()
        self._speed = check_speed(speed)
        self.calls: list[str] = []
        self.sessions: list[FaultSession] = []

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities."""
        return self._capabilities

    @property
    def start_calls(self) -> int:
        """How many times start() was called."""
        return self.calls.count("start")

    @property
    def stop_calls(self) -> int:
        """How many times stop() was called on any session."""
        return self.calls.count("stop")

    @property
    def acknowledged_stops(self) -> int:
        """How many stop() calls acknowledged."""
        return self.calls.count("stop-ack")

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> FaultSession:
        """Start a session, or fail as the fault says."""
        self.calls.append("start")
        if self.fault.start_delay_ms:
            await sleep_ms(self.timer, self.fault.start_delay_ms)
        if self.fault.start_error is not None:
            raise self.fault.start_error
        session = FaultSession(self, scope, sink)
        self.sessions.append(session)
        return session

    async def unplug(self) -> None:
        """End what refused or hung stops left running in every session (a test's teardown)."""
        for session in self.sessions:
            await session.unplug()

    async def run(self, session: FaultSession, sink: ObservationSink) -> None:
        """Play the timeline, the flood and the mid-session failure, in time order."""
        timeline = list(self._timeline)
        cut = self.fault.fail_at_ms
        if cut is not None:
            timeline = [(t_ms, obs) for t_ms, obs in timeline if t_ms < cut]
        async with anyio.create_task_group() as players:
            players.start_soon(play_timeline, tuple(timeline), self._speed, session.deliver, self.timer)
            players.start_soon(self._flood, sink)
            if cut is not None:
                players.start_soon(self._fail_later, cut, session)

    async def _flood(self, sink: ObservationSink) -> None:
        """Deliver the flood straight to the sink, skipping the provider-side filter."""
        make = self.fault.flood
        if make is None or not self.fault.flood_count:
            return
        await sleep_ms(self.timer, int(self.fault.flood_at_ms / self._speed))
        for index in range(self.fault.flood_count):
            sink.observe(make(index))
            if index % 256 == 255:
                await anyio.lowlevel.checkpoint()

    async def _fail_later(self, at_ms: int, session: FaultSession) -> None:
        """Report the mid-session failure at its offset."""
        await sleep_ms(self.timer, int(at_ms / self._speed))
        session.fail(self.fault.fail_error or ProviderRestarted("provider restarted during the session"))
