"""The report's size does not grow with the grid beyond its bound: on a synthetic grid of 12
cells (36 arms, 24 pairs: more than a page of arms, of cells and of pairs' name plots) every
figure stays within a page's pixels, paged figures come in pages, and report.html stays under
the paper grid's budget per cell (2 MB for 24 cells). Sizes only; the benchmark prints times."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from benchmarks.report_scale import png_size, write_grid
from evals.analysis import parallel
from evals.analysis.summary import build_summary, default_pairs, load_arm
from evals.analyze import PARALLEL_FILES, analyze
from evals.report import pages as report_pages
from evals.report import plots

PAPER_CELLS = 24
PAPER_HTML_BYTES = 2_000_000
MAX_WIDTH = 720  # 9 inches at the pages' 80 dpi
MAX_HEIGHT = 1_000  # a 24-row page is 726 px


def test_the_reports_figures_and_html_stay_bounded_as_cells_grow(tmp_path: Path) -> None:
    modes = ("off", "prompt", "reflexive")
    paths = write_grid(
        tmp_path / "runs",
        models=("m1", "m2"),
        precisions=("bf16", "fp8", "int4"),
        modes=modes,
        tasks=3,
        trials=2,
    )
    cells = len(paths) // len(modes)
    assert cells == 12
    out = tmp_path / "report"
    summary = analyze(paths, None, out, "scale")
    assert len(summary.arms) == 36 and len(summary.pairs) == 24

    pngs = sorted(out.glob("*.png"))
    sizes = {png.name: png_size(png) for png in pngs}
    too_big = {n: s for n, s in sizes.items() if s[0] > MAX_WIDTH or s[1] > MAX_HEIGHT}
    assert not too_big, too_big

    def count(prefix: str) -> int:
        return sum(1 for name in sizes if re.fullmatch(rf"{prefix}(_\d\d)?\.png", name))

    arm_pages = math.ceil(36 / plots.PAGE_ROWS)
    assert count("channels") == arm_pages == 2
    assert sum(1 for n in sizes if n.startswith("failed_calls_")) == arm_pages
    assert count("repair_effect") == math.ceil(cells / plots.CELLS_PER_PAGE) == 2
    assert count("differences") == 1
    sweeps = math.ceil(cells / plots.CELLS_PER_PAGE)  # a page of cells, not one per pair
    assert sum(1 for n in sizes if n.startswith("sweep_")) == sweeps == 2
    assert not any(n.startswith(("names_", "tasks_")) for n in sizes)  # past 8 pairs: tables

    html_bytes = (out / "report.html").stat().st_size
    assert html_bytes <= cells * PAPER_HTML_BYTES / PAPER_CELLS, html_bytes
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert markdown.index("## Definitions") < markdown.index("## Appendix: provenance")
    assert markdown.rstrip().rfind("## ") == markdown.index("## Appendix: provenance")


def test_figures_drawn_by_worker_processes_are_the_same_bytes(tmp_path: Path) -> None:
    paths = write_grid(
        tmp_path / "runs", models=("m1",), precisions=("bf16", "int4"), tasks=3, trials=2
    )
    arms = [load_arm(p) for p in paths]
    summary = build_summary(arms, default_pairs(arms))
    arms_list = list(summary.arms.values())

    def jobs(folder: Path) -> list[report_pages.Job]:
        folder.mkdir()
        return [
            ("c", plots.channel_rates_page, (arms_list[:5], folder / "c.png", "c")),
            ("f", plots.failed_calls_page, (arms_list, folder / "f.png", "f")),
            ("d", plots.differences_page, (summary.pairs, folder / "d.png", "d")),
            ("none", plots.differences_page, ([], folder / "none.png", "none")),
        ]

    here = report_pages.draw_figures(jobs(tmp_path / "here"), workers=1)
    forked = report_pages.draw_figures(jobs(tmp_path / "forked"), workers=2)
    assert [p.name if p else None for p in forked] == ["c.png", "f.png", "d.png", None]
    for mine, theirs in zip(here, forked, strict=True):
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert mine.read_bytes() == theirs.read_bytes()


def test_repair_effect_labels_tell_the_paper_grids_cells_apart() -> None:
    cells = [f"retail-gemma4-{m}-{p}-gpt41-k10" for m in ("dense", "moe") for p in ("bf16", "fp8")]
    cut = [plots.short(cell, plots.CELL_LABEL_CHARS) for cell in cells]
    assert len(set(cut)) < len(cells)  # cutting the middle out loses dense vs moe
    labels, shared = plots.distinct_parts(cells, plots.CELL_LABEL_CHARS)
    assert labels == ["dense-bf16", "dense-fp8", "moe-bf16", "moe-fp8"]
    assert shared == "retail-gemma4-*-*-gpt41-k10"
    short_names = ["retail-q4-scripted-k10", "retail-q3-scripted-k10"]
    assert plots.distinct_parts(short_names, plots.CELL_LABEL_CHARS) == (short_names, None)


def test_files_read_by_worker_processes_give_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 files: past PARALLEL_FILES, so with idle CPUs the arms are read and summarised in
    # forked workers; one default label twice (two roots) checks the relabelling after them.
    paths = write_grid(
        tmp_path / "runs", models=("m1",), precisions=("bf16", "int4"), tasks=3, trials=2
    )
    twin = tmp_path / "twin" / paths[0].relative_to(tmp_path / "runs")
    twin.parent.mkdir(parents=True)
    twin.write_bytes(paths[0].read_bytes())
    assert len(paths) + 1 >= PARALLEL_FILES
    outputs = {}
    for workers in (0, 2):
        monkeypatch.setattr(parallel, "idle_workers", lambda w=workers: w)
        out = tmp_path / f"report-{workers}"
        summary = analyze([*paths, twin], None, out, "workers")
        outputs[workers] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
        assert len(summary.arms) == len(paths) + 1
    assert outputs[0] == outputs[2]


def test_the_paper_grid_compares_176_pairs_in_three_families(tmp_path: Path) -> None:
    """96 repair-mode pairs and 80 precision pairs (the benchmark analysed 96 before: the
    precision pairs, and so the precision family, never ran at scale)."""
    from benchmarks.report_scale import MODELS, paper_pairs

    pairs = paper_pairs()
    assert len(pairs) == len(set(pairs)) == 176
    across = [(r, c) for r, c in pairs if r.split("/")[0] != c.split("/")[0]]
    assert len(across) == 80 and all("-bf16-" in r for r, _ in across)
    # At a small size the built-in rule sorts them into the three families.
    paths = write_grid(
        tmp_path / "runs", models=MODELS[:1], modes=("off", "prompt"), tasks=3, trials=1
    )
    small = paper_pairs(MODELS[:1], modes=("off", "prompt"))
    summary = analyze(paths, small, tmp_path / "report", "scale")
    families: dict[str, int] = {}
    for pair in summary.pairs:
        families[pair.family] = families.get(pair.family, 0) + 1
    # 2 domains: 6 cells x 1 mode pair; 2 quantized precisions x 2 modes.
    assert families == {
        "repair-mode comparisons": 6,
        "precision cells at mode off": 4,
        "other comparisons": 4,
    }
