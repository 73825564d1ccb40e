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


@pytest.fixture
def walked(tmp_path: Path) -> Path:
    """An edge (api), a service, a runtime, a pure core; a Bus handler reaching a host through a protocol."""
    _write(
        tmp_path,
        "connector/api/routes.py",
        "from connector.service.svc import Service\n"
        "\n"
        "def router(service: Service):\n"
        '    @routes.post("/v1/directives")\n'
        "    async def invoke(request):\n"
        "        principal = service.authenticate(request)\n"
        "        return await service.invoke(principal)\n"
        "\n"
        '    @routes.get("/v1/operations/{operation_id}")\n'
        "    async def status(request):\n"
        "        if request:\n"
        "            return service.status(request)\n"
        "        return service.status(request)\n",
    )
    _write(tmp_path, "connector/errors.py", "class Boom(Exception):\n    def __init__(self):\n        pass\n")
    _write(
        tmp_path,
        "connector/service/svc.py",
        "from connector.core.rules import check\n"
        "from connector.errors import Boom\n"
        "from connector.runtime.run import Runtime\n"
        "\n"
        "class Service:\n"
        "    def __init__(self, runtime: Runtime):\n"
        "        self.runtime = runtime\n"
        "\n"
        "    def authenticate(self, token):\n"
        "        return check(token)\n"
        "\n"
        "    async def invoke(self, principal):\n"
        "        if not principal:\n"
        "            raise Boom()\n"
        "        check(principal)\n"
        "        principal.metadata()\n"  # no written type: unresolved, not followed
        "        self.runtime.launch()\n"
        "        return self.runtime.metadata()\n"
        "\n"
        "    def status(self, token):\n"
        "        self.authenticate(token)\n"
        "        return self.authenticate(token)\n",
    )
    _write(tmp_path, "connector/core/rules.py", "def check(x):\n    return x\n")
    _write(
        tmp_path,
        "connector/runtime/run.py",
        "from connector.core.rules import check\n"
        "\n"
        "class Runtime:\n"
        "    def launch(self):\n"
        "        return check(1)\n"
        "\n"
        "    def metadata(self):\n"
        "        return 2\n",
    )
    _write(
        tmp_path,
        "connector/bus/adapter.py",
        "from typing import Protocol\n"
        "from connector.service.svc import Service\n"
        "\n"
        "class Face(Protocol):\n"
        "    async def cancel(self, token): ...\n"
        "\n"
        "class Adapter:\n"
        "    def __init__(self, service: Service, host: Face):\n"
        "        self._service = service\n"
        "        self._host = host\n"
        "\n"
        "    def handlers(self):\n"
        "        return [(self.subjects.cancel, self._cancel, False)]\n"
        "\n"
        "    async def _cancel(self, token, data):\n"
        "        self._service.authenticate(token)\n"
        "        return await self._host.cancel(token)\n",
    )
    _write(
        tmp_path,
        "connector/host/hosting.py",
        "from connector.service.svc import Service\n"
        "\n"
        "class Host:\n"
        "    def __init__(self, service: Service):\n"
        "        self.service = service\n"
        "\n"
        "    async def cancel(self, token):\n"
        "        return self.service.authenticate(token)\n",
    )
    return tmp_path


def test_edges_found_by_their_decorators_and_subject_tuples(arch: ModuleType, walked: Path) -> None:
    edges = arch.edge_handlers(arch.CallGraph(arch.load_modules(walked)))
    assert set(edges) == {"POST /v1/directives", "GET /v1/operations/{operation_id}", "bus cancel"}
    assert edges["bus cancel"].name == "connector.bus.adapter:Adapter._cancel"


def test_a_walk_counts_rooms_and_climbs(arch: ModuleType, walked: Path) -> None:
    walk = arch.collect(walked).walks["scan directive"]
    # authenticate -> check, invoke -> check, launch -> check, metadata; the raise is not followed
    assert walk.rooms == [
        *("api", "service", "core", "service", "api", "service", "core", "service"),
        *("runtime", "core", "runtime", "service", "runtime", "service", "api"),
    ]
    assert walk.distinct == ["api", "service", "core", "runtime"]
    assert walk.climbs == 7  # core>service x2, service>api x2, core>runtime, runtime>service x2
    assert walk.corridor == [
        *("api", "service", "api", "service", "runtime", "service", "runtime", "service", "api"),
    ]
    assert arch.climbs(walk.corridor) == 4
    assert walk.service_to_runtime == ["launch", "metadata"]
    assert walk.unresolved == 1  # `principal.metadata()`: the name of a def, on a value of no written type


def test_a_walk_goes_through_a_protocol_into_its_implementers(arch: ModuleType, walked: Path) -> None:
    walk = arch.collect(walked).walks["Bus cancel"]
    assert walk.through_protocol == {"Face.cancel"}
    assert walk.distinct == ["bus", "service", "core", "host"]


def test_authentications_per_request(arch: ModuleType, walked: Path) -> None:
    counts = arch.collect(walked).authentications
    assert counts["POST /v1/directives"] == 1
    # Two per service.status; the two arms of the route's `if` are exclusive: 2, not 4.
    assert counts["GET /v1/operations/{operation_id}"] == 2
    assert counts["bus cancel"] == 2  # the adapter's own, then the host's behind the protocol


def test_walks_render(arch: ModuleType, walked: Path) -> None:
    report = arch.render(arch.collect(walked), "skipped")
    row = "| scan directive | `POST /v1/directives` | 4 (api, service, core, runtime) | 7 | 4 | 4 |"
    assert row in report
    assert "Most on one edge: **2**; edges above 1: **2** of 3" in report


def test_a_missing_edge_says_so(arch: ModuleType, tree: Path) -> None:
    report = arch.render(arch.collect(tree), "skipped")
    assert "| status long poll | GET /v1/operations/{operation_id} | no such edge |" in report
