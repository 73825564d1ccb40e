"""Benchmark of the mDNS provider against a real responder (a script, not a test; needs root).

Lab: avahi-daemon publishing one service in a responder namespace, joined by veth to a browser namespace
where the connector runs on its default interface (tests/providers/avahi_lab.py).

1. Time from session start to the first candidate of the published service, against `avahi-browse -r -p`
   (what a user would run instead) in the same browser namespace, talking to an avahi-daemon of its own
   there. Both start cold: the browser-side daemon is restarted before every `avahi-browse` round (it would
   otherwise answer from what it overheard), and every connector session has an engine of its own. Rounds
   interleave, 2.5 s apart (a responder multicasts a record at most once a second). Target: <= 1.2x.
2. mDNS query packets the connector sends in one 30 s session, against python-zeroconf's own
   `AsyncServiceBrowser` startup schedule alone on the same interfaces for 30 s (AF_PACKET count of
   outgoing queries on the link). Target: no more.

    sudo .venv/bin/python bench/mdns_bench.py [--rounds 7] [--packet-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test peers: tests.providers.*

from tests.providers.avahi_lab import AvahiLab, unavailable_reason  # noqa: E402
from tests.providers.test_mdns_avahi import Driver, labels  # noqa: E402

AVAHI_TYPE = "_s11bench._tcp"
TYPE = "_s11bench._tcp.local."
INSTANCE = "Bench Printer"


async def avahi_browse_once(lab: AvahiLab, bus_address: str) -> float:
    """Seconds from spawning `avahi-browse -r -p` to its first resolved (`=`) line for the service."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *lab.netns_exec(lab.browser_ns),
        "avahi-browse",
        "-r",
        "-p",
        AVAHI_TYPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus_address},
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(15):
            while line := await process.stdout.readline():
                fields = line.decode(errors="replace").split(";")
                if fields[0] == "=" and "Bench" in fields[3]:
                    return time.monotonic() - started
        raise RuntimeError("avahi-browse ended without resolving the service")
    finally:
        process.kill()
        await process.wait()


async def connector_once(driver: Driver) -> float:
    """Seconds from the session's start to the first status showing the candidate."""
    scan_id = await driver.scan(window_s=3, types=(TYPE,))
    shown = await driver.wait(
        lambda line: line.get("id") == scan_id and INSTANCE in labels(line["status"]), 15
    )
    await driver.final(scan_id, 15)
    return float(shown["t"])


async def first_candidate(lab: AvahiLab, rounds: int) -> dict[str, Any]:
    driver = await Driver.start(lab)
    browse_daemon = None
    browse_s: list[float] = []
    connector_s: list[float] = []
    try:
        for _ in range(rounds):
            if browse_daemon is not None:
                lab.kill_responder(browse_daemon)
            bus = lab.start_responder(lab.browser_ns, lab.browser_link, ipv4=True, ipv6=True)
            browse_daemon = len(lab._responders) - 1
            await asyncio.sleep(2.5)
            browse_s.append(await avahi_browse_once(lab, bus))
            await asyncio.sleep(2.5)
            connector_s.append(await connector_once(driver))
    finally:
        await driver.close()
    return {"avahi_browse_s": browse_s, "connector_s": connector_s}


async def packets(lab: AvahiLab, seconds: int) -> dict[str, int]:
    driver = await Driver.start(lab)
    try:
        await driver.send({"cmd": "sniff", "ifname": lab.browser_link})
        await driver.wait(lambda line: line.get("sniffing") is True, 5)
        await asyncio.sleep(2.5)
        scan_id = await driver.scan(window_s=seconds, types=(TYPE,))
        await driver.final(scan_id, seconds + 20)
        await driver.send({"cmd": "questions"})
        connector = (await driver.wait(lambda line: "query_packets" in line, 5))["query_packets"]
        await asyncio.sleep(2.5)
        await driver.send({"cmd": "bare_browse", "types": [TYPE], "seconds": seconds})
        await driver.wait(lambda line: line.get("bare_done") is True, seconds + 20)
        await driver.send({"cmd": "questions"})
        total = (await driver.wait(lambda line: line.get("query_packets", 0) > connector, 5))["query_packets"]
    finally:
        await driver.close()
    return {"connector_packets": connector, "zeroconf_browser_packets": total - connector}


async def main(args: argparse.Namespace) -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"mdns_bench: {reason}")
    with tempfile.TemporaryDirectory(prefix="s11-bench-") as workdir:
        lab = AvahiLab(Path(workdir), "veth").start()
        try:
            lab.publish(INSTANCE, AVAHI_TYPE, 631)
            await asyncio.sleep(
                10
            )  # past avahi's announcements: what a browser hears from now on, it asked for
            timing = await first_candidate(lab, args.rounds)
            counts = await packets(lab, args.packet_seconds)
        finally:
            lab.close()
    browse, ours = statistics.median(timing["avahi_browse_s"]), statistics.median(timing["connector_s"])
    print("command:", shlex.join([".venv/bin/python", *sys.argv]))
    print(f"first candidate, median of {args.rounds} interleaved rounds:")
    print(f"  avahi-browse -r -p  {browse * 1000:7.1f} ms   rounds: {_ms(timing['avahi_browse_s'])}")
    print(f"  connector session   {ours * 1000:7.1f} ms   rounds: {_ms(timing['connector_s'])}")
    print(f"  ratio connector / avahi-browse = {ours / browse:.2f} (target <= 1.2)")
    print(f"query packets in {args.packet_seconds} s:")
    print(f"  connector session                  {counts['connector_packets']}")
    print(f"  python-zeroconf AsyncServiceBrowser {counts['zeroconf_browser_packets']}")
    ok = counts["connector_packets"] <= counts["zeroconf_browser_packets"]
    print(f"  connector <= browser schedule: {ok}")


def _ms(values: list[float]) -> str:
    return " ".join(f"{v * 1000:.0f}" for v in values)


if __name__ == "__main__":
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--packet-seconds", type=int, default=30)
    asyncio.run(main(parser.parse_args()))
