"""A real `sensorium-connector serve` process on 127.0.0.1 with an OS-chosen port, for end-to-end tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from tests.service.support import REPO_ROOT

_URL = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")


@dataclass
class Served:
    """A running serve process, its base URL and its log file."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    async def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send `sig` and wait for the exit code."""
        self.process.send_signal(sig)
        return await wait_exit(self.process, timeout)

    def log_text(self) -> str:
        """Everything the process logged so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")


def serve_command(*args: str | Path) -> list[str]:
    """The argv of `serve` on an OS-chosen loopback port."""
    return [sys.executable, "-m", "connector", "serve", "--host", "127.0.0.1", "--port", "0", *map(str, args)]


def spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process in the repository root with its stderr going to `log`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as sink:
        return subprocess.Popen(
            list(argv),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
        )


async def wait_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    """The exit code, waiting without blocking the event loop."""
    with anyio.fail_after(timeout):
        while process.poll() is None:
            await anyio.sleep(0.05)
    return process.returncode


@asynccontextmanager
async def serving(*args: str | Path, log: Path, timeout: float = 30.0) -> AsyncIterator[Served]:
    """Run `serve` until the block ends (then SIGTERM, and SIGKILL if it does not exit in time)."""
    process = spawn(serve_command(*args), log)
    try:
        with anyio.fail_after(timeout):
            while (match := _URL.search(log.read_text(encoding="utf-8", errors="replace"))) is None:
                if process.poll() is not None:
                    raise AssertionError(f"serve exited early with {process.returncode}")
                await anyio.sleep(0.05)
        yield Served(process, match.group(1), log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await wait_exit(process, 15.0)
            except TimeoutError:
                process.kill()
                process.wait()
