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


def _arguments(reference: str, *others: str, title: str) -> list[str]:
    """The README's command for a study of arms against one reference: every arm's cells, each
    arm off vs reflexive, then the reference against each other arm in each mode."""
    cells = (reference, *others)
    modes = ("off", "reflexive")
    return [
        *(f"{cell}/{mode}/results.json" for cell in cells for mode in modes),
        *(a for cell in cells for a in ("--pair", f"{cell}/off", f"{cell}/reflexive")),
        *(a for o in others for m in modes for a in ("--pair", f"{reference}/{m}", f"{o}/{m}")),
        *("--title", title),
    ]


ARGUMENTS = _arguments(
    "retail-q4-scripted-k10", "retail-q3-scripted-k10", title="repair ablation: cpu"
)
STUDY_ARGUMENTS = {
    "cpu-grid": ARGUMENTS,
    "cpu-grid-probe": ARGUMENTS,
    "cpu-vllm": _arguments(
        "retail-vllm-bf16-scripted-k10",
        "retail-q4-scripted-k10",
        "retail-vllm-w8a8-scripted-k10",
        title="repair ablation: cpu-vllm",
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
