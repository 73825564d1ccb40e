"""The bench guide lists every shipped fixture with the provenance its header declares."""

from __future__ import annotations

import json
import re

from tests.support.paths import REPO

FIXTURES = REPO / "hw-fixtures"
ROW = re.compile(r"^\| `(?P<file>[^`]+\.jsonl)` \| (?P<transport>[a-z-]+) \| (?P<source>[a-z]+) \|", re.M)


def test_every_fixture_is_listed_with_its_transport_and_source() -> None:
    readme = (FIXTURES / "README.md").read_text()
    rows = {m["file"]: (m["transport"], m["source"]) for m in ROW.finditer(readme)}
    shipped = {}
    for path in sorted(FIXTURES.glob("*.jsonl")):
        header = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
        shipped[path.name] = (header["transport"], header["source"])
    assert shipped and rows == shipped
