"""Benchmark: how long an mDNS session's `stop()` takes with a resolution pending, on loopback.

Baseline, measured in the same run: closing a bare python-zeroconf engine on the same interface (what
any stop must at least do) until its sockets are closed. Contender: `MdnsSession.stop()` while one
instance's resolution (timeout 10 minutes) is in flight; it returns once every task and socket is gone.
Rounds interleave. The tests check only that the stop is bounded (tests/providers/test_mdns_provider.py).

    .venv/bin/python bench/mdns_stop.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test peers: tests.providers.*

from zeroconf import IPVersion  # noqa: E402
from zeroconf.asyncio import AsyncZeroconf  # noqa: E402

from connector.core.scope import DiscoveryScope, ScopeFilter  # noqa: E402
from providers.mdns import MdnsProvider, MdnsSession, engine_sockets  # noqa: E402
from tests.providers.mdns_peer import LOOPBACK, RecordingSink, Responder, ptr, run_instance, run_service_type  # noqa: E402

TYPE = run_service_type("stb")


async def bare_close() -> float:
    """Seconds to close a started engine until its sockets are closed."""
    azc = AsyncZeroconf(interfaces=[LOOPBACK], ip_version=IPVersion.V4Only)
    await azc.zeroconf.async_wait_for_start()
    sockets = engine_sockets(azc)
    started = time.perf_counter()
    await azc.async_close()
    while any(s.fileno() != -1 for s in sockets):
        await asyncio.sleep(0.001)
    return time.perf_counter() - started


async def session_stop(responder: Responder, round_no: int) -> float:
    """Seconds for `stop()` of a session with one resolution pending."""
    scope = DiscoveryScope("mdns", 10, 64, 65536, ScopeFilter(service_types=(TYPE,)))
    provider = MdnsProvider(interfaces=[LOOPBACK], resolve_timeout_ms=600_000)
    session = await provider.start(scope, RecordingSink())
    assert isinstance(session, MdnsSession)
    responder.announce([ptr(TYPE, f"{run_instance(f'pending{round_no}')}.{TYPE}")])
    async with asyncio.timeout(10):
        while session.tracked_count == 0:
            await asyncio.sleep(0.005)
    started = time.perf_counter()
    await session.stop()
    return time.perf_counter() - started


async def main(rounds: int) -> None:
    base: list[float] = []
    ours: list[float] = []
    async with Responder() as responder:
        for round_no in range(rounds):
            if round_no % 2 == 0:
                base.append(await bare_close())
                ours.append(await session_stop(responder, round_no))
            else:
                ours.append(await session_stop(responder, round_no))
                base.append(await bare_close())
    b, o = statistics.median(base), statistics.median(ours)
    print("command:", shlex.join([".venv/bin/python", *sys.argv]))
    print(f"median of {rounds} interleaved rounds:")
    print(f"  bare engine close            {b * 1000:7.1f} ms")
    print(f"  session stop, 1 pending      {o * 1000:7.1f} ms   max {max(ours) * 1000:.1f} ms")
    print(f"  ratio stop / bare close = {o / b:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    asyncio.run(main(parser.parse_args().rounds))
