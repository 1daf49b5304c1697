"""The shipped grid studies (studies/cpu-grid, studies/cpu-grid-probe, studies/cpu-vllm) are
what ``python -m evals.analyze`` makes of their shipped results files, byte for byte: report.md,
report.html, summary.json and every figure (none of them carries a time stamp). A change to the
analysis that moves a shipped number fails here until the studies are regenerated with the new
code."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.analyze import main

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def _arguments(reference: str, other: str, title: str) -> list[str]:
    """The README's command for a two-arm study: both arms' cells, each arm off vs reflexive,
    then the arms against each other in each mode."""
    cells = (reference, other)
    return [
        *(f"{cell}/{mode}/results.json" for cell in cells for mode in ("off", "reflexive")),
        *("--pair", f"{reference}/off", f"{reference}/reflexive"),
        *("--pair", f"{other}/off", f"{other}/reflexive"),
        *("--pair", f"{reference}/off", f"{other}/off"),
        *("--pair", f"{reference}/reflexive", f"{other}/reflexive"),
        *("--title", title),
    ]


ARGUMENTS = _arguments("retail-q4-scripted-k10", "retail-q3-scripted-k10", "repair ablation: cpu")
STUDY_ARGUMENTS = {
    "cpu-grid": ARGUMENTS,
    "cpu-grid-probe": ARGUMENTS,
    "cpu-vllm": _arguments(
        "retail-vllm-bf16-scripted-k10", "retail-q4-scripted-k10", "repair ablation: cpu-vllm"
    ),
}


@pytest.mark.parametrize("study", sorted(STUDY_ARGUMENTS))
def test_the_shipped_grid_analysis_is_what_its_results_rederive(
    study: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = STUDIES / study
    monkeypatch.chdir(folder)  # the README's command runs from the study's folder
    out = tmp_path / "analysis"
    assert main([*STUDY_ARGUMENTS[study], "--out", str(out)]) in (0, None)
    shipped = sorted(p.name for p in (folder / "analysis").iterdir())
    assert sorted(p.name for p in out.iterdir()) == shipped
    for name in shipped:
        assert (out / name).read_bytes() == (folder / "analysis" / name).read_bytes(), name
