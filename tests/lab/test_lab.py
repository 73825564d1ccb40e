"""A real lab on loopback (CONTRACT §15), run under the shipped permissions (docs/lab/permissions.conf):
discovery, listing, a scan seen live, a forwarded cancel, a killed node, a killed server, a duplicate name,
no candidate data on any subject nor in the audit, and what the permissions refuse."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.bus.node import NodeSubjects
from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS
from tests.lab.conftest import Lab
from tests.lab.support import (
    all_rows,
    gather,
    page_lines,
    page_rows,
    page_total,
    request,
    requests,
    start_lab,
    violations,
    wait_page,
    write_nodes_file,
)
from tests.support.directives import scan_directive
from tests.support.paths import REPO
from tests.support.serving import cli_argv, cli_env

ARTIFACTS = REPO / "test-artifacts"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
pytestmark = [pytest.mark.serve, pytest.mark.lab, pytest.mark.timeout(600)]
LISTED_PER_NODE = 100


def _subjects(node: str) -> NodeSubjects:
    return NodeSubjects.of("sensorium-os", node)


def _start(lab: Lab, node: str, window: int) -> str:
    """A scan admitted on the node over its own subjects, as the caller; its operation id."""
    body = {"directive": scan_directive(window)}
    reply = request(lab.urls, lab.seeds["caller"], _subjects(node).ops.start, body, lab.nodes[node].caller)
    assert reply["state"] in ("pending", "running"), reply
    return str(reply["op"])


async def _start_and_cancel(lab: Lab, node: str, count: int) -> None:
    """`count` scans started and cancelled in turn (each waits for its adapter's claim to be free)."""
    import nats

    nc = await nats.connect(servers=lab.urls.split(","), nkeys_seed=str(lab.seeds["caller"]))
    headers = {"Authorization": f"Bearer {lab.nodes[node].caller}"}
    subjects = _subjects(node).ops
    try:
        done = 0
        while done < count:
            body = json.dumps({"directive": scan_directive(60)}).encode()
            reply = json.loads((await nc.request(subjects.start, body, timeout=10, headers=headers)).data)
            if reply.get("error", {}).get("code") == "transport-claimed":
                await asyncio.sleep(0.05)  # real peer: the previous scan's stop is being confirmed
                continue
            cancel = json.dumps({"op": reply["op"]}).encode()
            await nc.request(subjects.cancel, cancel, timeout=10, headers=headers)
            done += 1
    finally:
        await nc.close()


async def _fill(lab: Lab) -> None:
    await asyncio.gather(*(_start_and_cancel(lab, node, LISTED_PER_NODE) for node in lab.nodes))


def _post_cancel(view: Any, node: str, op: str) -> str:
    """The page's cancel form for a row, then the notice it shows."""
    html = view.page()
    csrf = html.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    answer = view.client.post("/lab/cancel", data={"csrf_token": csrf, "node": node, "operation": op})
    assert answer.status_code == 303
    notice: str = view.page().split('id="notice">', 1)[1].split("</p>", 1)[0]
    return notice


def _start_on_survivor(lab: Lab, node: str, window: int) -> str:
    """`_start` over the surviving server only, retried while the node is still reconnecting.

    Keyed, so that a retry joins the first admission (CONTRACT §4): core NATS delivers at most once, and a
    request or its reply in flight while the node fails over to the survivor can be lost (a timeout).
    """
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    survivor = lab.servers[1].url
    deadline = time.monotonic() + 30
    body = {"directive": scan_directive(window, key=f"survivor-{node}-{time.time_ns()}")}
    while True:
        try:
            reply = request(
                survivor, lab.seeds["caller"], _subjects(node).ops.start, body, lab.nodes[node].caller
            )
            return str(reply["op"])
        except (NoRespondersError, NatsTimeout):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # real peer: the node is reconnecting to the surviving server


def test_discovery_shows_every_node_with_its_metadata_and_counters(lab: Lab) -> None:
    pings = gather(lab.urls, lab.seeds["sniffer"], "$SRV.PING.sensorium-os")
    nodes = {p["metadata"]["node"]: p["metadata"] for p in pings}
    assert sorted(nodes) == ["a", "b", "c"]
    for metadata in nodes.values():
        assert set(metadata) == {"node", "version", "transports", "adapters"}
        assert metadata["transports"] == "ble,mdns,usb-serial"
    html, _ = wait_page(lab.view, lambda h: len(page_lines(h)) == 3, timeout=10)
    assert all("reachable" in line and "v0.1.0" in line for line in page_lines(html).values())

    def op_get_requests() -> int:
        [stats] = [
            s
            for s in gather(lab.urls, lab.seeds["sniffer"], "$SRV.STATS.sensorium-os")
            if s["endpoints"][0]["subject"].startswith("sensorium-os.a.")
        ]
        return int(next(e["num_requests"] for e in stats["endpoints"] if e["name"] == "op-get"))

    before = op_get_requests()
    calls: list[tuple[str, Mapping[str, Any], str | None]] = [
        (_subjects("a").ops.get, {"op": f"nothing-{n}"}, lab.nodes["a"].caller) for n in range(3)
    ]
    assert all(r["state"] == "unknown" for r in requests(lab.urls, lab.seeds["caller"], calls))
    assert op_get_requests() == before + 3


def test_three_times_a_hundred_operations_listed_with_filters(lab: Lab) -> None:
    asyncio.run(_fill(lab))

    for node in "abc":
        wait_page(
            lab.view, lambda h: page_total(h) >= LISTED_PER_NODE, timeout=30, node=node, status="cancelled"
        )
    rows = all_rows(lab.view)
    assert len({(r.node, r.operation_id) for r in rows}) == len(rows) >= 3 * LISTED_PER_NODE
    assert {r.node for r in rows} == {"a", "b", "c"}
    only_b = page_rows(lab.view.page(node="b"))
    assert only_b and {r.node for r in only_b} == {"b"}
    cancelled_c = page_rows(lab.view.page(node="c", status="cancelled"))
    assert len(cancelled_c) >= LISTED_PER_NODE and {(r.node, r.status) for r in cancelled_c} == {
        ("c", "cancelled")
    }
    assert page_rows(lab.view.page(status="expired")) == []


def test_admin_list_answers_what_the_http_admin_list_answers(lab: Lab) -> None:
    node = lab.nodes["b"]
    for _ in range(6):  # enough for two pages of 5, whichever tests ran before on the module's lab
        _start(lab, "b", window=1)
    subject = _subjects("b").admin_list
    over_bus = request(lab.urls, lab.seeds["sniffer"], subject, {"limit": 5}, node.operator)
    over_http = httpx.get(
        node.base_url + "/v1/admin/deferred-operations",
        params={"limit": 5},
        headers={"Authorization": f"Bearer {node.operator}"},
    ).json()
    assert over_bus == over_http and len(over_bus["operations"]) == 5 and over_bus["next_after"]
    following = request(
        lab.urls, lab.seeds["sniffer"], subject, {"after": over_bus["next_after"]}, node.operator
    )
    assert not {r["operation/id"] for r in following["operations"]} & {
        r["operation/id"] for r in over_bus["operations"]
    }
    for token, code in ((None, "unauthenticated"), ("wrong", "unauthenticated"), (node.caller, "forbidden")):
        refused = request(lab.urls, lab.seeds["sniffer"], subject, {}, token)
        assert list(refused) == ["error"] and refused["error"]["code"] == code
    too_many = request(lab.urls, lab.seeds["sniffer"], subject, {"limit": 201}, node.operator)
    assert too_many["error"]["code"] == "invalid-input"
    cancel = request(
        lab.urls, lab.seeds["sniffer"], _subjects("b").admin_cancel, {"operation/id": "nope"}, node.operator
    )
    assert cancel["error"]["code"] == "unknown-operation"


def test_the_view_answers_a_foreign_host_421_as_serve_does(lab: Lab) -> None:
    """The view's HTTP server has serve's edge (CONTRACT §8): a DNS-rebinding `Host` reads nothing."""
    port = httpx.URL(lab.view.base_url).port
    foreign = httpx.get(lab.view.base_url + "/lab/sign-in", headers={"Host": f"rebind.evil.example:{port}"})
    assert foreign.status_code == 421 and foreign.json()["code"] == "misdirected-request"
    assert httpx.get(lab.view.base_url + "/lab/sign-in").status_code == 200


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_the_page_in_chromium_at_1280_and_390_px(lab: Lab) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    running = [_start(lab, "b", window=60), _start(lab, "c", window=60)]
    base = lab.view.base_url
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                page = browser.new_page(viewport=DESKTOP, java_script_enabled=False)
                page.goto(f"{base}/lab")
                assert page.url == f"{base}/lab/sign-in"
                page.fill("#token", lab.lab_operator)
                page.click("#sign-in")
                assert page.url == f"{base}/lab"
                cookie = next(c for c in page.context.cookies() if c["name"] == "sensorium_lab")
                assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/lab"
                page.wait_for_selector(
                    f'tr[data-operation="{running[1]}"][data-status="running"]', timeout=10000
                )
                assert page.locator("#nodes li.reachable").count() == 3
                _shoot(page, "lab-1280.png")
                page.select_option("#node", "b")
                page.click("#filter")
                assert page.url == f"{base}/lab?node=b&status="
                assert set(
                    page.eval_on_selector_all(
                        "#operations tr[data-node]", "rows => rows.map(r => r.dataset.node)"
                    )
                ) == {"b"}
                page.goto(f"{base}/lab")
                page.set_viewport_size(PHONE)
                page.reload()
                assert not page.evaluate(
                    "document.documentElement.scrollWidth > document.documentElement.clientWidth"
                )
                _shoot(page, "lab-390.png")
            finally:
                browser.close()
    finally:
        for node, op in zip(("b", "c"), running, strict=True):
            request(
                lab.urls, lab.seeds["caller"], _subjects(node).ops.cancel, {"op": op}, lab.nodes[node].caller
            )


def _shoot(page: Any, name: str) -> None:
    """A viewport screenshot into test-artifacts/ (docs/lab/ keeps copies for docs/LAB.md)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))
    assert (ARTIFACTS / name).stat().st_size > 0


def test_a_scan_on_node_b_is_seen_running_then_ended(lab: Lab) -> None:
    op = _start(lab, "b", window=3)
    running = lambda h: any(r.operation_id == op and r.status == "running" for r in page_rows(h))  # noqa: E731
    wait_page(lab.view, running, timeout=10, node="b")
    ended = lambda h: any(r.operation_id == op and r.status == "completed" for r in page_rows(h))  # noqa: E731
    wait_page(lab.view, ended, timeout=15, node="b")


def test_a_cancel_from_the_view_reaches_the_owning_node(lab: Lab) -> None:
    op = _start(lab, "c", window=60)
    wait_page(
        lab.view,
        lambda h: any(r.operation_id == op and r.status == "running" for r in page_rows(h)),
        10,
        node="c",
    )
    notice = _post_cancel(lab.view, "c", op)
    # The node answers with the status after the request; its confirmed cancel then reaches the row.
    assert notice in (
        "Cancel forwarded to node c; the node answered: status running, cancellation requested.",
        "Cancel forwarded to node c; the node answered: status cancelled, cancellation confirmed.",
    ), notice
    wait_page(
        lab.view,
        lambda h: any(r.operation_id == op and r.status == "cancelled" for r in page_rows(h)),
        10,
        node="c",
    )
    got = request(lab.urls, lab.seeds["caller"], _subjects("c").ops.get, {"op": op}, lab.nodes["c"].caller)
    assert got["state"] == "cancelled"
    audit = [json.loads(line) for line in (lab.view.data_dir / "audit.jsonl").read_text().splitlines()]
    assert (
        audit[-1]["node"] == "c" and audit[-1]["operation/id"] == op and audit[-1]["operator"] == "lab-alice"
    )
    assert audit[-1]["answer"] == notice.split("answered: ", 1)[1].rstrip(".")


def test_a_cancel_with_a_wrong_or_revoked_token_is_refused_by_the_node(lab: Lab) -> None:
    revoke = subprocess.run(
        cli_argv("principals", "revoke", "--data-dir", lab.nodes["b"].data_dir, "--id", "op-revoked"),
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        timeout=60,
    )
    assert revoke.returncode == 0, revoke.stderr
    tokens = {"a": "not-a-token-of-node-a", "b": lab.nodes["b"].revoked_operator}
    nodes_file = write_nodes_file(lab.root / "wrong-nodes.json", tokens)
    second = start_lab(lab.urls, nodes_file, lab.view.data_dir, lab.seeds["lab"], lab.root / "lab-wrong.log")
    try:
        second.sign_in(lab.lab_operator)
        refused = lambda h: all("listing refused: unauthenticated" in page_lines(h).get(n, "") for n in "ab")  # noqa: E731
        wait_page(second, refused, timeout=10)
        for node, refusal in (("a", "unauthenticated"), ("b", "unauthenticated")):
            op = _start(lab, node, window=60)
            notice = _post_cancel(second, node, op)
            assert notice == f"Cancel forwarded to node {node}; the node answered: refused {refusal}.", notice
            got = request(
                lab.urls, lab.seeds["caller"], _subjects(node).ops.get, {"op": op}, lab.nodes[node].caller
            )
            assert got["state"] == "running"  # nothing changed
            request(
                lab.urls, lab.seeds["caller"], _subjects(node).ops.cancel, {"op": op}, lab.nodes[node].caller
            )
    finally:
        second.stop()


def test_a_duplicate_node_name_is_refused(lab: Lab, tmp_path: Path) -> None:
    argv = cli_argv("serve", "--simulate", "--port", "0", "--data-dir", tmp_path / "dup", "--nats", lab.urls)
    argv += ["--node", "b", "--nats-creds", str(lab.seeds["node-b"])]
    result = subprocess.run(argv, cwd=REPO, env=cli_env(), capture_output=True, timeout=60)
    assert result.returncode == 2
    assert b"node b is already served on this NATS system" in result.stderr


def test_the_permissions_refuse_what_they_should(lab: Lab) -> None:
    caller = violations(
        lab.urls, lab.seeds["caller"], subscribe=[">", "sensorium-os.a.op.start", "sensorium-os.b.admin.list"]
    )
    assert len(caller) == 3 and all("permissions violation" in e for e in caller)
    node = violations(
        lab.urls, lab.seeds["node-a"], publish=["sensorium-os.b.op.done"], subscribe=["sensorium-os.b.op.get"]
    )
    assert len(node) == 2 and all("permissions violation" in e for e in node)
    view = violations(
        lab.urls, lab.seeds["lab"], publish=["sensorium-os.a.op.start"], subscribe=["sensorium-os.a.op.get"]
    )
    assert len(view) == 2


def test_one_nats_server_killed_nodes_and_view_reconnect_to_the_other(lab: Lab) -> None:
    before = {(r.node, r.operation_id) for r in all_rows(lab.view)}
    lab.servers[0].kill()  # not restarted: the survivor carries the rest of the module
    op = _start_on_survivor(lab, "c", window=1)
    done = lambda h: any(r.operation_id == op and r.status == "completed" for r in page_rows(h))  # noqa: E731
    html, _ = wait_page(lab.view, done, timeout=30, node="c")
    assert before <= {(r.node, r.operation_id) for r in all_rows(lab.view)}  # nothing lost
    assert not any("unreachable" in line for line in page_lines(html).values())


def test_a_node_killed_mid_scan_turns_unreachable_and_reports_its_restart(lab: Lab) -> None:
    node = lab.nodes["a"]
    op = _start(lab, "a", window=60)
    wait_page(
        lab.view,
        lambda h: any(r.operation_id == op and r.status == "running" for r in page_rows(h)),
        10,
        node="a",
    )
    assert node.process is not None
    node.process.kill9()
    killed, killed_at = time.monotonic(), datetime.now(UTC)
    html, _ = wait_page(
        lab.view, lambda h: "unreachable since" in page_lines(h).get("a", ""), timeout=15, node="a"
    )
    assert time.monotonic() - killed <= 10 + 1.5  # the 10 s rule, plus one ping interval and a page read
    # Recorded state: silent since T (its last answer), which came before the kill: shown by kill + 10 s.
    since = re.search(r"unreachable since (\S+)", page_lines(html)["a"])
    assert since is not None and datetime.fromisoformat(since.group(1).replace("Z", "+00:00")) <= killed_at
    row = next(r for r in page_rows(html) if r.operation_id == op)
    assert row.unreachable and row.status == "running"  # kept, marked; the view ends nothing itself
    # The others keep updating meanwhile.
    other = _start(lab, "b", window=1)
    wait_page(
        lab.view,
        lambda h: any(r.operation_id == other and r.status == "completed" for r in page_rows(h)),
        15,
        node="b",
    )
    node.start()
    back = time.monotonic()
    interrupted = lambda h: any(  # noqa: E731
        r.operation_id == op and "interrupted-by-restart" in r.outcome and not r.unreachable
        for r in page_rows(h)
    )
    try:
        wait_page(lab.view, interrupted, timeout=10, node="a")
        assert time.monotonic() - back <= 5
    finally:
        node.process.stop()  # the restarted process is this test's child


def test_no_candidate_data_on_any_subject_nor_in_the_audit(lab: Lab) -> None:
    sniffed = lab.sniffed.read_text(encoding="utf-8")
    assert '"sensorium-os.b.op.done"' in sniffed and "sensorium-os.a.admin.list" in sniffed  # it did listen
    audit = (lab.view.data_dir / "audit.jsonl").read_text(encoding="utf-8")
    for canary in lab.canaries:
        assert canary not in sniffed
        assert canary not in audit
    for line in audit.splitlines():
        assert set(json.loads(line)) == {"at", "operator", "node", "operation/id", "action", "answer"}
