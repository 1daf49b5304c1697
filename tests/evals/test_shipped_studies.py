"""The shipped grid studies (studies/cpu-grid, studies/cpu-grid-probe) are what ``python -m
evals.analyze`` makes of their shipped results files, byte for byte: report.md, report.html,
summary.json and every figure (none of them carries a time stamp). A change to the analysis that
moves a shipped number fails here until the studies are regenerated with the new code."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.analyze import main

STUDIES = Path(__file__).resolve().parents[2] / "studies"
CELLS = ("retail-q4-scripted-k10", "retail-q3-scripted-k10")
ARGUMENTS = [
    *(f"{cell}/{mode}/results.json" for cell in CELLS for mode in ("off", "reflexive")),
    *("--pair", "retail-q4-scripted-k10/off", "retail-q4-scripted-k10/reflexive"),
    *("--pair", "retail-q3-scripted-k10/off", "retail-q3-scripted-k10/reflexive"),
    *("--pair", "retail-q4-scripted-k10/off", "retail-q3-scripted-k10/off"),
    *("--pair", "retail-q4-scripted-k10/reflexive", "retail-q3-scripted-k10/reflexive"),
    *("--title", "repair ablation: cpu"),
]


@pytest.mark.parametrize("study", ["cpu-grid", "cpu-grid-probe"])
def test_the_shipped_grid_analysis_is_what_its_results_rederive(
    study: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = STUDIES / study
    monkeypatch.chdir(folder)  # the README's command runs from the study's folder
    out = tmp_path / "analysis"
    assert main([*ARGUMENTS, "--out", str(out)]) in (0, None)
    shipped = sorted(p.name for p in (folder / "analysis").iterdir())
    assert sorted(p.name for p in out.iterdir()) == shipped
    for name in shipped:
        assert (out / name).read_bytes() == (folder / "analysis" / name).read_bytes(), name
