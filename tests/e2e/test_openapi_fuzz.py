"""Schemathesis (4.x CLI, `--checks all`) on `/openapi.json` of a real `serve`: no 5xx, no answer the document
lacks (status, headers, body), every refusal a sensorium-error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.api.support import HEART_RATE_LAB, add_test_principals
from tests.support.serving import serving_async

HOOKS = Path(__file__).with_name("st_hooks.py")
SCHEMATHESIS = Path(sys.executable).with_name("st")


def _run_schemathesis(url: str, token: str, cwd: Path, *only: str) -> subprocess.CompletedProcess[str]:
    argv = [
        str(SCHEMATHESIS),
        "run",
        f"{url}/openapi.json",
        *only,
        "--max-examples",
        "30",
        "--phases",
        "coverage,fuzzing",
        # `all` includes `positive_data_acceptance`: every body generated as valid must be taken (no 422 for
        # its numbers); no hook filters or rewrites a body (`st_hooks.py`).
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {token}",
        # One worker: two race inside hypothesis while building coverage cases ("AST constructor
        # recursion depth mismatch", a schemathesis/hypothesis error, not an answer of ours).
        "--workers",
        "1",
        "--seed",
        "20261130",
        "--request-timeout",
        "40",
        "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=100, check=False)


@pytest.mark.serve
@pytest.mark.timeout(240)
@pytest.mark.asyncio
async def test_schemathesis_finds_no_server_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = add_test_principals(data)
    replay = ("--replay", f"ble={HEART_RATE_LAB}", "--replay-speed", "10")
    async with serving_async("--data-dir", data, *replay, log=tmp_path / "serve.log") as served:
        caller = await anyio.to_thread.run_sync(_run_schemathesis, served.base_url, tokens["alice"], tmp_path)
        admin = ("--include-path-regex", "^/v1/admin/")
        operator = await anyio.to_thread.run_sync(
            _run_schemathesis, served.base_url, tokens["root"], tmp_path, *admin
        )
    for result in (caller, operator):
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
