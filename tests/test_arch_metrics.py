"""scripts/arch_metrics.py on a tiny synthetic tree: the figures it reports are the ones planted."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "arch_metrics.py"


@pytest.fixture(scope="module")
def arch() -> ModuleType:
    spec = importlib.util.spec_from_file_location("arch_metrics", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["arch_metrics"] = module
    spec.loader.exec_module(module)
    return module


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    _write(tmp_path, "connector/__init__.py", "")
    _write(tmp_path, "connector/core/__init__.py", "")
    _write(
        tmp_path,
        "connector/core/rules.py",
        "from connector.api.app import App\n"  # outward: core -> api
        "from ..contract import types\n"  # inward, relative
        "\n"
        "def five(kind):\n"
        "    if kind == 'command':\n"
        "        return 1\n"
        "    x = 2\n"
        "    return x\n",
    )
    _write(tmp_path, "connector/contract/types.py", "X = 1\n")
    _write(
        tmp_path,
        "connector/api/app.py",
        "from connector.core import rules\n"
        "\n"
        "class App:\n"
        "    limit = 3\n"
        "\n"
        "    def __init__(self):\n"
        "        self.a = 1\n"
        "        self.b = 2\n"
        "\n"
        "    def route(self, transport):\n"
        "        match transport:\n"
        "            case 'ble' | 'mdns':\n"
        "                return 1\n"
        "        return 'usb-serial' in (transport,)\n",
    )
    _write(tmp_path, "providers/fake.py", "def one(): return 'ble'\n")
    return tmp_path


def test_function_lengths_per_package(arch: ModuleType, tree: Path) -> None:
    metrics = arch.collect(tree)
    assert metrics.function_lengths["connector/core/"] == [5]
    assert sorted(metrics.function_lengths["connector/api/"]) == [3, 5]
    assert metrics.function_lengths["providers/"] == [1]


def test_outward_import_and_cycle_found(arch: ModuleType, tree: Path) -> None:
    metrics = arch.collect(tree)
    bad = arch.outward(metrics.edges)
    assert [(e.source, e.target, e.where) for e in bad] == [("core", "api", "connector/core/rules.py:1")]
    assert arch.room_cycles(metrics.edges) == [["api", "core"]]


def test_the_composition_root_is_outermost(arch: ModuleType, tree: Path) -> None:
    _write(tree, "connector/assembly.py", "from connector.api.app import App\n")
    _write(tree, "connector/api/wiring.py", "from connector.assembly import assemble\n")
    bad = arch.outward(arch.collect(tree).edges)
    assert ("assembly", "api") not in {(e.source, e.target) for e in bad}
    assert ("api", "assembly", "connector/api/wiring.py:1") in {(e.source, e.target, e.where) for e in bad}


def test_classes_counted(arch: ModuleType, tree: Path) -> None:
    (figure,) = arch.collect(tree).classes
    assert (figure.where, figure.lines, figure.methods, figure.attributes) == (
        "connector/api/app.py:App",
        12,
        2,
        3,
    )


def test_switches_counted_but_not_plain_returns(arch: ModuleType, tree: Path) -> None:
    found = sorted(arch.collect(tree).switches)
    assert found == [
        ("connector/api/app.py:12", "ble/mdns"),
        ("connector/api/app.py:14", "usb-serial"),
        ("connector/core/rules.py:5", "command"),
    ]


def test_report_renders(arch: ModuleType, tree: Path) -> None:
    report = arch.render(arch.collect(tree), "skipped")
    assert "Outward imports: **1**" in report
    assert "Switch sites: **3** in 2 files" in report
    assert "| connector/core/ | 1 | 5 | 5 | 5 |" in report


def test_duplicates_unavailable_without_command(
    arch: ModuleType, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arch.shutil, "which", lambda _name: None)
    assert arch.duplicates_pairs(tree).startswith("unavailable")


@pytest.mark.realtime  # runs the duplicates tool
@pytest.mark.skipif(shutil.which("duplicates") is None, reason="the duplicates command is not on PATH")
def test_duplicates_counted_on_a_copy(arch: ModuleType, tree: Path) -> None:
    body = "".join(f"    v{i} = {i} * x\n" for i in range(8))
    for name in ("a", "b"):
        _write(tree, f"providers/{name}.py", f"def {name}(x):\n{body}    return x\n")
    assert arch.duplicates_pairs(tree).startswith("1 pairs")
