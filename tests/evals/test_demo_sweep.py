"""benchmarks.demo_sweep without a model: the counts line read, the table, ``--task-ids``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import demo_sweep

COUNTS_LINE = (
    "agent answers 4; caught by the proxy: empty_output x1, tool_call_in_content x3; promoted 3; "
    "re-asks 2; invalid answers delivered to the agent 0; tool calls run 3 (1 failed); budget "
    "left 9 of 10"
)


def test_counts_line_read_with_what_was_caught() -> None:
    found = demo_sweep.COUNTS.search(COUNTS_LINE)
    assert found is not None
    got = found.groupdict()
    assert (got["turns"], got["promoted"], got["reasks"]) == ("4", "3", "2")
    assert (got["invalid"], got["ran"], got["failed"]) == ("0", "3", "1")
    caught = {m["channel"]: int(m["count"]) for m in demo_sweep.CAUGHT.finditer(got["caught_by"])}
    assert caught == {"empty_output": 1, "tool_call_in_content": 3}
    none = demo_sweep.COUNTS.search(COUNTS_LINE.replace(got["caught_by"], "none"))
    assert none is not None and not list(demo_sweep.CAUGHT.finditer(none["caught_by"]))


def _row(task: str, mode: str, **counts: Any) -> dict[str, Any]:
    base = {"reward": 0.0, "caught": 0, "ran": 0, "failed": 0, "invalid": 0, "seconds": 10.0}
    return {"domain": "retail", "task": task, "mode": mode, **base, **counts}


def test_table_marks_a_difference_in_calls_caught() -> None:
    rows = [
        _row("80", "off", caught=1),
        _row("80", "reflexive"),
        _row("0", "off"),
        _row("0", "reflexive"),
    ]
    lines = demo_sweep.table(rows).splitlines()
    assert lines[2] == "| retail 80 | 0 · 1 · 0 (0) · 0 · 10 | 0 · 0 · 0 (0) · 0 · 10 | yes |"
    assert lines[3].endswith("| no |")


def test_task_ids_run_in_the_order_named_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, str]] = []

    def fake_run(domain: str, task_id: str, mode: str, out: Path) -> dict[str, Any]:
        ran.append((task_id, mode))
        return _row(task_id, mode, caught=int(task_id == "80" and mode == "off"))

    monkeypatch.setattr(demo_sweep, "run_one", fake_run)
    monkeypatch.setattr(demo_sweep, "resolve_data_dir", lambda *_: tmp_path)
    (tmp_path / "sweep.jsonl").write_text(json.dumps(_row("75", "off")) + "\n")
    rule = "named ones"
    demo_sweep.main(["--task-ids", "75", "80", "--rule", rule, "--out", str(tmp_path)])
    assert ran == [("75", "reflexive"), ("80", "off"), ("80", "reflexive")]
    report = (tmp_path / "sweep.md").read_text()
    assert f'--task-ids 75 80 --rule "{rule}"' in report
    assert f"Tasks: {rule}." in report and "4 runs, 40 s in all" in report
    assert len((tmp_path / "sweep.jsonl").read_text().splitlines()) == 4
