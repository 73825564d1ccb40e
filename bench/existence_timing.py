"""Existence timing (issue D10): another principal's operation and a never-seen id answer 404 as fast.

Paired, interleaved samples on the in-process app: prints the median paired difference against the median
latency (the ratio was about 20 % before the fix, when another principal's scan answered without the database
read a never-seen id needs). The structural proof - both make the same calls - is the test
`tests/api/test_existence_timing.py`; this is the measurement, which a loaded machine must not fail.

    .venv/bin/python -m bench.existence_timing [--pairs 400]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from connector.core.ids import OPERATION_KIND, random_operation_id
from tests.api.support import RecordingFactory, harness, straps
from tests.support.directives import scan_directive


async def measure(pairs: int) -> tuple[float, float]:
    """(median paired difference, median latency) in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        async with harness(Path(tmp), factory=RecordingFactory(straps(1), concurrent=True)) as h:
            theirs = (await h.invoke("alice", scan_directive(30))).headers["location"]
            never = "/v1/operations/" + random_operation_id(OPERATION_KIND, bytes(range(16)))
            headers = h.auth("bob")

            async def timed(path: str) -> float:
                started = time.perf_counter()
                response = await h.client.get(path, headers=headers)
                elapsed = time.perf_counter() - started
                assert response.status_code == 404
                return elapsed

            for _ in range(30):  # warm-up
                await timed(theirs)
                await timed(never)
            differences, latencies = [], []
            for index in range(pairs):
                first, second = (theirs, never) if index % 2 else (never, theirs)
                a, b = await timed(first), await timed(second)
                t_theirs, t_never = (a, b) if first == theirs else (b, a)
                differences.append(t_theirs - t_never)
                latencies += [t_theirs, t_never]
    return statistics.median(differences), statistics.median(latencies)


def main() -> None:
    """Print the figures and the ratio (goal: |difference| <= 10 % of the latency)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=400)
    args = parser.parse_args()
    difference, latency = asyncio.run(measure(args.pairs))
    print(f"median 404 latency {latency * 1e3:.3f} ms; median paired difference {difference * 1e6:+.1f} us")
    print(f"ratio |difference| / latency: {abs(difference) / latency:.3f} (goal <= 0.10)")


if __name__ == "__main__":
    main()
