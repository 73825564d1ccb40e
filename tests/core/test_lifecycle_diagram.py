"""The lifecycle diagram in docs/ARCHITECTURE.md is the one the table draws."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from connector.core.lifecycle import TERMINAL_STATUSES, TRANSITIONS, mermaid
from connector.diagrams import main

BEGIN, END = "<!-- lifecycle:begin -->", "<!-- lifecycle:end -->"


def _doc_block(repo_root: Path) -> str:
    text = (repo_root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    match = re.fullmatch(r"\s*```mermaid\n(.*?)```\s*", block, flags=re.DOTALL)
    assert match is not None, "the lifecycle block must hold exactly one ```mermaid fence"
    return match.group(1)


def test_doc_block_equals_generated_diagram(repo_root: Path) -> None:
    assert _doc_block(repo_root) == mermaid(), "run: python -m connector.diagrams lifecycle"


def test_diagram_draws_every_edge_and_end() -> None:
    diagram = mermaid()
    assert diagram.startswith("stateDiagram-v2\n")
    assert "    [*] --> pending\n" in diagram
    edges = re.findall(r"^    (\w+) --> (\w+): (\w+)", diagram, flags=re.MULTILINE)
    table = {
        (s.value.replace("-", "_"), n.value.replace("-", "_"), e.value)
        for s, moves in TRANSITIONS.items()
        for e, n in moves.items()
    }
    assert set(edges) == table
    assert len(edges) == len(table)
    for status in TERMINAL_STATUSES:
        assert f"    {status.value.replace('-', '_')} --> [*]\n" in diagram
    assert '    state "timed-out" as timed_out\n' in diagram


@pytest.mark.realtime  # a `python -m` subprocess
def test_module_prints_the_diagram(repo_root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "connector.diagrams", "lifecycle"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=repo_root,
    )
    assert out.stdout == mermaid()


@pytest.mark.parametrize("argv", [[], ["states"]])
def test_main_without_a_known_diagram_is_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(argv)
    assert usage.value.code == 2
