"""The repository's imports point inward: no outward import and no cycle of rooms (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "arch_metrics.py"


@pytest.fixture(scope="module")
def arch() -> ModuleType:
    spec = importlib.util.spec_from_file_location("arch_metrics_repo", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["arch_metrics_repo"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def edges(arch: ModuleType) -> list[Any]:
    found: list[Any] = [e for m in arch.load_modules(ROOT) for e in arch.import_edges(m)]
    assert len(found) > 100  # the collector really read the code
    return found


def test_no_room_imports_an_outer_one(arch: ModuleType, edges: list[Any]) -> None:
    assert [f"{e.where} {e.source} -> {e.target}" for e in arch.outward(edges)] == []


def test_no_cycle_of_rooms(arch: ModuleType, edges: list[Any]) -> None:
    assert arch.room_cycles(edges) == []
