"""Real processes for the Bus tests: `serve --nats` and `ops ...` command lines."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .support import TRUST_DIR, BusEnv

REPO = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"serving on (http://127\.0\.0\.1:\d+)")


def cli_env(token: str | None = None) -> dict[str, str]:
    """The test interpreter's environment with the repository importable (and a token, if given)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("SENSORIUM_TOKEN", None)
    if token is not None:
        env["SENSORIUM_TOKEN"] = token
    return env


def cli_argv(*args: str) -> list[str]:
    """`python -m connector ARGS`."""
    return [sys.executable, "-m", "connector", *args]


@dataclass(slots=True)
class Serve:
    """One `serve --nats` process."""

    process: subprocess.Popen[bytes]
    base_url: str
    stderr_path: Path

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM and the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise


def start_serve(env: BusEnv, nats_url: str, name: str, timeout: float = 30.0) -> Serve:
    """`serve --port 0 --nats URL` over the environment; returns once `/healthz` is 200 (Bus subscribed)."""
    argv = cli_argv("serve", "--data-dir", str(env.data_dir), "--port", "0", "--nats", nats_url)
    argv += ["--catalog", str(env.catalog), "--trust", str(TRUST_DIR)]
    for transport, fixture in env.fixtures.items():
        argv += ["--replay", f"{transport}={fixture}"]
    stderr_path = env.root / f"{name}.stderr.log"
    with stderr_path.open("wb") as err:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=cli_env())
    deadline = time.monotonic() + timeout
    base_url = ""
    while not base_url:
        found = _SERVING.search(stderr_path.read_text(errors="replace"))
        if found:
            base_url = found.group(1)
        elif process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("serve did not start")
        else:
            time.sleep(0.05)
    with httpx.Client(base_url=base_url, timeout=2.0) as http:
        while http.get("/healthz").status_code != 200:
            if time.monotonic() > deadline:
                raise AssertionError("serve did not become ready")
            time.sleep(0.05)
    return Serve(process, base_url, stderr_path)
