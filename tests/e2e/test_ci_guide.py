"""docs/CI.md works from the wheel alone (CONTRACT §0, §13.1): every code block, run as written.

The wheel is built from the tracked tree and installed by the guide's own `python -m pip install
sensorium-os-connector` into a fresh venv outside the repository (pip finds the wheel through
`PIP_FIND_LINKS`; the locked dependencies are already there, see `tests/support/wheel.py`). Then, in
document order: bash blocks run in a shell, the YAML job runs step by step as a CI runner would (`run:`
scripts in bash with `-eo pipefail`, `$GITHUB_ENV` carried between steps, `if: always()` steps always),
JSON device bodies are posted to a simulated connector's routes, and Python blocks named by their first
line (`# conftest.py`) become the downstream suite that the last block runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs; types-PyYAML is not locked

from providers.simulated import parse_device
from tests.support.paths import REPO
from tests.support.wheel import build_wheel, fresh_venv, locked_dependencies

pytestmark = [pytest.mark.serve, pytest.mark.timeout(600)]
GUIDE = REPO / "docs" / "CI.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
_TRANSPORT_BY_KEY = {"address": "ble", "device": "usb-serial", "service_type": "mdns"}


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in document order."""
    return [(match[1], match[2]) for match in _BLOCK.finditer(text)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Runner:
    """A shell outside the repository whose PATH starts with the fresh venv, as a CI runner's would."""

    work: Path
    env: dict[str, str]
    logs: list[str] = field(default_factory=list)

    def bash(self, script: str, name: str, timeout: float = 300) -> int:
        """Run one script with `bash -eo pipefail` (GitHub's `run:` shell); its output is kept."""
        path = self.work / f"{name}.sh"
        path.write_text(script, encoding="utf-8")
        out = self.work / f"{name}.out"
        with out.open("wb") as sink:
            # Output to a file, not a pipe: a background `serve` keeps its inherited descriptors open.
            done = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)],
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        self.logs.append(f"--- {name} (exit {done.returncode})\n{out.read_text(errors='replace')}")
        return done.returncode

    def carry_github_env(self) -> None:
        """`KEY=VALUE` lines a step appended to `$GITHUB_ENV` reach the next steps."""
        for line in Path(self.env["GITHUB_ENV"]).read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                self.env[key] = value


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    root = tmp_path_factory.mktemp("ci-guide")
    wheel = build_wheel(root)
    bin_dir = fresh_venv(root, locked_dependencies(root))
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PIP_FIND_LINKS=str(wheel.parent),
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        GITHUB_ENV=str(work / "github.env"),
        SENSORIUM_LOG_FORMAT="text",
    )
    (work / "github.env").touch()
    yield Runner(work, env)


def _run_job(runner: Runner, job: dict[str, Any]) -> None:
    """The YAML job's steps in order; `if: always()` steps run even after a failure."""
    runner.env.update({k: str(v) for k, v in job.get("env", {}).items()})
    runner.env["SENSORIUM_PORT"] = str(_free_port())  # a runner of its own; the suite binds no fixed port
    failed = None
    try:
        for index, step in enumerate(job["steps"]):
            if "run" not in step:
                assert step["uses"].startswith("actions/setup-python"), step  # the fresh venv is that Python
                continue
            if failed is not None and step.get("if") != "always()":
                continue
            code = runner.bash(step["run"], f"step-{index}")
            runner.carry_github_env()
            if code != 0 and failed is None:
                failed = step.get("name", index)
    finally:
        _stop_leftover(runner)
    assert failed is None, f"job step {failed!r} failed:\n" + "\n".join(runner.logs)


def _stop_leftover(runner: Runner) -> None:
    """The job's own stop step ends `serve`; should it not have run, end the process it started."""
    pid_file = Path(runner.env.get("SENSORIUM_DIR", "/nonexistent")) / "serve.pid"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def _check_device_body(body: str) -> None:
    """A JSON block is one simulated device: accepted as it stands by its transport's route rules."""
    device = json.loads(body)
    transport = next(t for key, t in _TRANSPORT_BY_KEY.items() if key in device)
    parse_device(transport, device)  # type: ignore[arg-type]


def test_every_block_of_the_ci_guide_runs_from_the_wheel(runner: Runner) -> None:
    downstream = runner.work / "downstream"
    downstream.mkdir()
    ran = {"bash": 0, "yaml": 0, "json": 0, "python": 0}
    for index, (language, body) in enumerate(blocks(GUIDE.read_text(encoding="utf-8"))):
        ran[language] += 1
        if language == "bash":
            runner.work = downstream if ran["python"] else runner.work
            code = runner.bash(body, f"block-{index}", timeout=540)
            assert code == 0, "\n".join(runner.logs)
        elif language == "yaml":
            document = yaml.safe_load(body)
            [job] = document.values()
            _run_job(runner, job)
        elif language == "json":
            _check_device_body(body)
        elif language == "python":
            name = body.splitlines()[0].removeprefix("# ").strip()
            assert re.fullmatch(r"[a-z_]+\.py", name), f"a python block names its file first: {name!r}"
            (downstream / name).write_text(body, encoding="utf-8")
        else:
            raise AssertionError(f"a block of an unknown language: {language}")
    assert ran["bash"] >= 2 and ran["yaml"] == 1 and ran["json"] == 3 and ran["python"] >= 3
    summary = runner.logs[-1]
    assert re.search(r"\b[4-9] passed\b", summary) and "failed" not in summary, summary
    assert "using the packaged example catalog" in "\n".join(runner.logs)


def test_serve_without_a_catalog_still_exits_2_outside_a_checkout(runner: Runner) -> None:
    code = runner.bash("sensorium-connector serve --port 0 --data-dir data\n", "no-catalog", timeout=60)
    assert code == 2 and "catalog" in runner.logs[-1]
