"""The vectors in `schemas/vectors/`: one document (or list of polls) per file, a sidecar per invalid one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

VECTOR_DIR = REPO / "schemas" / "vectors"
# Schemas owned by the catalog engineer: held to verdicts and rule names, not to identical paths.
CATALOG_SCHEMAS = frozenset({"sensorium-action-catalog.v1", "sensorium-catalog-signature.v1"})


@dataclass(frozen=True)
class Vector:
    """One vector file."""

    schema: str
    valid: bool
    path: Path

    @property
    def id(self) -> str:
        return f"{self.schema}/{'valid' if self.valid else 'invalid'}/{self.path.stem}"

    def document(self) -> Any:
        return json.loads(self.path.read_text(encoding="utf-8"))

    def expectation(self) -> dict[str, str]:
        return dict(
            json.loads(self.path.with_name(self.path.stem + ".expect.json").read_text(encoding="utf-8"))
        )


def all_vectors() -> list[Vector]:
    """Every vector file, sorted."""
    found = []
    for path in sorted(VECTOR_DIR.glob("*/*/*.json")):
        if path.name.endswith(".expect.json") or path.parent.name not in ("valid", "invalid"):
            continue
        found.append(Vector(path.parent.parent.name, path.parent.name == "valid", path))
    return found


VECTORS = all_vectors()
INVALID = [v for v in VECTORS if not v.valid]
