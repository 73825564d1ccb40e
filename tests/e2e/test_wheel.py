"""The wheel works outside a checkout (CONTRACT §0): built from the tracked tree, installed into a fresh venv.

The fresh venv sees the locked dependencies of the test venv through a `.pth` line (its site-packages as a
plain path: no `.pth` there runs, so the editable install of this checkout stays invisible) and gets the
wheel itself installed without dependencies. Every command then runs from an empty directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from connector.resources import version
from tests.support.paths import REPO
from tests.support.wheel import tracked_tree

pytestmark = pytest.mark.realtime  # every test runs the installed console script (or pip and git)

FIXTURE = REPO / "hw-fixtures" / "ble-heart-rate-lab.jsonl"


@dataclass(frozen=True)
class Installed:
    """A fresh venv holding the wheel, and an empty working directory."""

    wheel: Path
    bin: Path
    empty: Path

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`sensorium-connector ARGV` in the empty directory, with no checkout on any path."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(
            [str(self.bin / "sensorium-connector"), *argv],
            cwd=self.empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel and install it into a fresh venv."""
    root = tmp_path_factory.mktemp("wheel14")
    source, dist, venv, empty = root / "src", root / "dist", root / "venv", root / "empty"
    for folder in (source, dist, empty):
        folder.mkdir()
    tracked_tree(source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)]
    subprocess.run(build, check=True, timeout=180, capture_output=True)
    wheel = next(dist.glob("sensorium_os_connector-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh_site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (fresh_site / "locked-deps.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    # The fresh interpreter runs pip (found through the `.pth`), so the console script is its own.
    fresh_pip = [str(venv / "bin" / "python"), *pip[1:]]
    install = [*fresh_pip, "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, timeout=180, capture_output=True)
    return Installed(wheel, venv / "bin", empty)


def test_wheel_carries_package_data_and_no_private_key(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    schemas = [n for n in names if n.startswith("connector/_data/schemas/")]
    assert len(schemas) == len(list((REPO / "schemas").glob("*.json")))
    assert "connector/_data/catalog/actions.json" in names
    assert "connector/_data/catalog/actions.json.sig" in names
    assert any(n.startswith("connector/_data/catalog/trust/") and n.endswith(".pub") for n in names)
    assert any(n.startswith("connector/api/templates/") for n in names)
    assert not [n for n in names if n.endswith(".key")]


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    probe = "import connector, pathlib; print(pathlib.Path(connector.__file__).resolve())"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(installed.bin / "python"), "-c", probe],
        cwd=installed.empty,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert not Path(out).is_relative_to(REPO) and Path(out).is_relative_to(installed.bin.parent)


def test_version(installed: Installed) -> None:
    result = installed.run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"sensorium-connector {version()}"


def test_schema_validate_uses_the_packaged_schemas(installed: Installed) -> None:
    good = installed.empty / "good.json"
    good.write_text(json.dumps({"schema": "sensorium-error.v1", "code": "forbidden", "message": "no"}))
    assert installed.run("schema", "validate", "sensorium-error.v1", str(good)).returncode == 0
    bad = installed.empty / "bad.json"
    bad.write_text(json.dumps({"schema": "sensorium-error.v1", "code": "forbidden"}))
    result = installed.run("schema", "validate", "sensorium-error.v1", str(bad))
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["/message: required"]


def test_replay_scan_falls_back_to_the_packaged_catalog(installed: Installed) -> None:
    argv = ("scan", "--transport", "ble", "--window", "1", "--filter", "min_rssi_dbm=-127")
    result = installed.run(*argv, "--replay", str(FIXTURE), "--replay-speed", "20", "--json")
    assert result.returncode == 0, result.stderr
    assert "using the packaged example catalog" in result.stderr
    status = json.loads(result.stdout)
    assert status["schema"] == "deferred-operation-status.v2" and status["status"] == "completed"
    assert status["result"]["candidates"]


def test_a_named_catalog_never_gets_the_packaged_trust_key(installed: Installed) -> None:
    named = installed.empty / "mine.json"
    shutil.copy2(REPO / "catalog" / "actions.json", named)
    shutil.copy2(REPO / "catalog" / "actions.json.sig", installed.empty / "mine.json.sig")
    argv = ("scan", "--transport", "ble", "--window", "1", "--filter", "min_rssi_dbm=-127")
    result = installed.run(*argv, "--catalog", str(named), "--replay", str(FIXTURE))
    assert result.returncode == 2
    assert "packaged" not in result.stderr and "catalog-" in result.stderr


@pytest.mark.serve
def test_serve_without_a_catalog_exits_2(installed: Installed) -> None:
    result = installed.run("serve", "--port", "0", "--data-dir", str(installed.empty / "data"))
    assert result.returncode == 2
    assert "catalog-missing" in result.stderr
