"""`sensorium-connector schema validate`: exit 0 valid, 1 with one `path: rule` a line, 2 on usage errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from connector.cli.main import main
from tests.contract.vectors import VECTOR_DIR

REPO = VECTOR_DIR.parents[1]
STATUS_V2 = "deferred-operation-status.v2"
V2_VECTORS = VECTOR_DIR / STATUS_V2
# `path: keyword[, keyword]` for a structural failure; `path: rule` or `path: rule (keyword)` for a rule.
LINE = re.compile(r"^/[^ ]*: [a-zA-Z][a-zA-Z0-9-]*(, [a-zA-Z]+)*( \([a-zA-Z, ]+\))?$")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["schema", "validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _write(tmp_path: Path, content: str | bytes) -> str:
    path = tmp_path / "input.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def test_valid_document_exits_0_silently(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, STATUS_V2, str(V2_VECTORS / "valid" / "completed-window.json")) == (0, "", "")


def test_valid_poll_sequence_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, STATUS_V2, str(V2_VECTORS / "valid" / "polls-until-completed.json"))[0] == 0


def test_invalid_document_exits_1_with_one_reason_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, STATUS_V2, str(V2_VECTORS / "invalid" / "completed-cleanup-pending.json"))
    assert (code, out, err) == (1, "/cleanup/state: completed-cleanup-confirmed\n", "")


def test_invalid_poll_sequence_names_the_poll(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, STATUS_V2, str(V2_VECTORS / "invalid" / "polls-running-after-completed.json"))
    assert code == 1
    assert out.splitlines() == ["/2/status: terminal-is-final"]


def test_every_reason_line_is_a_path_and_a_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = {"schema": STATUS_V2, "schema/v": 3, "status": "completed", "retry_after_seconds": 1.5}
    code, out, _ = _run(capsys, STATUS_V2, _write(tmp_path, json.dumps(document)))
    assert code == 1
    lines = out.splitlines()
    assert len(lines) >= 5 and all(LINE.match(line) for line in lines)
    assert "/retry_after_seconds: retry-after-only-non-terminal" in lines


@pytest.mark.parametrize(
    ("schema", "content", "reason"),
    [
        ("deferred-operation-status.v9", "{}", "unknown schema"),
        (STATUS_V2, '{"schema": ', "not valid JSON"),
        (STATUS_V2, "", "not valid JSON"),
        (STATUS_V2, '{"a": NaN}', "NaN"),
        (STATUS_V2, '{"a": 1, "a": 2}', "repeats a key"),
        (STATUS_V2, b"\xff\xfe{}", "not UTF-8"),
        (STATUS_V2, "[]", "empty array"),
        ("sensorium-error.v1", "[{}, {}]", "only accepted for status schemas"),
    ],
)
def test_usage_errors_exit_2_with_one_line_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: str, content: str | bytes, reason: str
) -> None:
    code, out, err = _run(capsys, schema, _write(tmp_path, content))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and reason in err


def test_unreadable_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, STATUS_V2, str(tmp_path / "missing.json"))[0] == 2
    assert _run(capsys, STATUS_V2, str(tmp_path))[0] == 2


def test_missing_arguments_are_an_argparse_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["schema", "validate", STATUS_V2])
    assert raised.value.code == 2


@pytest.mark.realtime  # a `python -m connector` process
@pytest.mark.timeout(60)
def test_python_dash_m_connector_runs_the_same_command(tmp_path: Path) -> None:
    invalid = V2_VECTORS / "invalid" / "snapshot-over-max-bytes.json"
    valid = V2_VECTORS / "valid" / "polls-until-cancelled.json"
    command = [sys.executable, "-m", "connector", "schema", "validate", STATUS_V2]
    bad = subprocess.run([*command, str(invalid)], cwd=tmp_path, capture_output=True, text=True, timeout=50)
    good = subprocess.run([*command, str(valid)], cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert (bad.returncode, bad.stdout, bad.stderr) == (1, "/progress/snapshot: snapshot-max-bytes\n", "")
    assert (good.returncode, good.stdout) == (0, "")


def test_reasons_name_the_path_and_the_failing_keyword(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secret = "CANARY-4f1d"
    valid = VECTOR_DIR / "sensorium-directive.v1" / "valid" / "discovery-scan-ble.json"
    directive = json.loads(valid.read_text())
    del directive["input"]  # required
    directive["timing"]["mode"] = secret  # enum
    directive["timing"]["timeout_ms"] = 2**60  # maximum
    directive[secret] = secret  # additionalProperties (reported at its object, never by name)
    code, out, _ = _run(capsys, "sensorium-directive.v1", _write(tmp_path, json.dumps(directive)))
    assert code == 1
    assert out.splitlines() == [
        "/: additionalProperties",
        "/input: required",
        "/timing/mode: enum",
        "/timing/timeout_ms: maximum",
    ]
    assert secret not in out


def test_reasons_name_semantic_rules(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = json.loads((V2_VECTORS / "valid" / "completed-window.json").read_text())
    status["retry_after_seconds"] = 5  # only on non-terminal statuses: named by its rule
    code, out, _ = _run(capsys, STATUS_V2, _write(tmp_path, json.dumps(status)))
    assert (code, out) == (1, "/retry_after_seconds: retry-after-only-non-terminal\n")
