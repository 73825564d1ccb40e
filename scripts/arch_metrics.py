"""Architecture figures of the source tree, printed as Markdown (the measures issue 12 asks for).

Room order (inner to outer); an import from a room to a room of a higher level is an outward import:
    0  errors, resources, timer  (connector/errors.py, the error root; connector/resources.py, package data;
                              connector/timer.py, the injected wall or virtual timer)
    1  contract
    2  core
    3  runtime, storage, catalog, providers, actions, telemetry
    4  host, service
    5  api, bus, client, testing
    6  assembly, cli, __main__   (connector/assembly.py, the composition root that wires every room, and the
                                  process entries that run it)
(STYLE.md and docs/ARCHITECTURE.md: contract < core < runtime/storage/catalog/providers < host/service <
api/bus < assembly/cli; a top-level module of connector/ is a room of its own; one not listed here counts
as level 5.)
Imports between two rooms of the same level are not outward, but a cycle of rooms is reported.
Only the stdlib `ast` reads the code; nothing is imported or run, except the `duplicates` command when it
is on PATH (on a temporary copy of the .py files of connector/ and providers/).
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

LEVELS: dict[str, int] = {
    "errors": 0,
    "resources": 0,
    "timer": 0,
    "contract": 1,
    "core": 2,
    "runtime": 3,
    "storage": 3,
    "catalog": 3,
    "providers": 3,
    "actions": 3,
    "telemetry": 3,
    "host": 4,
    "service": 4,
    "api": 5,
    "bus": 5,
    "lab": 5,
    "client": 5,
    "testing": 5,
    "assembly": 6,
    "cli": 6,
    "__main__": 6,
}
OUTER = 5
SWITCH_LITERALS = frozenset({"command", "discovery", "ble", "usb-serial", "mdns"})
PRODUCTION = ("connector", "providers")


@dataclass(frozen=True)
class Module:
    """One production source file."""

    path: Path
    name: str
    room: str
    package: str
    tree: ast.Module


@dataclass(frozen=True)
class ClassFigure:
    """Size of one class."""

    where: str
    lines: int
    methods: int
    attributes: int


@dataclass(frozen=True)
class Edge:
    """One import from a room to another."""

    where: str
    source: str
    target: str
    imported: str
    lazy: bool


@dataclass
class Metrics:
    """Every figure of the report."""

    function_lengths: dict[str, list[int]] = field(default_factory=dict)
    classes: list[ClassFigure] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    switches: list[tuple[str, str]] = field(default_factory=list)


def room_of(module: str) -> str | None:
    """The room of a dotted module name, or None when it is not production code."""
    parts = module.split(".")
    if parts[0] == "providers":
        return "providers"
    if parts[0] != "connector" or len(parts) < 2:
        return None
    return parts[1]


def load_modules(root: Path) -> list[Module]:
    """Parse every .py file under connector/ and providers/."""
    modules = []
    for top in PRODUCTION:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            room = room_of(name) or "connector"
            package = (
                f"{'/'.join(rel.parts[:2])}/" if top == "connector" and len(rel.parts) > 2 else f"{top}/"
            )
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
            modules.append(Module(rel, name, room, package, tree))
    return modules


def function_lengths(module: Module) -> list[int]:
    """Lines of every def in the module, from the def line to its last line."""
    return [
        (node.end_lineno or node.lineno) - node.lineno + 1
        for node in ast.walk(module.tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _self_attributes(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(method):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and ast.unparse(sub.value) == "self":
                    names.add(sub.attr)
    return names


def class_figure(module: Module, node: ast.ClassDef) -> ClassFigure:
    """Lines, methods and attributes (class-level names plus self.X assigned in methods)."""
    methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    attributes: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            attributes.add(item.target.id)
        elif isinstance(item, ast.Assign):
            attributes.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for method in methods:
        attributes |= _self_attributes(method)
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    return ClassFigure(f"{module.path}:{node.name}", lines, len(methods), len(attributes))


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if module.path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _lazy_nodes(tree: ast.Module) -> set[int]:
    """Ids of import nodes inside a def or an `if TYPE_CHECKING:` block."""
    lazy: set[int] = set()
    for node in ast.walk(tree):
        guarded = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or guarded:
            lazy.update(id(sub) for sub in ast.walk(node) if isinstance(sub, ast.Import | ast.ImportFrom))
    return lazy


def import_edges(module: Module) -> list[Edge]:
    """Every import that leaves the module's room for another production room."""
    lazy = _lazy_nodes(module.tree)
    edges = []
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        targets = [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            targets = [f"{base}.{alias.name}" if room_of(base) is None else base for alias in node.names]
        for target in dict.fromkeys(targets):
            room = room_of(target)
            if room and room != module.room:
                where = f"{module.path}:{node.lineno}"
                edges.append(Edge(where, module.room, room, target, id(node) in lazy))
    return edges


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in SWITCH_LITERALS:
        return node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        found = [lit for elt in node.elts if (lit := _literal(elt))]
        return "/".join(sorted(found)) if found else None
    return None


def _pattern_literal(pattern: ast.pattern) -> str | None:
    if isinstance(pattern, ast.MatchValue):
        return _literal(pattern.value)
    if isinstance(pattern, ast.MatchOr):
        found = [lit for sub in pattern.patterns if (lit := _pattern_literal(sub))]
        return "/".join(sorted(found)) if found else None
    return None


def switches(module: Module) -> list[tuple[str, str]]:
    """(place, literal) for each comparison or match-case against a kind/transport literal."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            literal = next((lit for side in sides if (lit := _literal(side))), None)
            if literal:
                found.append((f"{module.path}:{node.lineno}", literal))
        elif isinstance(node, ast.match_case) and (literal := _pattern_literal(node.pattern)):
            found.append((f"{module.path}:{node.pattern.lineno}", literal))
    return found


def collect(root: Path) -> Metrics:
    """All figures of the tree at root."""
    metrics = Metrics()
    lengths: dict[str, list[int]] = defaultdict(list)
    for module in load_modules(root):
        lengths[module.package] += function_lengths(module)
        metrics.classes += [
            class_figure(module, n) for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)
        ]
        metrics.edges += import_edges(module)
        metrics.switches += switches(module)
    metrics.function_lengths = dict(sorted(lengths.items()))
    metrics.classes.sort(key=lambda c: (-c.lines, c.where))
    return metrics


def outward(edges: list[Edge]) -> list[Edge]:
    """The edges that point from an inner room to an outer one."""
    return [e for e in edges if LEVELS.get(e.target, OUTER) > LEVELS.get(e.source, OUTER)]


def room_cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected groups of two or more rooms (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (top := stack.pop()) != node:
                group.append(top)
            group.append(node)
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def percentile(values: list[int], share: float) -> int:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


def duplicates_pairs(root: Path) -> str:
    """The `duplicates` count line over a copy of the production .py files, or why there is none."""
    command = shutil.which("duplicates")
    if command is None:
        return "unavailable (`duplicates` is not on PATH)"
    with tempfile.TemporaryDirectory(prefix="arch-metrics-") as tmp:
        for top in PRODUCTION:
            for path in (root / top).rglob("*.py"):
                target = Path(tmp) / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        argv = [command, "--repo", tmp, "--most", "200", "--seconds", "120"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False).stdout
    lines = out.splitlines()
    head = lines[0] if lines else "no output"
    incomplete = [line for line in lines if line.startswith("incomplete:")]
    count = re.match(r"\s*(\d+)\s+pairs?", head)
    figure = count.group(1) if count else ("0" if head.startswith("no duplicates") else "?")
    return f"{figure} pairs (`{head.strip()}`)" + (f"; {'; '.join(incomplete)}" if incomplete else "")


def _lengths_section(metrics: Metrics) -> list[str]:
    out = ["## Function lengths (lines, def to last line)", ""]
    out += ["| package | count | median | p90 | max |", "| --- | ---: | ---: | ---: | ---: |"]
    every = [n for values in metrics.function_lengths.values() for n in values]
    rows = [*metrics.function_lengths.items(), ("**all**", every)]
    for package, values in rows:
        if values:
            median = statistics.median(values)
            out.append(
                f"| {package} | {len(values)} | {median:g} | {percentile(values, 0.9)} | {max(values)} |"
            )
    return out


def _classes_section(metrics: Metrics) -> list[str]:
    out = ["## The 10 largest classes", "", "| class | lines | methods | attributes |"]
    out.append("| --- | ---: | ---: | ---: |")
    return out + [f"| {c.where} | {c.lines} | {c.methods} | {c.attributes} |" for c in metrics.classes[:10]]


def _imports_section(metrics: Metrics) -> list[str]:
    bad = outward(metrics.edges)
    out = [
        "## Outward imports",
        "",
        f"Outward imports: **{len(bad)}** (lazy: inside a def or TYPE_CHECKING)",
        "",
    ]
    out += [
        f"- `{e.where}` {e.source} -> {e.target} (`{e.imported}`){' lazy' if e.lazy else ''}" for e in bad
    ]
    cycles = room_cycles(metrics.edges)
    out += ["", f"Room cycles: **{len(cycles)}**", ""]
    for group in cycles:
        out.append(f"- {' <-> '.join(group)}, through:")
        members = set(group)
        inside = sorted(
            {(e.source, e.target, e.where) for e in metrics.edges if {e.source, e.target} <= members}
        )
        out += [f"  - {src} -> {dst} `{where}`" for src, dst, where in inside]
    return out


def _switches_section(metrics: Metrics) -> list[str]:
    by_literal = Counter(lit for _, lit in metrics.switches)
    files = Counter(where.rsplit(":", 1)[0] for where, _ in metrics.switches)
    out = [
        "## Kind / transport switches",
        "",
        f"Switch sites: **{len(metrics.switches)}** in {len(files)} files",
    ]
    out += ["", "| literal(s) | sites |", "| --- | ---: |"]
    out += [f"| {lit} | {n} |" for lit, n in sorted(by_literal.items())]
    out += ["", "| file | sites |", "| --- | ---: |"]
    return out + [f"| {path} | {n} |" for path, n in sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))]


def render(metrics: Metrics, duplicates: str) -> str:
    """The Markdown report."""
    out = ["# Architecture figures", ""]
    for section in (_lengths_section, _classes_section, _imports_section, _switches_section):
        out += [*section(metrics), ""]
    out += ["## Duplicates in production code", "", f"`duplicates` pairs: {duplicates}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the report for the tree at --root."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--no-duplicates", action="store_true", help="skip the duplicates command")
    args = parser.parse_args(argv)
    dup = "skipped (--no-duplicates)" if args.no_duplicates else duplicates_pairs(args.root)
    sys.stdout.write(render(collect(args.root), dup))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
