"""The shipped catalog's command actions, taken through `CommandAction.from_catalog` and the runner."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from connector.contract.catalog_models import ActionCatalog
from connector.core.commands import CommandAction
from connector.errors import SensoriumError
from tests.runtime.commands.conftest import running, wait_terminal


def _actions(repo_root: Path) -> dict[str, object]:
    catalog = ActionCatalog.model_validate(json.loads((repo_root / "catalog" / "actions.json").read_text()))
    return {action.action_id: action for action in catalog.actions}


def test_from_catalog(repo_root: Path) -> None:
    actions = _actions(repo_root)
    redact = CommandAction.from_catalog(actions["whisper.redaction.prepare"])  # type: ignore[arg-type]
    assert redact == CommandAction(
        action_id="whisper.redaction.prepare",
        argv=("python3", "-m", "connector.actions.redact"),
        timeout_ms=10000,
        cancel="terminate",
        input="stdin-json",
        execution_mode_support="either",
        retry_after_seconds=1,
        preferred_max_ttl_seconds=120,
    )
    info = CommandAction.from_catalog(actions["sensorium.os.info"])  # type: ignore[arg-type]
    assert (info.execution_mode_support, info.cancelable, info.input) == ("sync-only", False, "none")
    assert info.preferred_max_ttl_seconds is None and info.retry_after_seconds == 1
    with pytest.raises(SensoriumError) as refused:
        CommandAction.from_catalog(actions["device.discovery.scan"])  # type: ignore[arg-type]
    assert refused.value.code == "unknown-action"


@pytest.mark.asyncio
@pytest.mark.realtime  # the catalog's command processes
async def test_catalog_actions_run(tmp_path: Path, repo_root: Path) -> None:
    actions = _actions(repo_root)
    redact = CommandAction.from_catalog(actions["whisper.redaction.prepare"])  # type: ignore[arg-type]
    info = CommandAction.from_catalog(actions["sensorium.os.info"])  # type: ignore[arg-type]
    op = "deferred:sensorium.directive.invoke:"
    async with running(tmp_path) as (_, runner):
        now = datetime.now(UTC)
        sync_info = await runner.submit(op + "A" * 26, "alice", info, {}, "sync", now)
        assert sync_info["status"] == "completed" and isinstance(sync_info["result"]["json"], str)
        with pytest.raises(SensoriumError) as refused:
            await runner.submit(op + "B" * 26, "alice", info, {}, "async", now)
        assert refused.value.code == "execution-mode-not-supported"
        handle = await runner.submit(op + "C" * 26, "alice", redact, {"text": "x@y.io"}, "async", now)
        final = await wait_terminal(runner, handle["connector_operation/id"])
        assert final["result"]["json"]["text"] == "[email]"
        sync_redact = await runner.submit(op + "D" * 26, "alice", redact, {"text": "nope"}, "sync", now)
        assert sync_redact["result"]["json"] == {"text": "nope", "redactions": {"email": 0, "phone": 0}}
        refused_input = await runner.submit(op + "E" * 26, "alice", redact, {"txt": "CANARY"}, "sync", now)
        assert refused_input["status"] == "failed" and refused_input["error"]["code"] == "command-failed"
        assert "CANARY" not in json.dumps(refused_input)
