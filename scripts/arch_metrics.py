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

Walks (issue 15): a static call graph from an edge handler down, for three requests - a scan directive
(`POST /v1/directives`), a status long poll (`GET /v1/operations/{operation_id}`) and a Bus cancel (the
handler of the `cancel` subject). Edge handlers are found by shape: a def decorated
`@<router>.<method>("/...")` in api/, and a `(self.subjects.<name>, self.<handler>, ...)` tuple in a class
of bus/.
- A call is followed when its target can be named: a def or class of the module or imported into it,
  `module.f`, `self.m` (the class and its bases), and `x.m`, `x.y.m`, `x[k].m` where the type of `x` is
  written down: a parameter's annotation (also an enclosing def's, so a route closure sees its router's
  `service`), an annotated local, a local `x = C(...)` or `x = f(...)` with a return annotation, a class-level
  or `self.x: T` annotation, or `self.x = param` / `self.x = f(...)` in a method; `Mapping[K, V]` gives `x[k]`
  the type V. A class call runs its `__init__` (or `__post_init__`); an exception's is not followed (a raise
  is not a corridor). A lambda's body is walked where it is written.
- A call through a `Protocol` is followed into every class of the tree that defines all of the protocol's
  methods (a structural match); the walk lists those protocols.
- Every branch is walked (a static over-approximation: a switch on the operation kind takes both arms, an
  error path counts like the happy one); a def already on the call stack is not entered again.
- What it cannot see, so does not count: callables passed as values (callbacks, `start_soon(f)`, handlers in
  a table, `functools.partial`), properties and descriptors, decorator wrappers, calls on a value whose type
  is not written down (`unresolved`: such calls whose name is a def of the tree), the work of spawned tasks
  (the provider's scan runs in one), and stdlib or third-party code.
- Rooms entered: the distinct rooms the walk runs code in. The walk is the sequence of rooms it is in, a call
  into another room and the return from it each a step. A climb is a step into a room of a higher level that
  the walk was already in before (it left it downward and comes back up). The corridor is the same sequence
  with the pure rooms (errors, contract, core) left out; service arrivals count the corridor's steps into
  service; service -> runtime lists the calls from a service def straight into a runtime def.
Authentications per request (each edge handler): calls that reach a def named `authenticate` (or call it
through a protocol), not counted again inside it, summed along the code and maxed over exclusive branches
(if/else, an arm that returns or raises against the rest of the block, match cases, except arms), so the
figure is the most one request can meet.
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
    walks: dict[str, Walk | None] = field(default_factory=dict)
    authentications: dict[str, int] = field(default_factory=dict)


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


# ---- walks: rooms entered and climbs back up, authentications per edge request (method: the docstring) ----

HTTP_METHODS = frozenset({"get", "post", "put", "delete", "patch"})
WALKS: tuple[tuple[str, str], ...] = (
    ("scan directive", "POST /v1/directives"),
    ("status long poll", "GET /v1/operations/{operation_id}"),
    ("Bus cancel", "bus cancel"),
)
AUTHENTICATE = "authenticate"
PURE_LEVEL = 2  # errors, contract and core: no I/O, `now` passed in
WALK_BUDGET = 20000  # calls followed per walk; a walk that reaches it says so


@dataclass(eq=False)
class Func:
    """One def (or the module-level defs' and methods' shared shape)."""

    module: Module
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: Klass | None
    parent: Func | None
    nested: dict[str, Func] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """`module:Class.def` (nested defs by their own name)."""
        prefix = f"{self.owner.name}." if self.owner else ""
        return f"{self.module.name}:{prefix}{self.node.name}"


@dataclass(eq=False)
class Klass:
    """One class: its methods, written attribute types and bases."""

    module: Module
    node: ast.ClassDef
    methods: dict[str, Func] = field(default_factory=dict)
    attributes: dict[str, tuple[ast.expr, Func | None]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The class name."""
        return self.node.name


@dataclass(frozen=True)
class MapOf:
    """A mapping whose values have a known type (`x[k]` is one of them)."""

    value: Klass


Type = Klass | Module | MapOf


@dataclass(frozen=True, eq=False)
class Through:
    """A call of `method` through the Protocol `protocol`."""

    protocol: Klass
    method: str

    @property
    def name(self) -> str:
        """`Protocol.method`."""
        return f"{self.protocol.name}.{self.method}"


@dataclass
class Walk:
    """The figures of one walk."""

    rooms: list[str] = field(default_factory=list)
    entries: Counter[str] = field(default_factory=Counter)
    service_to_runtime: list[str] = field(default_factory=list)
    through_protocol: set[str] = field(default_factory=set)
    unresolved: int = 0
    calls: int = 0
    truncated: bool = False

    @property
    def distinct(self) -> list[str]:
        """Rooms entered, in order of first entry."""
        return list(dict.fromkeys(self.rooms))

    @property
    def climbs(self) -> int:
        """Steps into a room of a higher level the walk was already in."""
        return climbs(self.rooms)

    @property
    def corridor(self) -> list[str]:
        """The walk without the pure rooms (errors, contract, core): the rooms that do I/O or own state."""
        kept = [room for room in self.rooms if LEVELS.get(room, OUTER) > PURE_LEVEL]
        return [room for i, room in enumerate(kept) if i == 0 or kept[i - 1] != room]


def climbs(rooms: list[str]) -> int:
    """Steps of a room sequence into a room of a higher level that came earlier in it."""
    count = 0
    for i in range(1, len(rooms)):
        here, there = rooms[i - 1], rooms[i]
        if LEVELS.get(there, OUTER) > LEVELS.get(here, OUTER) and there in rooms[: i - 1]:
            count += 1
    return count


class CallGraph:
    """Name resolution over the parsed tree: modules, classes, defs, imports."""

    def __init__(self, modules: list[Module]) -> None:
        self.modules = {m.name: m for m in modules}
        self.classes: dict[tuple[str, str], Klass] = {}
        self.functions: dict[tuple[str, str], Func] = {}
        self.imports: dict[str, dict[str, str]] = {}
        self.all_functions: list[Func] = []
        for module in modules:
            self._index(module)
        self.def_names = frozenset(f.node.name for f in self.all_functions)
        self._implementers: dict[int, list[Klass]] = {}

    def _index(self, module: Module) -> None:
        self.imports[module.name] = _import_table(module)
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[(module.name, node.name)] = self._klass(module, node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions[(module.name, node.name)] = self._func(module, node, None, None)

    def _klass(self, module: Module, node: ast.ClassDef) -> Klass:
        klass = Klass(module, node)
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                klass.methods[item.name] = self._func(module, item, klass, None)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                klass.attributes[item.target.id] = (item.annotation, None)
        for method in klass.methods.values():
            _self_assignments(klass, method)
        return klass

    def _func(
        self,
        module: Module,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        owner: Klass | None,
        parent: Func | None,
    ) -> Func:
        func = Func(module, node, owner, parent)
        self.all_functions.append(func)
        for sub in _direct_defs(node):
            func.nested[sub.name] = self._func(module, sub, None, func)
        return func

    # -- names and types --

    def resolve(self, module: str, name: str, depth: int = 0) -> Func | Klass | Module | None:
        """What `name` is at the top level of `module` (following imports and re-exports)."""
        if (module, name) in self.classes:
            return self.classes[(module, name)]
        if (module, name) in self.functions:
            return self.functions[(module, name)]
        target = self.imports.get(module, {}).get(name)
        if target is None or depth > 5:
            return None
        if target in self.modules:
            return self.modules[target]
        base, _, attr = target.rpartition(".")
        return self.resolve(base, attr, depth + 1) if base in self.modules else None

    def annotation(self, module: str, node: ast.expr | None) -> Type | None:
        """The class (or mapping of a class) an annotation names."""
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                return self.annotation(module, ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return None
        if isinstance(node, ast.BinOp):
            return self.annotation(module, node.left) or self.annotation(module, node.right)
        if isinstance(node, ast.Subscript):
            return self._generic(module, node)
        found = self._named(module, node)
        return found if isinstance(found, Klass | Module) else None

    def _generic(self, module: str, node: ast.Subscript) -> Type | None:
        base = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in {"Mapping", "MutableMapping", "dict", "defaultdict"}:
            value = self.annotation(module, args[-1])
            return MapOf(value) if isinstance(value, Klass) else None
        if base in {"Optional", "ClassVar", "Final", "Annotated", "Awaitable", "Coroutine"}:
            return self.annotation(module, args[0] if base != "Coroutine" else args[-1])
        return self.annotation(module, node.value)

    def _named(self, module: str, node: ast.expr) -> Func | Klass | Module | None:
        if isinstance(node, ast.Name):
            return self.resolve(module, node.id)
        if isinstance(node, ast.Attribute):
            outer = self._named(module, node.value)
            if isinstance(outer, Module):
                return self.resolve(outer.name, node.attr)
        return None

    def attribute(self, klass: Klass, name: str, depth: int = 0) -> Type | None:
        """The written type of `klass.name` (its own annotations, then its bases')."""
        if name in klass.attributes:
            node, scope = klass.attributes[name]
            if scope is not None:  # assigned in a method: the type of what was assigned
                return self.expr_type(scope, node, depth + 1)
            return self.annotation(klass.module.name, node)
        method = klass.methods.get(name)
        if method is not None and _is_property(method.node):
            return self.annotation(klass.module.name, method.node.returns)
        for base in self.bases(klass):
            found = self.attribute(base, name, depth + 1) if depth < 8 else None
            if found is not None:
                return found
        return None

    def bases(self, klass: Klass) -> list[Klass]:
        """The bases of `klass` this tree defines."""
        found = [self.annotation(klass.module.name, base) for base in klass.node.bases]
        return [b for b in found if isinstance(b, Klass) and b is not klass]

    def method(self, klass: Klass, name: str, depth: int = 0) -> Func | None:
        """`klass.name` as a def, searched through the bases."""
        if name in klass.methods:
            return klass.methods[name]
        for base in self.bases(klass):
            found = self.method(base, name, depth + 1) if depth < 8 else None
            if found is not None:
                return found
        return None

    def is_protocol(self, klass: Klass) -> bool:
        """True for a `typing.Protocol` class."""
        return any(ast.unparse(base).endswith("Protocol") for base in klass.node.bases)

    def implementers(self, protocol: Klass) -> list[Klass]:
        """The classes of the tree that define every method of `protocol` (a structural match; properties may
        be plain attributes, so they are not asked for)."""
        if id(protocol) not in self._implementers:
            wanted = {name for name, f in protocol.methods.items() if not _is_property(f.node)}
            self._implementers[id(protocol)] = [
                k
                for k in self.classes.values()
                if not self.is_protocol(k) and wanted and all(self.method(k, name) for name in wanted)
            ]
        return self._implementers[id(protocol)]

    def through(self, call: Through) -> list[Func]:
        """The defs a protocol call may run: the method of each implementer."""
        found = [self.method(k, call.method) for k in self.implementers(call.protocol)]
        return [f for f in found if f is not None]

    def constructor(self, klass: Klass) -> Func | None:
        """The `__init__` (or `__post_init__`) a class call runs; None for an exception (not a corridor)."""
        if self.is_exception(klass):
            return None
        return self.method(klass, "__init__") or self.method(klass, "__post_init__")

    def is_exception(self, klass: Klass, depth: int = 0) -> bool:
        """True for a class deriving from an exception."""
        names = [ast.unparse(base) for base in klass.node.bases]
        if any(n.endswith(("Error", "Exception", "Unavailable")) for n in names):
            return True
        return depth < 8 and any(self.is_exception(b, depth + 1) for b in self.bases(klass))

    def name_type(self, func: Func, name: str, depth: int = 0) -> Type | None:
        """The type of `name` inside `func`: self, a parameter, a local, an enclosing def's, the module's."""
        scope: Func | None = func
        while scope is not None and depth < 12:
            if name == "self" and scope.owner is not None:
                return scope.owner
            written = _written_types(scope).get(name)
            if written is not None:
                kind, node = written
                found = (
                    self.annotation(scope.module.name, node)
                    if kind == "ann"
                    else self.expr_type(scope, node, depth + 1)
                )
                if found is not None:
                    return found
            scope = scope.parent
        found = self.resolve(func.module.name, name)
        return found if isinstance(found, Module) else None

    def expr_type(self, func: Func, node: ast.expr, depth: int = 0) -> Type | None:
        """The type of an expression, where it is written down."""
        if depth > 12:
            return None
        if isinstance(node, ast.Await):
            return self.expr_type(func, node.value, depth + 1)
        if isinstance(node, ast.Name):
            return self.name_type(func, node.id, depth + 1)
        if isinstance(node, ast.Attribute):
            outer = self.expr_type(func, node.value, depth + 1)
            if isinstance(outer, Module):
                found = self.resolve(outer.name, node.attr)
                return found if isinstance(found, Klass | Module) else None
            return self.attribute(outer, node.attr, depth + 1) if isinstance(outer, Klass) else None
        if isinstance(node, ast.Subscript):
            outer = self.expr_type(func, node.value, depth + 1)
            return outer.value if isinstance(outer, MapOf) else None
        if isinstance(node, ast.Call):
            target = self.callee(func, node)
            if isinstance(target, Klass):
                return target
            if isinstance(target, Func):
                return self.annotation(target.module.name, target.node.returns)
        return None

    def callee(self, func: Func, call: ast.Call) -> Func | Klass | Through | None:
        """What a call runs: a def, a class (its constructor), a protocol's method, or None (unseen)."""
        target = call.func
        if isinstance(target, ast.Name):
            scope: Func | None = func
            while scope is not None:
                if target.id in scope.nested:
                    return scope.nested[target.id]
                scope = scope.parent
            found = self.resolve(func.module.name, target.id)
            return found if isinstance(found, Func | Klass) else None
        if not isinstance(target, ast.Attribute):
            return None
        outer = self.expr_type(func, target.value)
        if isinstance(outer, Module):
            found = self.resolve(outer.name, target.attr)
            return found if isinstance(found, Func | Klass) else None
        if isinstance(outer, Klass):
            method = self.method(outer, target.attr)
            if method is not None and not self.is_protocol(method.owner or outer):
                return method
            owner = method.owner if method is not None and method.owner is not None else outer
            if self.is_protocol(owner):
                return Through(owner, target.attr)
        return None


def _import_table(module: Module) -> dict[str, str]:
    """Local name -> dotted target of every import in the module."""
    table: dict[str, str] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                table[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names:
                table[alias.asname or alias.name] = f"{base}.{alias.name}"
    return table


def _direct_defs(node: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Defs nested directly in a def (not inside a nested def or class)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(child)
        elif not isinstance(child, ast.ClassDef | ast.Lambda):
            found += _direct_defs(child)
    return found


def _self_assignments(klass: Klass, method: Func) -> None:
    """`self.x: T = ...`, `self.x = param` and `self.x = f(...)` in a method, as the type of attribute `x`."""
    for node in ast.walk(method.node):
        if isinstance(node, ast.AnnAssign) and _is_self_attribute(node.target):
            assert isinstance(node.target, ast.Attribute)
            klass.attributes.setdefault(node.target.attr, (node.annotation, None))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_self_attribute(node.targets[0]):
            target = node.targets[0]
            assert isinstance(target, ast.Attribute)
            if isinstance(node.value, ast.Name | ast.Call):
                klass.attributes.setdefault(target.attr, (node.value, method))


def _is_self_attribute(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _is_property(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(ast.unparse(d).endswith(("property", "cached_property")) for d in node.decorator_list)


def _written_types(func: Func) -> dict[str, tuple[str, ast.expr]]:
    """Names with a written type in a def: parameters and annotated locals (`ann`), assigned ones (`expr`)."""
    args = func.node.args
    found: dict[str, tuple[str, ast.expr]] = {}
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if arg.annotation is not None:
            found[arg.arg] = ("ann", arg.annotation)
    for node in _own_statements(func.node):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.setdefault(node.target.id, ("ann", node.annotation))
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            found.setdefault(node.targets[0].id, ("expr", node.value))
        elif isinstance(node, ast.NamedExpr):
            found.setdefault(node.target.id, ("expr", node.value))
    return found


def _own_statements(node: ast.AST) -> list[ast.AST]:
    """Every node of a def's body, not descending into nested defs or classes."""
    found: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        found.append(child)
        found += _own_statements(child)
    return found


def calls_in_order(node: ast.AST) -> list[ast.Call]:
    """The calls a def's body makes, in evaluation order (arguments before the call; lambdas inline)."""
    found: list[ast.Call] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(child, ast.arguments):
            continue
        found += calls_in_order(child)
    if isinstance(node, ast.Call):
        found.append(node)
    return found


def _body_calls(func: Func) -> list[ast.Call]:
    calls: list[ast.Call] = []
    for statement in func.node.body:
        calls += calls_in_order(statement)
    return calls


class Walker:
    """Follows the calls of one edge handler down, recording the rooms the walk is in."""

    def __init__(self, graph: CallGraph) -> None:
        self.graph = graph

    def walk(self, start: Func) -> Walk:
        """The walk from `start`."""
        walk = Walk()
        walk.rooms.append(start.module.room)
        self._enter(start, [start], walk)
        return walk

    def _enter(self, func: Func, stack: list[Func], walk: Walk) -> None:
        for call in _body_calls(func):
            for target in self._targets(func, call, walk):
                if target in stack:
                    continue
                if walk.calls >= WALK_BUDGET:
                    walk.truncated = True
                    return
                walk.calls += 1
                self._step(walk, func, target)
                self._enter(target, [*stack, target], walk)
                self._back(walk, func)

    def _targets(self, func: Func, call: ast.Call, walk: Walk) -> list[Func]:
        found = self.graph.callee(func, call)
        if isinstance(found, Through):
            walk.through_protocol.add(found.name)
            return self.graph.through(found)
        if found is None and _called_name(call) in self.graph.def_names:
            walk.unresolved += 1
        target = self.graph.constructor(found) if isinstance(found, Klass) else found
        return [] if target is None else [target]

    def _step(self, walk: Walk, caller: Func, target: Func) -> None:
        here, there = walk.rooms[-1], target.module.room
        if there != here:
            walk.rooms.append(there)
            walk.entries[there] += 1
        if caller.module.room == "service" and there == "runtime":
            walk.service_to_runtime.append(target.node.name)

    def _back(self, walk: Walk, caller: Func) -> None:
        if walk.rooms[-1] != caller.module.room:
            walk.rooms.append(caller.module.room)


def authentications(graph: CallGraph, start: Func) -> int:
    """Authentications one request to `start` can meet: calls reaching a def named `authenticate`, summed
    along the code and maxed over exclusive branches (if/else, an early return, match cases, except arms)."""
    return Auth(graph).block(start.node.body, [start])


class Auth:
    """The authentication count of statements, calls and defs."""

    def __init__(self, graph: CallGraph) -> None:
        self.graph = graph

    def block(self, statements: list[ast.stmt], stack: list[Func]) -> int:
        """Along a block; an arm that ends in return or raise has the rest of the block as its other arm."""
        total = 0
        for i, statement in enumerate(statements):
            if isinstance(statement, ast.If) and not statement.orelse and _ends(statement.body):
                rest = self.block(statements[i + 1 :], stack)
                arm = self.block(statement.body, stack)
                return total + self.calls(statement.test, stack) + max(arm, rest)
            total += self.statement(statement, stack)
            if isinstance(statement, ast.Return | ast.Raise):
                return total
        return total

    def statement(self, node: ast.stmt, stack: list[Func]) -> int:
        """One statement: the calls in its own expressions, then its blocks (exclusive ones maxed)."""
        if isinstance(node, ast.If):
            arms = (self.block(node.body, stack), self.block(node.orelse, stack))
            return self.calls(node.test, stack) + max(arms)
        if isinstance(node, ast.Try | ast.TryStar):
            handlers = [self.block(h.body, stack) for h in node.handlers]
            done = self.block(node.body, stack) + self.block(node.orelse, stack)
            return max([done, *handlers]) + self.block(node.finalbody, stack)
        if isinstance(node, ast.Match):
            return self.calls(node.subject, stack) + max(
                (self.block(c.body, stack) for c in node.cases), default=0
            )
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            head = node.iter if isinstance(node, ast.For | ast.AsyncFor) else node.test
            return self.calls(head, stack) + self.block(node.body, stack) + self.block(node.orelse, stack)
        if isinstance(node, ast.With | ast.AsyncWith):
            return sum(self.calls(item.context_expr, stack) for item in node.items) + self.block(
                node.body, stack
            )
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return 0
        return self.calls(node, stack)

    def calls(self, node: ast.AST, stack: list[Func]) -> int:
        """The calls of one expression (or simple statement), in evaluation order."""
        return sum(self.call(call, stack) for call in calls_in_order(node))

    def call(self, call: ast.Call, stack: list[Func]) -> int:
        """1 for an `authenticate` call; else what the called def adds (through a protocol: the most)."""
        found = self.graph.callee(stack[-1], call)
        if found is None:
            return 0
        if _called_name(call) == AUTHENTICATE:
            return 1  # whichever def answers it (a protocol's too), it is one authentication
        options = self.graph.through(found) if isinstance(found, Through) else [found]
        targets = [self.graph.constructor(f) if isinstance(f, Klass) else f for f in options]
        runs = [self.block(t.node.body, [*stack, t]) for t in targets if t is not None and t not in stack]
        return max(runs, default=0)


def _ends(block: list[ast.stmt]) -> bool:
    return bool(block) and isinstance(block[-1], ast.Return | ast.Raise)


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def edge_handlers(graph: CallGraph) -> dict[str, Func]:
    """`METHOD /path` of each route def (`@router.post("/path")`) and `bus <subject>` of each Bus handler."""
    found: dict[str, Func] = {}
    for func in graph.all_functions:
        for decorator in func.node.decorator_list:
            route = _route_of(decorator)
            if route is not None and func.module.room == "api":
                found.setdefault(route, func)
    for klass in graph.classes.values():
        if klass.module.room == "bus":
            for subject, method in _bus_handlers(klass):
                found.setdefault(f"bus {subject}", method)
    return dict(sorted(found.items()))


def _route_of(decorator: ast.expr) -> str | None:
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
        return None
    if decorator.func.attr not in HTTP_METHODS or not decorator.args:
        return None
    path = decorator.args[0]
    if not (isinstance(path, ast.Constant) and isinstance(path.value, str) and path.value.startswith("/")):
        return None
    return f"{decorator.func.attr.upper()} {path.value}"


def _bus_handlers(klass: Klass) -> list[tuple[str, Func]]:
    """(subject, method) of each `(self.subjects.<subject>, self.<method>, ...)` tuple in the class."""
    found = []
    for node in ast.walk(klass.node):
        if not (isinstance(node, ast.Tuple) and len(node.elts) >= 2):
            continue
        subject, handler = node.elts[0], node.elts[1]
        if (
            isinstance(subject, ast.Attribute)
            and "subjects" in ast.unparse(subject.value)
            and _is_self_attribute(handler)
        ):
            assert isinstance(handler, ast.Attribute)
            method = klass.methods.get(handler.attr)
            if method is not None:
                found.append((subject.attr, method))
    return found


def collect(root: Path) -> Metrics:
    """All figures of the tree at root."""
    metrics = Metrics()
    lengths: dict[str, list[int]] = defaultdict(list)
    modules = load_modules(root)
    for module in modules:
        lengths[module.package] += function_lengths(module)
        metrics.classes += [
            class_figure(module, n) for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)
        ]
        metrics.edges += import_edges(module)
        metrics.switches += switches(module)
    metrics.function_lengths = dict(sorted(lengths.items()))
    metrics.classes.sort(key=lambda c: (-c.lines, c.where))
    metrics.walks, metrics.authentications = walk_figures(CallGraph(modules))
    return metrics


def walk_figures(graph: CallGraph) -> tuple[dict[str, Walk | None], dict[str, int]]:
    """The three walks (None where the tree has no such edge) and the authentications of every edge."""
    edges = edge_handlers(graph)
    walker = Walker(graph)
    walks = {name: walker.walk(edges[edge]) if edge in edges else None for name, edge in WALKS}
    return walks, {edge: authentications(graph, func) for edge, func in edges.items()}


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


def _walks_section(metrics: Metrics) -> list[str]:
    out = [
        "## Walks: rooms entered and climbs back up",
        "",
        "Static call graph from the edge handler down (method: the docstring of `scripts/arch_metrics.py`).",
        "Corridor: the walk with the pure rooms (errors, contract, core) left out.",
        "",
        "| walk | edge | rooms entered | climbs | corridor climbs | service arrivals | service -> runtime "
        "| followed through a protocol | calls followed | unresolved |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for (name, edge), walk in zip(WALKS, metrics.walks.values(), strict=True):
        if walk is None:
            out.append(f"| {name} | {edge} | no such edge | | | | | | | |")
            continue
        down = ", ".join(f"`{n}`" for n in walk.service_to_runtime) or "-"
        protocols = ", ".join(f"`{n}`" for n in sorted(walk.through_protocol)) or "-"
        truncated = " (budget reached)" if walk.truncated else ""
        out.append(
            f"| {name} | `{edge}` | {len(walk.distinct)} ({', '.join(walk.distinct)}) | {walk.climbs} "
            f"| {climbs(walk.corridor)} | {walk.corridor.count('service')} | {len(walk.service_to_runtime)} "
            f"({down}) | {protocols} | {walk.calls}{truncated} | {walk.unresolved} |"
        )
    out.append("")
    for name, walk in metrics.walks.items():
        if walk is not None:
            out.append(f"- {name}, corridor: {' > '.join(walk.corridor)}")
    return out


def _authentications_section(metrics: Metrics) -> list[str]:
    counts = metrics.authentications
    most = max(counts.values(), default=0)
    above = sum(1 for n in counts.values() if n > 1)
    out = [
        "## Authentications per request",
        "",
        f"Most on one edge: **{most}**; edges above 1: **{above}** of {len(counts)} (target: 1 where a token"
        " is taken)",
        "",
        "| edge | authentications |",
        "| --- | ---: |",
    ]
    return out + [f"| `{edge}` | {n} |" for edge, n in counts.items()]


def render(metrics: Metrics, duplicates: str) -> str:
    """The Markdown report."""
    out = ["# Architecture figures", ""]
    sections = (_lengths_section, _classes_section, _imports_section, _switches_section, _walks_section)
    for section in (*sections, _authentications_section):
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
