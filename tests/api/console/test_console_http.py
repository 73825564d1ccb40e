"""The operator console over HTTP (in-process): sign-in, cookie, CSRF, pages, actions, privacy."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from connector.api.console import SESSION_COOKIE, SIGN_IN_COOKIE
from connector.storage.principals import revoke
from tests.api.console.conftest import Console, console_harness, csrf_of

pytestmark = pytest.mark.asyncio

LIST = "/admin/deferred-operations"


def detail_path(op_id: str) -> str:
    return f"{LIST}/{op_id}"


def set_cookie(response: httpx.Response, name: str) -> str:
    """The one Set-Cookie header for `name`."""
    headers = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    assert len(headers) == 1, headers
    return headers[0]


def cookie_attributes(header: str) -> dict[str, str]:
    """Lower-cased attribute names of a Set-Cookie header, with their values."""
    parts = [p.strip() for p in header.split(";")[1:]]
    return {p.partition("=")[0].lower(): p.partition("=")[2] for p in parts}


async def signed_in(console: Console) -> None:
    response = await console.sign_in()
    assert response.status_code == 303 and response.headers["location"] == LIST


async def operation_status(console: Console, op_id: str) -> tuple[str, str | None]:
    """(status, cancellation state) of the registry row."""
    record = await console.host.registry.get(op_id)
    assert record is not None
    return record.status, (record.metadata.get("cancellation") or {}).get("state")


async def wait_running(console: Console, op_id: str) -> None:
    """Until the caller has seen a running status with a candidate."""
    while True:
        status = await console.caller_status(op_id)
        if status["status"] == "running" and status.get("progress"):
            return
        await console.step()  # the replay reveals its candidate


# ---- without a session -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/admin", "/admin/", LIST, f"{LIST}?status=running", detail_path("x")])
async def test_a_browser_without_a_session_is_sent_to_sign_in(tmp_path: Path, path: str) -> None:
    async with console_harness(tmp_path) as console:
        response = await console.client.get(path)
        assert response.status_code == 303
        assert response.headers["location"] == "/admin/sign-in"


async def test_a_post_without_a_session_changes_nothing(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        for action in ("cancel", "poll"):
            response = await console.client.post(f"{detail_path(op_id)}/{action}", data={"csrf_token": "x"})
            assert response.status_code == 303 and response.headers["location"] == "/admin/sign-in"
        assert await operation_status(console, op_id) == ("running", None)
        record = await console.host.registry.get(op_id)
        assert record is not None and record.attempts == 0


async def test_an_unknown_session_cookie_is_sent_to_sign_in(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        console.client.cookies.set(SESSION_COOKIE, "forged-session-id", path="/admin")
        response = await console.client.get(LIST)
        assert response.status_code == 303 and response.headers["location"] == "/admin/sign-in"


# ---- signing in ------------------------------------------------------------------------------------------


async def test_the_sign_in_form_sets_a_strict_nonce_cookie_and_safe_headers(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        response = await console.client.get("/admin/sign-in")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        attributes = cookie_attributes(set_cookie(response, SIGN_IN_COOKIE))
        assert attributes["path"] == "/admin/sign-in" and attributes["samesite"].lower() == "strict"
        assert "httponly" in attributes and "secure" not in attributes
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["x-frame-options"] == "DENY"
        csp = response.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "form-action 'self'" in csp
        assert 'type="password"' in response.text and "<script" not in response.text


async def test_an_operator_signs_in_with_an_httponly_strict_admin_cookie(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        response = await console.sign_in()
        assert response.status_code == 303 and response.headers["location"] == LIST
        header = set_cookie(response, SESSION_COOKIE)
        attributes = cookie_attributes(header)
        assert attributes["path"] == "/admin"
        assert attributes["samesite"].lower() == "strict"
        assert "httponly" in attributes
        assert "secure" not in attributes  # plain http on loopback: a Secure cookie would never come back
        assert "max-age" not in attributes and "expires" not in attributes  # ends with the browser or idle
        session_id = header.split(";")[0].split("=", 1)[1]
        assert len(session_id) >= 43 and console.tokens.operator not in header
        nonce_cleared = cookie_attributes(set_cookie(response, SIGN_IN_COOKIE))
        assert nonce_cleared.get("max-age") == "0"
        page = await console.client.get(LIST)
        assert page.status_code == 200 and "operator-1" in page.text


async def test_a_signed_in_browser_skips_the_form(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        await signed_in(console)
        for path in ("/admin/sign-in", "/admin/", "/admin"):
            response = await console.client.get(path)
            assert response.status_code == 303 and response.headers["location"] == LIST


async def test_a_bad_token_is_refused_without_a_session(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        response = await console.sign_in("not-a-real-token-CANARYtoken")
        assert response.status_code == 401
        assert "not accepted" in response.text
        assert "CANARYtoken" not in response.text
        assert not [h for h in response.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE + "=")]
        assert (await console.client.get(LIST)).status_code == 303


async def test_an_empty_token_is_refused(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        form = await console.client.get("/admin/sign-in")
        response = await console.client.post("/admin/sign-in", data={"csrf_token": csrf_of(form.text)})
        assert response.status_code == 401
        assert (await console.client.get(LIST)).status_code == 303


async def test_a_caller_token_cannot_sign_in(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        response = await console.sign_in(console.tokens.caller)
        assert response.status_code == 403
        assert "callers cannot sign in" in response.text
        assert not [h for h in response.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE + "=")]
        assert (await console.client.get(LIST)).status_code == 303


async def test_a_revoked_operator_cannot_sign_in(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        revoke(console.data_dir, "operator-1")
        response = await console.sign_in()
        assert response.status_code == 401
        assert (await console.client.get(LIST)).status_code == 303


async def test_sign_in_without_the_form_nonce_is_refused(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        bare = await console.client.post("/admin/sign-in", data={"token": console.tokens.operator})
        assert bare.status_code == 403
        await console.client.get("/admin/sign-in")  # the nonce cookie is set, but the field is missing/forged
        for fields in (
            {"token": console.tokens.operator},
            {"token": console.tokens.operator, "csrf_token": "x"},
        ):
            response = await console.client.post("/admin/sign-in", data=fields)
            assert response.status_code == 403
        assert (await console.client.get(LIST)).status_code == 303


async def test_sign_in_from_another_origin_is_refused(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        form = await console.client.get("/admin/sign-in")
        fields = {"csrf_token": csrf_of(form.text), "token": console.tokens.operator}
        response = await console.client.post(
            "/admin/sign-in", data=fields, headers={"Origin": "http://evil.example"}
        )
        assert response.status_code == 403
        assert (await console.client.get(LIST)).status_code == 303


# ---- CSRF ------------------------------------------------------------------------------------------------


async def test_form_posts_without_the_session_csrf_token_are_refused(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await signed_in(console)
        token = await console.csrf(detail_path(op_id))
        forged = [{}, {"csrf_token": ""}, {"csrf_token": token[:-1]}, {"csrf_token": token + "x"}]
        for action in ("cancel", "poll"):
            for fields in forged:
                response = await console.client.post(f"{detail_path(op_id)}/{action}", data=fields)
                assert response.status_code == 403, (action, fields)
                assert "CSRF" in response.text
        as_json = await console.client.post(f"{detail_path(op_id)}/cancel", json={"csrf_token": token})
        assert as_json.status_code == 403
        assert await operation_status(console, op_id) == ("running", None)
        record = await console.host.registry.get(op_id)
        assert record is not None and record.attempts == 0


async def test_a_csrf_token_of_another_session_is_refused(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await signed_in(console)
        other_token = await console.csrf(LIST)
        console.client.cookies.clear()
        await signed_in(console)
        response = await console.client.post(f"{detail_path(op_id)}/cancel", data={"csrf_token": other_token})
        assert response.status_code == 403
        assert await operation_status(console, op_id) == ("running", None)


async def test_a_cross_site_post_is_refused_even_with_the_token(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await signed_in(console)
        token = await console.csrf(detail_path(op_id))
        for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            response = await console.client.post(
                f"{detail_path(op_id)}/cancel", data={"csrf_token": token}, headers=headers
            )
            assert response.status_code == 403
        assert await operation_status(console, op_id) == ("running", None)


async def test_sign_out_needs_the_token_and_ends_the_session(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        await signed_in(console)
        token = await console.csrf(LIST)
        assert (await console.client.post("/admin/sign-out", data={})).status_code == 403
        assert (await console.client.get(LIST)).status_code == 200
        session_id = console.client.cookies.get(SESSION_COOKIE)
        response = await console.client.post("/admin/sign-out", data={"csrf_token": token})
        assert response.status_code == 303 and response.headers["location"] == "/admin/sign-in"
        assert cookie_attributes(set_cookie(response, SESSION_COOKIE)).get("max-age") == "0"
        assert (await console.client.get(LIST)).status_code == 303
        assert session_id is not None
        console.client.cookies.set(SESSION_COOKIE, session_id, path="/admin")  # a replayed old cookie
        assert (await console.client.get(LIST)).status_code == 303


# ---- session lifetime and authority -----------------------------------------------------------------------


async def test_an_idle_session_expires_after_eight_hours(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        await signed_in(console)
        console.clock.offset = timedelta(hours=7)
        assert (await console.client.get(LIST)).status_code == 200
        console.clock.offset = timedelta(hours=14, minutes=59)
        assert (await console.client.get(LIST)).status_code == 200
        console.clock.offset = timedelta(hours=23)
        response = await console.client.get(LIST)
        assert response.status_code == 303 and response.headers["location"] == "/admin/sign-in"


async def test_revoking_the_operator_ends_its_console_session(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        await signed_in(console)
        assert (await console.client.get(LIST)).status_code == 200
        revoke(console.data_dir, "operator-1")
        response = await console.client.get(LIST)
        assert response.status_code == 303 and response.headers["location"] == "/admin/sign-in"
        assert (
            await console.client.get(LIST)
        ).status_code == 303  # the session is gone, not just refused once


# ---- pages -----------------------------------------------------------------------------------------------


async def test_the_list_shows_operations_and_filters_by_status(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await signed_in(console)
        page = await console.client.get(LIST)
        assert page.status_code == 200
        assert op_id in page.text.replace("<wbr>", "")
        assert "device.discovery.scan" in page.text and "caller-1" in page.text
        assert f'href="{LIST}/{op_id.replace(":", "%3A")}"' in page.text
        running = await console.client.get(LIST, params={"status": "running"})
        assert op_id in running.text.replace("<wbr>", "") and 'value="running" selected' in running.text
        completed = await console.client.get(LIST, params={"status": "completed"})
        assert op_id not in completed.text.replace("<wbr>", "") and 'id="no-operations"' in completed.text
        bogus = await console.client.get(LIST, params={"status": "<script>CANARYstatus"})
        assert bogus.status_code == 400 and "CANARYstatus" not in bogus.text


async def test_the_detail_shows_the_durable_fields_and_history_digests(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await wait_running(console, op_id)
        await signed_in(console)
        page = await console.client.get(detail_path(op_id))
        assert page.status_code == 200
        text = page.text
        record = await console.host.registry.get(op_id)
        assert record is not None
        for label in (
            "Status",
            "Kind",
            "Owner",
            "Retry after",
            "Next poll",
            "Expires",
            "Attempts",
            "Cancelable",
        ):
            assert f"<dt>{label}</dt>" in text, label
        assert 'id="status">running</span>' in text
        assert "sensorium.directive.invoke" in text and "caller-1" in text
        assert f"{record.retry_after_seconds} s" in text
        assert record.expires_at.strftime("%Y-%m-%dT%H:%M:%S") in text
        assert '<dd id="cancelability">yes</dd>' in text
        digests = re.findall(r'<td class="mono digest">([0-9a-f]{64})</td>', text)
        history = await console.host.registry.history(op_id)
        assert digests and digests == [event.digest for event in history]
        assert (
            'id="poll-now"' in text
            and 'id="cancel"' in text
            and "disabled" not in text.split('id="cancel"')[1][:20]
        )


async def test_an_unknown_operation_is_a_404_page(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        await signed_in(console)
        response = await console.client.get(detail_path("deferred:sensorium.directive.invoke:CANARYNOSUCHOP"))
        assert response.status_code == 404
        assert response.headers["content-type"].startswith("text/html")
        assert "CANARYNOSUCHOP" not in response.text
        token = await console.csrf(LIST)
        for action in ("poll", "cancel"):
            posted = await console.client.post(
                f"{detail_path('deferred:sensorium.directive.invoke:NOSUCH')}/{action}",
                data={"csrf_token": token},
            )
            assert posted.status_code == 404


async def test_poll_now_polls_and_reports_back(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await signed_in(console)
        token = await console.csrf(detail_path(op_id))
        response = await console.client.post(f"{detail_path(op_id)}/poll", data={"csrf_token": token})
        assert response.status_code == 303 and response.headers["location"] == detail_path(op_id).replace(
            ":", "%3A"
        )
        record = await console.host.registry.get(op_id)
        assert record is not None and record.attempts == 1
        page = await console.client.get(response.headers["location"])
        assert "Poll requested; the host answered: running." in page.text
        again = await console.client.get(response.headers["location"])
        assert 'id="notice"' not in again.text  # shown once


async def test_cancel_goes_through_cancellation_requested_to_cancelled(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await wait_running(console, op_id)
        await signed_in(console)
        token = await console.csrf(detail_path(op_id))
        response = await console.client.post(f"{detail_path(op_id)}/cancel", data={"csrf_token": token})
        assert response.status_code == 303
        page = await console.client.get(response.headers["location"])
        assert "Cancel requested; the host answered: running, cancellation requested." in page.text
        confirm_by_ms = console.timer.now_ms() + 10_000
        while 'id="status">cancelled</span>' not in page.text:
            await console.step(by_ms=confirm_by_ms)  # the runtime confirms the cancel in its own tasks
            await console.client.post(f"{detail_path(op_id)}/poll", data={"csrf_token": token})
            page = await console.client.get(detail_path(op_id))
        assert "cancellation confirmed at" in page.text and "confirmed, claim released" in page.text
        assert re.search(r'id="cancel" disabled', page.text) and re.search(
            r'id="poll-now" disabled', page.text
        )
        cancelled = await console.client.get(LIST, params={"status": "cancelled"})
        assert op_id in cancelled.text.replace("<wbr>", "")


async def test_cancelling_a_finished_operation_changes_nothing(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan(window_seconds=1)
        ends_ms = console.timer.now_ms() + 1000
        while (await console.caller_status(op_id))["status"] != "completed":
            await console.step(by_ms=ends_ms + 1000)  # the scan's 1 s window
        await signed_in(console)
        token = await console.csrf(detail_path(op_id))
        response = await console.client.post(f"{detail_path(op_id)}/cancel", data={"csrf_token": token})
        assert response.status_code == 303
        page = await console.client.get(detail_path(op_id))
        assert "the host answered: completed." in page.text and 'id="status">completed</span>' in page.text


# ---- privacy ----------------------------------------------------------------------------------------------


def forbidden_texts(console: Console) -> list[str]:
    """Canaries and their digests, and the tokens."""
    texts = [console.tokens.operator, console.tokens.caller]
    for canary in console.canaries.all():
        raw = canary.encode()
        texts += [canary, canary.lower(), hashlib.sha256(raw).hexdigest(), hashlib.sha1(raw).hexdigest()]
    return texts


async def test_no_page_shows_candidate_data(tmp_path: Path) -> None:
    async with console_harness(tmp_path) as console:
        op_id = await console.start_scan()
        await wait_running(console, op_id)
        seen = await console.caller_status(op_id)
        labels = [c.get("label") for c in seen["progress"]["snapshot"]["candidates"]]
        assert labels == [console.canaries.name]  # the canary does reach its caller
        pages = [(await console.client.get("/admin/sign-in")).text]
        await signed_in(console)
        token = await console.csrf(detail_path(op_id))
        pages.append((await console.client.get(LIST)).text)
        pages.append((await console.client.get(LIST, params={"status": "running"})).text)
        pages.append((await console.client.get(detail_path(op_id))).text)
        await console.client.post(f"{detail_path(op_id)}/poll", data={"csrf_token": token})
        pages.append((await console.client.get(detail_path(op_id))).text)
        await console.client.post(f"{detail_path(op_id)}/cancel", data={"csrf_token": token})
        pages.append((await console.client.get(detail_path(op_id))).text)
        confirm_by_ms = console.timer.now_ms() + 10_000
        while (await console.caller_status(op_id))["status"] != "cancelled":
            await console.step(by_ms=confirm_by_ms)  # the runtime confirms the cancel in its own tasks
        pages.append((await console.client.get(detail_path(op_id))).text)
        pages.append((await console.client.get(LIST)).text)
        assert all(op_id in page.replace("<wbr>", "") for page in pages[1:])
        for page in pages:
            for text in forbidden_texts(console):
                assert text not in page
            for word in ("candidate/ref", "snapshot", "progress", "continuation", "manufacturer"):
                assert word not in page
