"""The report's figures and provenance at any grid size: paged figures whose images do not grow
with the number of arms or pairs, and the provenance as an appendix that names what every arm
shares once and, per arm, only what differs.

Past ``PARALLEL_FIGURES`` figures, on a machine with idle CPUs, they are drawn in forked worker
processes (``evals.analysis.parallel``): matplotlib's drawing is Python bound (~0.4 s a page, 26
pages at the paper grid's size), and each figure is a pure function of its arguments, so the images
are the same bytes either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from evals.analysis import parallel
from evals.analysis.summary import PairSummary, Summary
from evals.report import plots
from evals.report.render import Figure, Section, flatten

__all__ = [
    "NAME_RANK_PAIRS",
    "PARALLEL_FIGURES",
    "draw_figures",
    "figures_section",
    "provenance_appendix",
]

NAME_RANK_PAIRS = 8  # past this many pairs the Spearman column carries the name ranks
PARALLEL_FIGURES = 12  # from this many figures on, worker processes draw them

# (title, the plots function, its arguments): one figure to draw.
Job = tuple[str, Callable[..., Path | None], tuple[Any, ...]]


def draw_figures(jobs: Sequence[Job], workers: int | None = None) -> list[Path | None]:
    """Each job's figure, in order: in ``workers`` forked processes (default: the idle CPUs,
    at most ``parallel.MAX_WORKERS``, once there are ``PARALLEL_FIGURES`` jobs), else here
    (see ``parallel.run_calls``)."""
    if workers is None:
        workers = parallel.idle_workers() if len(jobs) >= PARALLEL_FIGURES else 1
    return parallel.run_calls([(draw, arguments) for _, draw, arguments in jobs], workers)


def _pair_slug(pair: PairSummary) -> str:
    return plots.slug(f"{pair.reference}__vs__{pair.compared}")


def figures_section(summary: Summary, out_dir: Path) -> Section:
    section = Section("Figures")
    jobs: list[Job] = []
    cells = list(dict.fromkeys(a.cell for a in summary.arms.values() if a.cell is not None))
    few = len(summary.pairs) <= NAME_RANK_PAIRS
    sweep_pages = [] if few else plots.pages(len(cells), plots.CELLS_PER_PAGE)
    for n, page in enumerate(sweep_pages, 1):
        title = f"Success vs K' per cell ({n} of {len(sweep_pages)})"
        path = out_dir / f"sweep_{n:02d}.png"
        drawn_cells = [cells[i] for i in page]
        # The page's arms only: what a worker process is sent.
        arms_of_page = {k: a for k, a in summary.arms.items() if a.cell in drawn_cells}
        page_summary = replace(summary, arms=arms_of_page, pairs=[], notes=[])
        jobs.append((title, plots.cell_sweeps_page, (page_summary, drawn_cells, path)))
    if few or not cells:
        for i, pair in enumerate(summary.pairs, 1):
            path = out_dir / f"sweep_{i:02d}_{_pair_slug(pair)}.png"
            title = f"Success vs K': {pair.compared} vs {pair.reference}"
            jobs.append((title, plots.sweep, (summary, pair, path)))
    arms = list(summary.arms.values())
    arm_pages = plots.pages(len(arms))
    for n, page in enumerate(arm_pages, 1):
        title = f"Channel rates per arm ({n} of {len(arm_pages)})"
        path = out_dir / ("channels.png" if n == 1 else f"channels_{n:02d}.png")
        jobs.append((title, plots.channel_rates_page, ([arms[i] for i in page], path, title)))
    for n, page in enumerate(arm_pages, 1):
        title = (
            f"Failed tool calls per episode, each row an arm's histogram ({n} of {len(arm_pages)})"
        )
        path = out_dir / f"failed_calls_{n:02d}.png"
        jobs.append((title, plots.failed_calls_page, ([arms[i] for i in page], path, title)))
    pair_pages = plots.pages(len(summary.pairs))
    for n, page in enumerate(pair_pages, 1):
        title = f"Paired differences ({n} of {len(pair_pages)})"
        path = out_dir / ("differences.png" if n == 1 else f"differences_{n:02d}.png")
        pairs = [summary.pairs[i] for i in page]
        jobs.append((title, plots.differences_page, (pairs, path, title)))
    for n, page in enumerate(pair_pages, 1):
        title = f"Per task: compared worse, same, better ({n} of {len(pair_pages)})"
        path = out_dir / f"task_shift_{n:02d}.png"
        pairs = [summary.pairs[i] for i in page]
        jobs.append((title, plots.task_shift_page, (pairs, path, title)))
    if few:
        for i, pair in enumerate(summary.pairs, 1):
            path = out_dir / f"tasks_{i:02d}_{_pair_slug(pair)}.png"
            title = f"Success per task: {pair.compared} vs {pair.reference}"
            jobs.append((title, plots.task_pairs, (pair, path)))
        for i, pair in enumerate(summary.pairs, 1):
            path = out_dir / f"names_{i:02d}_{_pair_slug(pair)}.png"
            title = f"Name-count ranks: {pair.compared} vs {pair.reference}"
            jobs.append((title, plots.name_ranks, (summary, pair, path)))
    else:
        section.paragraphs.append(
            f"Per-task scatter and name-rank plots are drawn for at most {NAME_RANK_PAIRS} "
            f"pairs; with {len(summary.pairs)} the per-task pages and the Spearman column of "
            "the pairs table carry them."
        )
    by_cell = [(cell, [a for a in arms if a.cell == cell]) for cell in cells]
    by_cell = [(cell, members) for cell, members in by_cell if len(members) > 1]
    cell_pages = plots.pages(len(by_cell), plots.CELLS_PER_PAGE)
    for n, page in enumerate(cell_pages, 1):
        title = f"Repair effect per cell ({n} of {len(cell_pages)})"
        path = out_dir / ("repair_effect.png" if n == 1 else f"repair_effect_{n:02d}.png")
        jobs.append((title, plots.repair_effect_page, ([by_cell[i] for i in page], path, title)))
    drawn = zip([title for title, _, _ in jobs], draw_figures(jobs), strict=True)
    for title, drawn_path in drawn:
        if drawn_path is None:
            section.paragraphs.append(f"{title}: nothing to draw for this data.")
        else:
            section.figures.append(Figure(title, drawn_path))
    return section


def provenance_appendix(summary: Summary) -> Section:
    per_arm: dict[str, dict[str, str]] = {}
    for arm in summary.arms.values():
        rows = dict(flatten(arm.run_info, "results.info"))
        rows.update(flatten(arm.provenance) if arm.provenance else {"provenance.json": "absent"})
        per_arm[arm.label] = rows
    keys = list(dict.fromkeys(k for rows in per_arm.values() for k in rows))
    # With two arms every row is read side by side; past that, shared rows are said once.
    shared = [k for k in keys if len({rows.get(k) for rows in per_arm.values()}) == 1]
    shared = shared if len(per_arm) > 2 else []
    section = Section(
        "Appendix: provenance",
        [
            "From each results file's info block, then the provenance.json beside it (if any). "
            "Rows marked 'every arm' hold for all arms; the rest per arm, where they differ."
        ],
        header=["arm", "key", "value"],
    )
    first = next(iter(per_arm.values()), {})
    section.rows += [["every arm", k, first[k]] for k in shared]
    for label, rows in per_arm.items():
        section.rows += [[label, k, v] for k, v in rows.items() if k not in shared]
    return section
