"""The pure layer (core, contract, errors) loads no I/O library, checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.realtime  # each check runs a fresh interpreter

FORBIDDEN = (
    "anyio",
    "asyncio",
    "bleak",
    "serial",
    "zeroconf",
    "aiosqlite",
    "sqlite3",
    "fastapi",
    "starlette",
    "nats",
    "uvicorn",
    "httpx",
)
PURE_PACKAGES = ("connector.core", "connector.contract")

# Runs in the child: imports every pure module one by one and reports what each newly loaded.
PROBE = """
import importlib, json, pkgutil, sys

forbidden, packages, roots = json.loads(sys.argv[1])
sys.path[:0] = roots

def loaded():
    return {m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden)}

def discover():
    names = ["connector.errors"]
    for package in packages:
        names.append(package)
        module = importlib.import_module(package)
        found = pkgutil.walk_packages(module.__path__, package + ".", onerror=lambda name: None)
        names += [info.name for info in found]
    return names

before = loaded()
report = {}
failed = {}
for name in discover():
    start = loaded()
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = type(error).__name__
    report[name] = sorted(loaded() - start)
print(json.dumps({"before": sorted(before), "modules": report, "failed": failed}))
"""


def _probe(repo_root: Path, packages: tuple[str, ...] = PURE_PACKAGES, *extra: Path) -> dict[str, object]:
    # -I: no user site, no PYTHON* variables, no cwd on sys.path; the probe adds its roots itself.
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            PROBE,
            json.dumps([FORBIDDEN, packages, [str(repo_root), *map(str, extra)]]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo_root,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_pure_layer_loads_no_io_library(repo_root: Path) -> None:
    result = _probe(repo_root)
    modules = result["modules"]
    assert isinstance(modules, dict)
    assert result["before"] == []
    # The probe must really have covered the pure layer, not an empty package.
    for expected in (
        "lifecycle",
        "policy",
        "ids",
        "admission",
        "observations",
        "transports",
        "scope",
        "scope.model",
        "scope.parse",
        "scope.match",
        "scope.redact",
    ):
        assert f"connector.core.{expected}" in modules
    assert "connector.contract.transports" in modules
    assert "connector.contract.canonical" in modules
    assert "connector.errors" in modules
    assert result["failed"] == {}, f"pure modules that failed to import: {result['failed']}"
    offenders = {name: pulled for name, pulled in modules.items() if pulled}
    assert offenders == {}, f"pure modules that loaded I/O libraries: {offenders}"


def test_probe_catches_a_leaky_module(repo_root: Path, tmp_path: Path) -> None:
    package = tmp_path / "leakypkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "clean.py").write_text("import json\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "leaky.py").write_text("import sqlite3\n")
    (package / "broken.py").write_text("raise RuntimeError('boom')\n")
    result = _probe(repo_root, ("leakypkg",), tmp_path)
    modules = result["modules"]
    assert isinstance(modules, dict)
    assert modules["leakypkg.clean"] == []
    assert "sqlite3" in modules["leakypkg.inner.leaky"]
    assert result["failed"] == {"leakypkg.broken": "RuntimeError"}
