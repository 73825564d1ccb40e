"""Building the wheel from the tracked tree, and fresh venvs that see only the wheel (CONTRACT §0)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.support.paths import REPO

_NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".sensorium", ".*_cache")
# What of this checkout's editable install must stay invisible to a fresh venv.
_OWN = ("sensorium_os_connector", "__editable__", "_sensorium_os_connector")
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def tracked_tree(target: Path) -> None:
    """Copy what git tracks (plus new, not ignored files) - the tree a clean clone would build."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # no git here (an unpacked source tree)
        shutil.copytree(REPO, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
        return
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def build_wheel(root: Path) -> Path:
    """The wheel of the tracked tree, built under `root`."""
    source, dist = root / "src", root / "dist"
    source.mkdir()
    dist.mkdir()
    tracked_tree(source)
    build = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)]
    subprocess.run(build, check=True, timeout=180, capture_output=True)
    return next(dist.glob("sensorium_os_connector-*.whl"))


def locked_dependencies(root: Path) -> Path:
    """A directory of links to the test venv's installed distributions, this package's own left out.

    A fresh venv that reads it through a `.pth` line has every locked dependency already satisfied (pip
    installs none of them, so nothing reaches an index) and no trace of this checkout: `pip install
    sensorium-os-connector` then has to install the wheel.
    """
    farm = root / "locked-deps"
    farm.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if entry.name.startswith(_OWN) or entry.suffix == ".pth":
            continue
        (farm / entry.name).symlink_to(entry)
    return farm


def fresh_venv(root: Path, dependencies: Path) -> Path:
    """A venv without pip of its own that sees `dependencies` (pip among them); its `bin`."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "locked-deps.pth").write_text(f"{dependencies}\n", encoding="utf-8")
    return venv / "bin"
