"""Where things are in the checkout the tests run from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HW_FIXTURES = REPO / "hw-fixtures"
SHIPPED_CATALOG = REPO / "catalog" / "actions.json"
SHIPPED_TRUST = REPO / "catalog" / "trust"
TEST_KEYS = REPO / "tests" / "keys"
