"""A violation names where a document broke which rule: a JSON Pointer and a rule name, never a value."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Rule name of every structural failure (type, bound, required, closed object) without a rule of its own.
SCHEMA_RULE = "schema"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule at one place of a document (RFC 6901 pointer; "" is the document itself)."""

    path: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path or '/'}: {self.rule}"

    def under(self, prefix: str) -> Violation:
        """The same violation seen from an enclosing document."""
        return Violation(prefix + self.path, self.rule)


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON Pointer from object keys and array indices."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def ordered(violations: Iterable[Violation]) -> list[Violation]:
    """Distinct violations in document order (array indices compare as numbers)."""
    return sorted(set(violations), key=_sort_key)


def merge(structural: Iterable[Violation], semantic: Iterable[Violation]) -> list[Violation]:
    """Both layers' findings; a semantic finding supersedes a structural one of the same named rule."""
    semantic = list(semantic)
    named = {v.rule for v in semantic}
    kept = [v for v in structural if v.rule == SCHEMA_RULE or v.rule not in named]
    return ordered([*kept, *semantic])


def _sort_key(violation: Violation) -> tuple[tuple[tuple[int, int, str], ...], str]:
    steps = violation.path.split("/")[1:]
    return tuple((0, int(s), "") if s.isdigit() else (1, 0, s) for s in steps), violation.rule
