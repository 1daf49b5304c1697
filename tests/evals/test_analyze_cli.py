"""``python -m evals.analyze`` end to end on τ²-bench-shaped files: what it writes, its numbers."""

from __future__ import annotations

import base64
import gc
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evals.analysis.definitions import DEFINITIONS, definitions_markdown
from evals.analyze import analyze, main
from tests.evals.conftest import REPO_ROOT
from tests.evals.fixtures_tau2 import episode, results, write
from tests.evals.fixtures_tau2.scenario import PROVENANCE, build

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _no_nan(value: Any) -> None:
    if isinstance(value, float):
        assert value == value, "NaN in summary.json"
    elif isinstance(value, dict):
        for inner in value.values():
            _no_nan(inner)
    elif isinstance(value, list):
        for inner in value:
            _no_nan(inner)


def test_cli_writes_summary_report_and_plots(tmp_path: Path) -> None:
    off, reflexive = build(tmp_path)
    out = tmp_path / "report"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals.analyze",
            f"q4-off={off}",
            str(reflexive),
            "--pair",
            "q4-off",
            "retail/reflexive",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "1 pair(s)" in completed.stdout

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    _no_nan(summary)
    arms = summary["arms"]
    assert set(arms) == {"q4-off", "retail/reflexive"}
    off_arm, rep_arm = arms["q4-off"], arms["retail/reflexive"]
    assert off_arm["success"]["estimate"] == pytest.approx(0.8)
    assert off_arm["success_at_budget"]["3"]["estimate"] == pytest.approx(0.6)
    assert off_arm["success_at_budget"]["4"]["estimate"] == pytest.approx(0.8)
    assert off_arm["channel_rates"]["hallucinated_name"] == pytest.approx(4 / 12)
    assert off_arm["hallucinated_names"] == {"lookup_order": 3, "search_orders": 1}
    assert off_arm["recovery_rate"] == pytest.approx(0.4)
    assert off_arm["provenance"] is None
    assert rep_arm["nl_unjudged_episodes"] == 1
    assert rep_arm["proxy"]["fixed_share"] == 1.0
    assert rep_arm["raw_hallucination_rate"] == pytest.approx(3 / 10)
    assert rep_arm["repair_cost"]["extra_upstream_calls_per_episode"] == pytest.approx(0.6)
    assert rep_arm["recovery_rate"]["value"] == "n/a"
    assert rep_arm["provenance"] == PROVENANCE
    for rate in off_arm["channel_rates"].values():
        assert 0.0 <= rate <= 1.0

    (pair,) = summary["pairs"]
    assert (pair["reference"], pair["compared"]) == ("q4-off", "retail/reflexive")
    assert pair["difference"]["estimate"] == pytest.approx(0.25)
    assert pair["sweep_gap"]["1"]["estimate"] == pytest.approx(0.5)
    assert pair["spearman_names"] == pytest.approx(0.5)
    assert pair["novel_name_share"] == {"novel": 1, "total": 3, "share": pytest.approx(1 / 3)}
    assert pair["tost"]["equivalent"] is False

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "channels.png",
        "differences.png",
        "failed_calls_01.png",
        "names_01_q4-off__vs__retail_reflexive.png",
        "repair_effect.png",
        "sweep_01_q4-off__vs__retail_reflexive.png",
        "task_shift_01.png",
        "tasks_01_q4-off__vs__retail_reflexive.png",
    ]
    for name in pngs:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)

    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "| q4-off |" in markdown and "80.0% [" in markdown and "| 4 of 5 |" in markdown
    assert "n/a (no failed agent call was followed by another)" in markdown
    assert "| q4-off | results.info.user_simulator | user_simulator |" in markdown
    assert "| retail/reflexive | user_simulator | scripted |" in markdown
    assert rep_arm["run_info"]["agent_model"] == "openai/qwen2.5-1.5b-q4"

    page = (out / "report.html").read_text(encoding="utf-8")
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == len(pngs)
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for data in images)
    assert 'src="http' not in page and "<script" not in page  # self-contained


def test_default_pairs_compare_each_cell_off_with_its_other_modes(tmp_path: Path) -> None:
    off, reflexive = build(tmp_path)
    summary = analyze([off, reflexive], None, tmp_path / "out")
    assert [(p.reference, p.compared) for p in summary.pairs] == [
        ("retail/off", "retail/reflexive")
    ]


def test_analyze_leaves_the_cyclic_collector_as_it_found_it(tmp_path: Path) -> None:
    # The analysis freezes its loaded arms for the collector; a caller (the grid runner calls
    # it in process) gets the collector back enabled or not as it was, nothing left frozen.
    off, reflexive = build(tmp_path)
    for enabled in (True, False):
        gc.enable() if enabled else gc.disable()
        try:
            analyze([off, reflexive], None, tmp_path / "out")
            assert gc.isenabled() is enabled
            assert gc.get_freeze_count() == 0
        finally:
            gc.enable()


def test_holm_runs_across_all_pairs_of_a_report(tmp_path: Path) -> None:
    off, reflexive = build(tmp_path)
    failing = results(
        [episode(t, k, [], reward=0.0) for t, k in [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]]
    )
    prompt = write(off.parent.parent / "prompt" / "results.json", failing)
    summary = analyze([off, reflexive, prompt], None, tmp_path / "out")
    by_mode = {p.compared: p for p in summary.pairs}
    assert list(by_mode) == ["retail/prompt", "retail/reflexive"]
    # off vs prompt: 3 discordant one way -> exact McNemar 2/8 = 0.25; off vs reflexive: 1.0.
    assert by_mode["retail/prompt"].mcnemar_p == pytest.approx(0.25)
    assert by_mode["retail/prompt"].mcnemar_p_holm == pytest.approx(0.5)
    assert by_mode["retail/reflexive"].mcnemar_p_holm == pytest.approx(1.0)


def test_same_default_label_is_told_apart_by_agent_model(tmp_path: Path) -> None:
    first = write(
        tmp_path / "a" / "retail" / "off" / "results.json", results([episode("t", 0, [])])
    )
    data = results([episode("t", 0, [])], agent_model="other-model")
    second = write(tmp_path / "b" / "retail" / "off" / "results.json", data)
    summary = analyze([first, second], [], tmp_path / "out")
    assert list(summary.arms) == ["retail/off (openai/qwen2.5-1.5b)", "retail/off (other-model)"]


def test_unknown_pair_label_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    off, reflexive = build(tmp_path)
    code = main([str(off), str(reflexive), "--pair", "nope", "retail/off", "--out", str(tmp_path)])
    assert code == 2
    assert "none of the arms" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2


def _arm_file(root: Path, cell: str, mode: str, outcomes: list[float]) -> Path:
    simulations = [episode(f"t{i % 5}", i // 5, [], reward=r) for i, r in enumerate(outcomes)]
    return write(root / cell / mode / "results.json", results(simulations))


def test_holm_families_are_built_in_by_kind_and_named_in_the_report(tmp_path: Path) -> None:
    q4_off = _arm_file(tmp_path, "q4", "off", [1.0] * 10)
    q8_off = _arm_file(tmp_path, "q8", "off", [0.0] * 4 + [1.0] * 6)
    q4_reflexive = _arm_file(tmp_path, "q4", "reflexive", [0.0] * 3 + [1.0] * 7)
    pairs = [("q4/off", "q8/off"), ("q4/off", "q4/reflexive")]
    summary = analyze([q4_off, q8_off, q4_reflexive], pairs, tmp_path / "out")
    by_pair = {(p.reference, p.compared): p for p in summary.pairs}
    assert by_pair[pairs[0]].family == "precision cells at mode off"
    assert by_pair[pairs[1]].family == "repair-mode comparisons"
    for pair in summary.pairs:  # alone in its family: Holm leaves its p as it is
        assert pair.mcnemar_p_holm == pair.mcnemar_p
    data = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert set(data["holm_families"]) == {"precision cells at mode off", "repair-mode comparisons"}
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "## Holm families" in markdown and "| precision cells at mode off |" in markdown


def test_holm_families_from_patterns_pool_what_they_match(tmp_path: Path) -> None:
    q4_off = _arm_file(tmp_path, "q4", "off", [1.0] * 10)
    q8_off = _arm_file(tmp_path, "q8", "off", [0.0] * 4 + [1.0] * 6)
    q4_reflexive = _arm_file(tmp_path, "q4", "reflexive", [0.0] * 3 + [1.0] * 7)
    pairs = [("q4/off", "q8/off"), ("q4/off", "q4/reflexive")]
    families = {"all of it": ["* vs *"]}
    summary = analyze([q4_off, q8_off, q4_reflexive], pairs, tmp_path / "out", families=families)
    assert [p.family for p in summary.pairs] == ["all of it", "all of it"]
    # 4 and 3 discordant pairs one way: exact McNemar 1/8 and 1/4; Holm: 2/8 and 2/8.
    assert [p.mcnemar_p for p in summary.pairs] == pytest.approx([0.125, 0.25])
    assert [p.mcnemar_p_holm for p in summary.pairs] == pytest.approx([0.25, 0.25])


def test_amplification_is_in_summary_json(tmp_path: Path) -> None:
    off, reflexive = build(tmp_path)
    analyze([off, reflexive], None, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    (pair,) = data["pairs"]
    assert set(pair["amplification"]) == {
        "hallucinated_name",
        "user_side_tool",
        "argument",
        "entity_not_found",
        "other",
        "any",
    }
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "## Amplification" in markdown


def test_duplicate_episodes_are_left_out_of_pairing_and_said(tmp_path: Path) -> None:
    twice = [episode("t0", 0, []), episode("t0", 0, [], reward=0.0), episode("t1", 0, [])]
    first = write(tmp_path / "c" / "off" / "results.json", results(twice))
    second = _arm_file(tmp_path, "c", "reflexive", [1.0, 1.0])
    summary = analyze([first, second], None, tmp_path / "out")
    (pair,) = summary.pairs
    assert pair.paired == 2 and pair.duplicates_reference == 1
    assert any("1 repeated (task, trial) episode" in note for note in summary.notes)


def test_two_files_outside_a_grid_layout_are_compared_by_default(tmp_path: Path) -> None:
    first = write(tmp_path / "a.json", results([episode("t", 0, []), episode("u", 0, [])]))
    data = results([episode("t", 0, []), episode("u", 0, [])], agent_model="other-model")
    second = write(tmp_path / "b.json", data)
    summary = analyze([f"a={first}", f"b={second}"], None, tmp_path / "out")
    assert [(p.reference, p.compared) for p in summary.pairs] == [("a", "b")]
    assert summary.notes[0].startswith("No grid layout: the two files are compared, a as")


def test_labels_come_from_the_path_as_given_not_the_symlink_target(tmp_path: Path) -> None:
    real = write(
        tmp_path / "runs" / "cell" / "off" / "results.json", results([episode("t", 0, [])])
    )
    (tmp_path / "q4").mkdir()
    (tmp_path / "q8").mkdir()
    (tmp_path / "q4" / "off").symlink_to(real.parent, target_is_directory=True)
    (tmp_path / "q8" / "off").symlink_to(real.parent, target_is_directory=True)
    paths = [tmp_path / "q4" / "off" / "results.json", tmp_path / "q8" / "off" / "results.json"]
    summary = analyze(paths, [], tmp_path / "out")
    assert list(summary.arms) == ["q4/off", "q8/off"]


def test_the_docs_and_the_report_carry_one_definitions_text(tmp_path: Path) -> None:
    page = (REPO_ROOT / "docs" / "reference" / "definitions.md").read_text(encoding="utf-8")
    assert definitions_markdown() in page
    off, reflexive = build(tmp_path)
    analyze([off, reflexive], None, tmp_path / "out")
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    for term, text in DEFINITIONS:  # a table cell escapes the pipes of |delta|
        assert f"| {term} | {text.replace('|', chr(92) + '|')} |" in markdown
