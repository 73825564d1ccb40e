"""What the CLI tells a person: refusals that name the key and what is allowed, help that lists the filter
keys and defaults, one provider hint for scan and fixtures record, grants checked against a catalog, a
signature refused with a public key, revocations that say what was revoked, no SPEC section numbers."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import pytest

from connector.cli.main import build_parser, main
from connector.cli.scan_help import provider_hint
from connector.cli.scope_forms import scope_input_from_cli
from tests.support.paths import REPO


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--filter", "colour=red"], ['unknown key "colour"', "keys for ble: service_uuid, manufacturer_id"]),
        (["--window", "120", "--filter", "service_uuid=180d"], ["--window: at most 60 s"]),
        ([], ["give at least one --filter", "keys for ble"]),
        (["--filter", "vid_pid=2341:0043"], ["--filter vid_pid: not a ble key"]),
        (["--filter", "manufacturer_id=0xZZ"], ["--filter manufacturer_id: expects", "0x hex"]),
        (["--filter", "min_rssi_dbm=-70", "--filter", "min_rssi_dbm=-60"], ["given twice"]),
        (["--filter", "service_uuid"], ["--filter takes KEY=VALUE"]),
    ],
)
def test_scan_refusals_name_the_key_and_what_is_allowed(
    args: list[str], expected: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    argv = ["scan", "--transport", "ble", "--window", "5", *args]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    for text in expected:
        assert text in err, err
    assert "red" not in err.replace("colour", "")  # never the value


def test_a_pasted_value_as_key_is_not_repeated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    canary = "AA:BB:" + secrets.token_hex(3).upper()
    code, _, err = run(["scan", "--transport", "ble", "--window", "1", "--filter", f"{canary}=1"], capsys)
    assert code == 2 and canary not in err and "unknown key (not shown)" in err


def test_mdns_needs_a_service_type(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code, _, err = run(["scan", "--transport", "mdns", "--window", "1"], capsys)
    assert code == 2 and "mdns needs --filter service_type=TYPE" in err


def test_manufacturer_id_takes_decimal_or_hex() -> None:
    for text in ("89", "0x0059", "0X59"):
        raw = scope_input_from_cli("ble", 1, [f"manufacturer_id={text}"], [], None, None)
        assert raw["filters"]["manufacturer_ids"] == [89]


@pytest.mark.parametrize("transport", ["usb-serial", "mdns"])
def test_adapter_is_ble_only(
    transport: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    code, _, err = run(["scan", "--transport", transport, "--window", "1", "--adapter", "hci0"], capsys)
    assert code == 2 and "--adapter applies to --transport ble only" in err


def test_scan_has_no_ble_adapter_flag_and_serve_has_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["scan", "--transport", "ble", "--window", "1", "--ble-adapter", "hci0"], capsys)
    assert code == 2 and "unrecognized arguments" in err
    serve_help = _help(["serve", "--help"], capsys)
    assert "--ble-adapter NAME" in serve_help and "--simulate" in serve_help


def test_a_missing_replay_file_is_named_with_the_os_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    missing = tmp_path / "nope.jsonl"
    argv = [
        "scan",
        "--transport",
        "ble",
        "--window",
        "1",
        "--filter",
        "service_uuid=180d",
        "--replay",
        str(missing),
    ]
    code, _, err = run(argv, capsys)
    assert code == 2 and str(missing) in err and "No such file or directory" in err


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


def test_scan_help_lists_filter_keys_forms_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["scan", "--help"], capsys)
    for key in (
        "service_uuid",
        "manufacturer_id",
        "name_prefix",
        "min_rssi_dbm",
        "address",
        "vid_pid",
        "serial_number",
        "service_type",
        "instance_prefix",
    ):
        assert re.search(rf"^\s+{key}\s+\S", text, re.M), key
    assert "0x hex" in text and "2341:0043" in text and "180d" in text
    assert "(default: 1.0)" in text and "(default: catalog/actions.json here" in text
    assert "--replay hw-fixtures/ble-heart-rate-lab.jsonl" in text


def test_no_spec_section_numbers_in_any_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = [
        ["scan"],
        ["serve"],
        ["fixtures", "record"],
        ["principals", "add"],
        ["principals", "revoke"],
        ["principals", "list"],
        ["catalog", "sign"],
        ["catalog", "verify"],
        ["catalog", "keygen"],
        ["schema", "validate"],
    ]
    assert "SPEC" not in build_parser().format_help()
    for command in commands:
        text = _help([*command, "--help"], capsys)
        assert not re.search(r"SPEC\s*\d", text), command


def test_the_provider_hint_points_at_the_usual_checks() -> None:
    hint = provider_hint("ble")
    for needle in ("bluetoothctl show", "rfkill", "D-Bus policy", "--replay hw-fixtures/"):
        assert needle in hint


def test_principals_add_checks_grants_against_a_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = str(REPO / "catalog" / "actions.json")
    data = str(tmp_path / "d")
    code, out, err = run(
        [
            "principals",
            "add",
            "--data-dir",
            data,
            "--id",
            "a",
            "--role",
            "caller",
            "--grant",
            "no.such.action",
            "--catalog",
            catalog,
        ],
        capsys,
    )
    assert code == 2 and out == "" and "has no action no.such.action" in err
    assert not (tmp_path / "d" / "principals.json").exists()
    ok = ["principals", "add", "--data-dir", data, "--id", "a", "--role", "caller", "--grant"]
    assert run([*ok, "device.discovery.scan", "--catalog", catalog], capsys)[0] == 0
    monkeypatch.chdir(REPO)
    code, out, err = run([*ok[:5], "b", *ok[6:], "no.such.action"], capsys)
    assert code == 0 and "warning" in err and "no.such.action" in err
    monkeypatch.chdir(tmp_path)
    code, out, err = run([*ok[:5], "c", *ok[6:], "device.discovery.scan"], capsys)
    assert code == 0 and "not checked against a catalog" in err


def test_revocations_say_what_was_revoked_and_list_has_a_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "d")
    base = ["--data-dir", data]
    run(
        [
            "principals",
            "add",
            *base,
            "--id",
            "alice",
            "--role",
            "caller",
            "--grant",
            "device.discovery.scan",
            "--grant",
            "sensorium.os.info",
        ],
        capsys,
    )
    run(["principals", "add", *base, "--id", "root", "--role", "operator"], capsys)
    _, out, _ = run(["principals", "revoke", *base, "--id", "alice", "--grant", "sensorium.os.info"], capsys)
    assert out.strip() == "revoked the grant for sensorium.os.info of principal alice"
    _, out, _ = run(["principals", "revoke", *base, "--id", "root"], capsys)
    assert out.strip() == "revoked principal root: its token no longer authenticates"
    _, out, _ = run(["principals", "revoke", *base, "--id", "alice"], capsys)
    assert "revoked principal alice" in out and "device.discovery.scan" in out
    _, out, _ = run(["principals", "list", *base], capsys)
    assert out.splitlines()[0] == "id\trole\tstate\tgrants"


def test_catalog_sign_refuses_a_public_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(["catalog", "keygen", "--out", str(tmp_path / "k")], capsys)
    public = next((tmp_path / "k").glob("*.pub"))
    catalog = tmp_path / "actions.json"
    catalog.write_bytes((REPO / "catalog" / "actions.json").read_bytes())
    code, _, err = run(["catalog", "sign", str(catalog), "--key", str(public)], capsys)
    assert code == 2 and "is a public key" in err and not catalog.with_name("actions.json.sig").exists()
    renamed = tmp_path / "k" / f"{public.stem}.secret"
    renamed.write_bytes(public.read_bytes())
    code, _, err = run(["catalog", "sign", str(catalog), "--key", str(renamed)], capsys)
    assert code == 2 and "holds the public key" in err
    private = public.with_suffix(".key")
    assert run(["catalog", "sign", str(catalog), "--key", str(private)], capsys)[0] == 0


def test_serve_names_a_bad_replay_file_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "gone.jsonl"
    code, _, err = run(["serve", "--data-dir", str(tmp_path / "d"), "--replay", f"ble={missing}"], capsys)
    assert code == 2 and f"--replay ble={missing}: No such file or directory" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        '{"fixture": "sensorium-hw-fixture.v1", "transport": "ble", "source": "synthesised"}\n{"t_ms": 1}\n'
    )
    code, _, err = run(["serve", "--data-dir", str(tmp_path / "d"), "--replay", f"ble={broken}"], capsys)
    assert code == 2 and "line 2: /rssi: required" in err
