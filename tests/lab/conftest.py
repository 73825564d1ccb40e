"""One real lab per module (CONTRACT §15): two clustered nats-servers, three nodes, the view, a sniffer."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.lab.support import (
    ClusterServer,
    LabView,
    Node,
    start_cluster,
    start_lab,
    start_sniffer,
    write_nodes_file,
)
from tests.support.directives import HEART_RATE
from tests.support.principals import create_principals

SCAN = "device.discovery.scan"
NODES = ("a", "b", "c")


@dataclass(slots=True)
class Lab:
    """Everything a lab test reaches."""

    root: Path
    servers: list[ClusterServer]
    urls: str
    seeds: dict[str, Path]
    nodes: dict[str, Node]
    view: LabView
    lab_operator: str
    canaries: list[str]
    sniffed: Path
    sniffer: object


def _node(root: Path, name: str, urls: str, seed: Path) -> Node:
    data_dir = root / f"node-{name}"
    tokens = create_principals(data_dir, callers={"alice": [SCAN]}, operators=["op", "op-revoked"])
    argv: list[str | Path] = ["--simulate", "--data-dir", data_dir, "--nats", urls, "--node", name]
    argv += ["--nats-creds", seed]
    return Node(
        name, data_dir, argv, root / f"node-{name}.log", tokens.op, tokens.alice, tokens["op-revoked"]
    )


def _canary(node: Node) -> list[str]:
    """A simulated heart-rate strap whose name and address must never leave the node's HTTP answers."""
    name, address = "CANARY" + secrets.token_hex(6), ":".join(f"{b:02X}" for b in secrets.token_bytes(6))
    device = {
        "address": address,
        "name": name,
        "rssi": -50,
        "service_uuids": [HEART_RATE],
        "interval_ms": 200,
    }
    answer = httpx.post(
        node.base_url + "/v1/sim/ble/devices",
        json=device,
        headers={"Authorization": f"Bearer {node.operator}"},
    )
    assert answer.status_code == 201, answer.text
    return [name, address]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The lab, torn down after the module (view, nodes, sniffer, servers)."""
    from tests.lab.support import make_users

    root = tmp_path_factory.mktemp("lab")
    seeds = make_users(root / "users")
    servers = start_cluster(root, seeds)
    urls = ",".join(server.url for server in servers)
    sniffed = root / "sniffed.jsonl"
    sniffer = start_sniffer(urls, seeds["sniffer"], sniffed, root / "sniffer.log")
    nodes = {name: _node(root, name, urls, seeds[f"node-{name}"]) for name in NODES}
    view: LabView | None = None
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(Node.start, nodes.values()))
        canaries = [value for node in nodes.values() for value in _canary(node)]
        lab_dir = root / "view"
        lab_tokens = create_principals(lab_dir, operators=["lab-alice"])
        nodes_file = write_nodes_file(root / "nodes.json", {n: node.operator for n, node in nodes.items()})
        view = start_lab(urls, nodes_file, lab_dir, seeds["lab"], root / "lab.log")
        view.sign_in(lab_tokens["lab-alice"])
        yield Lab(
            root, servers, urls, seeds, nodes, view, lab_tokens["lab-alice"], canaries, sniffed, sniffer
        )
    finally:
        if view is not None:
            view.stop()
        for node in nodes.values():
            if node.process is not None and node.process.process.poll() is None:
                node.process.stop()
        sniffer.terminate()
        sniffer.wait(timeout=10)
        for server in servers:
            server.stop()
