"""A violation names where a document broke which rule: a JSON Pointer and a rule name, never a value."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Rule name of every structural failure (type, bound, required, closed object) without a rule of its own.
SCHEMA_RULE = "schema"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule at one place of a document (RFC 6901 pointer; "" is the document itself)."""

    path: str
    rule: str
    # The JSON Schema keyword that failed (`required`, `enum`, `additionalProperties`, `maximum`, ...);
    # empty for a semantic rule checked in code. Equality ignores it: a rule at a place is one finding.
    keyword: str = field(default="", compare=False)

    def __str__(self) -> str:
        where = self.path or "/"
        if self.rule == SCHEMA_RULE:
            return f"{where}: {self.keyword or self.rule}"
        return f"{where}: {self.rule} ({self.keyword})" if self.keyword else f"{where}: {self.rule}"

    def under(self, prefix: str) -> Violation:
        """The same violation seen from an enclosing document."""
        return Violation(prefix + self.path, self.rule, self.keyword)


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON Pointer from object keys and array indices."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def ordered(violations: Iterable[Violation]) -> list[Violation]:
    """Distinct violations in document order (array indices compare as numbers); one per rule and place,
    naming every keyword that failed there."""
    keywords: dict[tuple[str, str], set[str]] = {}
    for v in violations:
        keywords.setdefault((v.path, v.rule), set()).update(k for k in v.keyword.split(", ") if k)
    found = [Violation(path, rule, ", ".join(sorted(names))) for (path, rule), names in keywords.items()]
    return sorted(found, key=_sort_key)


def merge(structural: Iterable[Violation], semantic: Iterable[Violation]) -> list[Violation]:
    """Both layers' findings; a semantic finding supersedes a structural one of the same named rule."""
    semantic = list(semantic)
    named = {v.rule for v in semantic}
    kept = [v for v in structural if v.rule == SCHEMA_RULE or v.rule not in named]
    return ordered([*kept, *semantic])


def _sort_key(violation: Violation) -> tuple[tuple[tuple[int, int, str], ...], str, str]:
    steps = violation.path.split("/")[1:]
    at = tuple((0, int(s), "") if s.isdigit() else (1, 0, s) for s in steps)
    return at, violation.rule, violation.keyword
