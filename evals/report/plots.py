"""The report's figures as PNG files (matplotlib's Agg canvas; no pyplot, no global state).

Each function draws one figure from a ``Summary`` and returns the path it wrote, or None when the
data has nothing to draw (the report then says why). Undefined values are left out of a figure,
never drawn as 0.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from PIL import Image

from evals.analysis.stats import EQUIVALENCE_MARGIN, Interval, Tost, average_ranks
from evals.analysis.summary import (
    BUDGETS,
    ENV_CHANNELS,
    REPAIR_MODES,
    ArmSummary,
    PairSummary,
    Summary,
)

__all__ = [
    "CELLS_PER_PAGE",
    "CELL_LABEL_CHARS",
    "LABEL_CHARS",
    "PAGE_DPI",
    "PAGE_ROWS",
    "TITLE_Y",
    "cell_sweeps_page",
    "channel_rates_page",
    "differences_page",
    "distinct_parts",
    "failed_calls_page",
    "name_ranks",
    "pages",
    "pair_label",
    "repair_effect_page",
    "short",
    "slug",
    "sweep",
    "task_pairs",
    "task_shift_page",
]

_DPI = 110


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "x"


def _write_png(figure: Figure, path: Path, dpi: int) -> Path:
    """The figure as a 256-colour palette PNG: a quarter of the RGBA file's bytes, the same
    picture to the eye (the report embeds every figure, so its size is theirs)."""
    # The canvas's raw pixels, not a PNG of them: that was compressed only to be decoded here.
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=dpi, format="rgba")
    # Agg's canvas size, as matplotlib sizes it: the figure's inches times the dpi, truncated.
    width, height = (int(side * dpi) for side in figure.get_size_inches())
    with Image.frombuffer("RGBA", (width, height), buffer.getvalue(), "raw", "RGBA", 0, 1) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    palette.save(path, format="PNG", optimize=True)
    return path


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    return _write_png(figure, path, _DPI)


def _band(arm: ArmSummary) -> tuple[list[int], list[float], list[float], list[float]]:
    ks, mid, low, high = [], [], [], []
    for k in BUDGETS:
        value = arm.sweep[k]
        if isinstance(value, Interval):
            ks.append(k)
            mid.append(value.estimate)
            low.append(value.low)
            high.append(value.high)
    return ks, mid, low, high


def sweep(summary: Summary, pair: PairSummary, path: Path) -> Path | None:
    """Success@K' of both arms of a pair, with Wilson 95% bands."""
    arms = [summary.arms[pair.reference], summary.arms[pair.compared]]
    if not any(_band(arm)[0] for arm in arms):
        return None
    figure = Figure(figsize=(6.4, 4.0))
    axes = figure.subplots()
    for arm, colour in zip(arms, ("tab:blue", "tab:orange"), strict=True):
        ks, mid, low, high = _band(arm)
        axes.plot(ks, mid, marker="o", color=colour, label=arm.label)
        axes.fill_between(ks, low, high, color=colour, alpha=0.18, linewidth=0)
    budgets = {arm.max_errors for arm in arms if arm.max_errors is not None}
    for budget in budgets:
        axes.axvline(budget, color="grey", linestyle=":", linewidth=1)
        if budget < max(BUDGETS):
            axes.text(
                budget + 0.15,
                0.5,
                f"past the run's budget K={budget}: n/a",
                fontsize=8,
                color="grey",
            )
    axes.set_xticks(list(BUDGETS))
    axes.set_xlabel("error budget K' (episode fails once failed tool calls reach K')")
    axes.set_ylabel("success rate")
    axes.set_ylim(0, 1)
    axes.set_title(f"Success vs budget: {pair.reference} vs {pair.compared}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    return _save(figure, path)


def name_ranks(summary: Summary, pair: PairSummary, path: Path) -> Path | None:
    """Rank of each hallucinated name in both arms (1 = most frequent; ties share a rank)."""
    ref = summary.arms[pair.reference].names
    cmp = summary.arms[pair.compared].names
    union = sorted(set(ref) | set(cmp))
    if not union:
        return None
    # Negated counts so that the most frequent name gets rank 1.
    ref_ranks = average_ranks([-ref.get(n, 0) for n in union])
    cmp_ranks = average_ranks([-cmp.get(n, 0) for n in union])
    figure = Figure(figsize=(5.2, 5.0))
    axes = figure.subplots()
    axes.scatter(ref_ranks, cmp_ranks, alpha=0.7)
    top = sorted(union, key=lambda n: -(ref.get(n, 0) + cmp.get(n, 0)))[:12]
    for name in top:
        i = union.index(name)
        axes.annotate(name, (ref_ranks[i], cmp_ranks[i]), fontsize=7, alpha=0.8)
    limit = len(union) + 0.5
    axes.plot([0.5, limit], [0.5, limit], color="grey", linestyle=":", linewidth=1)
    axes.set_xlim(0.5, limit)
    axes.set_ylim(0.5, limit)
    axes.invert_xaxis()
    axes.invert_yaxis()
    axes.set_xlabel(f"rank in {pair.reference}")
    axes.set_ylabel(f"rank in {pair.compared}")
    axes.set_title("Hallucinated tool names: rank by count", fontsize=10)
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------
# Paged figures: at the paper grid's size (120 arms, 96 pairs) one figure per page of a bounded
# number of rows, one per cell for the sweeps, so no image grows with the grid.

PAGE_ROWS = 24  # rows (arms or pairs) per page of a paged figure
# A page's titles sit at a fixed height: nothing is drawn above its axes, and matplotlib's
# automatic placement measures every tick label to find that out (~10% of a page's drawing).
TITLE_Y = 1.0
LABEL_CHARS = 44  # longest label drawn; a longer one keeps its head and tail around "…"
PAGE_DPI = 80


def short(label: str, limit: int = LABEL_CHARS) -> str:
    """``label`` cut to ``limit`` characters, keeping its start and end (cell and mode)."""
    if len(label) <= limit:
        return label
    head = (limit - 1) // 2
    return f"{label[:head]}…{label[len(label) - (limit - 1 - head) :]}"


def pages(count: int, size: int = PAGE_ROWS) -> list[range]:
    """``range(count)`` in pages of at most ``size``."""
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _save_page(figure: Figure, path: Path) -> Path:
    return _write_png(figure, path, PAGE_DPI)


def channel_rates_page(arms: Sequence[ArmSummary], path: Path, title: str) -> Path | None:
    """Failed agent calls per agent tool call by channel, one horizontal stacked bar per arm."""
    if not arms:
        return None
    series = [*ENV_CHANNELS]
    height = 1.4 + 0.32 * len(arms)
    figure = Figure(figsize=(9.0, height))
    axes = figure.add_axes((0.34, 0.9 / height, 0.44, 1 - 1.4 / height))
    left = [0.0] * len(arms)
    for name in series:
        widths = [v if isinstance(v := arm.channel_rates[name], float) else 0.0 for arm in arms]
        axes.barh(range(len(arms)), widths, left=left, label=name.replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, arm in enumerate(arms):
        if not isinstance(arm.channel_rates["any"], float):  # n/a is not 0%: say so
            axes.text(0.005, y, "n/a: no agent tool calls", va="center", fontsize=6, color="grey")
    raw = [arm.raw_hallucination_rate for arm in arms]
    ys = [y for y, v in enumerate(raw) if isinstance(v, float)]
    axes.scatter(
        [v for v in raw if isinstance(v, float)],
        ys,
        marker="|",
        s=120,
        color="black",
        label="raw hallucinated (proxy + env)",
        zorder=3,
    )
    axes.set_yticks(range(len(arms)))
    # Whole names (the parts that differ, the shared pattern once below) and each arm's n.
    labels, shared = distinct_parts([arm.label for arm in arms], LABEL_CHARS - 10)
    axes.set_yticklabels(
        [f"{label} (n={arm.agent_tool_calls})" for label, arm in zip(labels, arms, strict=True)],
        fontsize=7,
    )
    axes.invert_yaxis()
    axes.set_xlabel(
        "share of agent tool calls (n: calls)" + (f"; arms {shared}" if shared else ""),
        fontsize=8,
    )
    axes.set_title(title, fontsize=9, y=TITLE_Y)
    axes.grid(axis="x", alpha=0.3)
    axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_page(figure, path)


def pair_label(compared: str, reference: str, limit: int = 56) -> str:
    """``compared − reference``, the reference written as the parts where it differs from the
    compared arm (its precision and its mode alike: "…-fp8-…/off − bf16/off" is a precision
    pair, "…/reflexive − off" a repair pair), the whole reference when the labels do not align."""
    ours, theirs = re.split(r"([-/])", compared), re.split(r"([-/])", reference)
    if len(ours) == len(theirs):
        parts = [t for o, t in zip(ours[::2], theirs[::2], strict=True) if o != t]
        named = "/".join(parts) if parts else reference
    else:
        named = reference
    return short(f"{compared} − {named}", limit)


def differences_page(pairs: Sequence[PairSummary], path: Path, title: str) -> Path | None:
    """Paired success difference with the interval TOST inverts (90%: the verdict's own), one
    row per pair, the ±7.5-point band; filled: equivalent, open: not."""
    rows = [(p, p.tost) for p in pairs if isinstance(p.tost, Tost)]
    if not rows:
        return None
    height = 1.5 + 0.3 * len(rows)
    figure = Figure(figsize=(9.0, height))
    axes = figure.add_axes((0.42, 1.0 / height, 0.54, 1 - 1.5 / height))
    for y, (_, test) in enumerate(rows):
        value = test.interval
        colour = "tab:green" if test.equivalent else "tab:blue"
        axes.plot([value.low, value.high], [y, y], color=colour)
        axes.plot(
            [value.estimate],
            [y],
            marker="o",
            color=colour,
            markersize=4,
            markerfacecolor=colour if test.equivalent else "white",
        )
    axes.axvspan(-EQUIVALENCE_MARGIN, EQUIVALENCE_MARGIN, color="tab:green", alpha=0.12)
    axes.axvline(0, color="grey", linewidth=1)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels(
        [f"{pair_label(p.compared, p.reference)} ({p.tasks} tasks)" for p, _ in rows], fontsize=7
    )
    axes.invert_yaxis()
    axes.set_xlabel(
        "compared − reference: TOST's 90% interval (the verdict's); band ±7.5 pts; "
        "filled: equivalent",
        fontsize=8,
    )
    axes.set_title(title, fontsize=9, y=TITLE_Y)
    axes.grid(axis="x", alpha=0.3)
    return _save_page(figure, path)


CELLS_PER_PAGE = 6  # grid cells per page of the repair-effect figure
CELL_LABEL_CHARS = 30  # a repair-effect bar group's label


def distinct_parts(labels: Sequence[str], limit: int) -> tuple[list[str], str | None]:
    """When a label is longer than ``limit``: each label's ``-`` parts that differ between the
    labels, and the shared pattern (``retail-gemma4-*-*-gpt41-k10``) that the figure states once;
    else the labels as they are and None. Cutting the middle out of the paper grid's cell names
    left ``retail-gemma4-…-bf16-gpt41-k10`` for both the dense and the MoE model."""
    split = [label.split("-") for label in labels]
    if all(len(label) <= limit for label in labels) or len(labels) < 2:
        return list(labels), None
    if len({len(parts) for parts in split}) != 1:
        return list(labels), None
    varying = [i for i in range(len(split[0])) if len({parts[i] for parts in split}) > 1]
    if not varying:
        return list(labels), None
    shared = "-".join("*" if i in varying else part for i, part in enumerate(split[0]))
    return ["-".join(parts[i] for i in varying) for parts in split], shared


FAILED_CALLS_MAX = 10  # the failed-calls histogram's last column pools this many and more


def repair_effect_page(
    cells: Sequence[tuple[str, Sequence[ArmSummary]]], path: Path, title: str
) -> Path | None:
    """Success by repair mode within each of a page of grid cells, with Wilson 95% error bars."""
    cells = [(cell, arms) for cell, arms in cells if len(arms) > 1]
    if not cells:
        return None
    present = {arm.mode for _, arms in cells for arm in arms if arm.mode}
    # The grid's order (off first), so each mode keeps the colour the sweeps give it.
    modes = [m for m in REPAIR_MODES if m in present] + sorted(present - set(REPAIR_MODES))
    figure = Figure(figsize=(9.0, 4.0))
    axes = figure.add_axes((0.14, 0.3, 0.72, 0.6))
    width = min(0.8 / max(len(modes), 1), 0.25)
    for m, mode in enumerate(modes):
        xs, heights, lows, highs = [], [], [], []
        for c, (_, arms) in enumerate(cells):
            found = next((a for a in arms if a.mode == mode), None)
            if found is None or not isinstance(found.success, Interval):
                continue
            xs.append(c + (m - (len(modes) - 1) / 2) * width)
            heights.append(found.success.estimate)
            lows.append(found.success.estimate - found.success.low)
            highs.append(found.success.high - found.success.estimate)
        # A 0% bar keeps a sliver of its colour, so the legend's colours stay on the page.
        drawn = [max(h, 0.006) for h in heights]
        axes.bar(xs, drawn, width=width, yerr=[lows, highs], capsize=2, label=mode)
        for x, height in zip(xs, heights, strict=True):  # at the foot, clear of the error bars
            low_bar = height < 0.08
            axes.text(
                x,
                0.02,
                f"{100 * height:.0f}",
                ha="center",
                fontsize=6,
                color="black" if low_bar else "white",
            )
    labels, shared = distinct_parts([cell for cell, _ in cells], CELL_LABEL_CHARS)
    axes.set_xticks(range(len(cells)))
    axes.set_xticklabels(
        [short(label, CELL_LABEL_CHARS) for label in labels], rotation=20, ha="right", fontsize=7
    )
    if shared is not None:
        axes.set_xlabel(f"cell: {shared}", fontsize=7)
    axes.set_xlim(-0.6, len(cells) - 0.4)
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("success at the run's budget", fontsize=8)
    axes.set_title(title, fontsize=9, y=TITLE_Y)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_page(figure, path)


def task_pairs(pair: PairSummary, path: Path) -> Path | None:
    """Per task, the compared arm's success share against the reference's (marker area: how
    many tasks sit on that point); above the diagonal the compared arm did better."""
    if not pair.task_shares:
        return None
    points: dict[tuple[float, float], int] = {}
    for _, ref, cmp, n in pair.task_shares:
        key = (ref / n, cmp / n)
        points[key] = points.get(key, 0) + 1
    figure = Figure(figsize=(4.8, 4.4))
    axes = figure.subplots()
    xs, ys = [k[0] for k in points], [k[1] for k in points]
    counts = list(points.values())
    axes.scatter(xs, ys, s=[18 * c for c in counts], alpha=0.55, color="tab:blue")
    for x, y, count in zip(xs, ys, counts, strict=True):
        if count > 1:
            axes.annotate(str(count), (x, y), fontsize=6, ha="center", va="center")
    axes.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    axes.set_xlim(-0.08, 1.08)
    axes.set_ylim(-0.08, 1.08)
    axes.set_xlabel(f"success share per task: {short(pair.reference, 40)}", fontsize=7)
    axes.set_ylabel(f"{short(pair.compared, 40)}", fontsize=7)
    axes.set_title("Success per task, paired", fontsize=9)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return _save_page(figure, path)


def task_shift_page(pairs: Sequence[PairSummary], path: Path, title: str) -> Path | None:
    """Per pair, the share of tasks on which the compared arm did worse, the same, or better
    than the reference (success share over the task's paired trials)."""
    rows = [p for p in pairs if p.task_shares]
    if not rows:
        return None
    height = 1.5 + 0.3 * len(rows)
    figure = Figure(figsize=(9.0, height))
    axes = figure.add_axes((0.42, 1.0 / height, 0.42, 1 - 1.5 / height))
    shares = []
    for p in rows:
        total = len(p.task_shares)
        worse = sum(1 for _, r, c, _ in p.task_shares if c < r) / total
        better = sum(1 for _, r, c, _ in p.task_shares if c > r) / total
        shares.append((worse, 1.0 - worse - better, better))
    left = [0.0] * len(rows)
    for i, (label, colour) in enumerate(
        (("worse", "tab:red"), ("same", "lightgrey"), ("better", "tab:green"))
    ):
        widths = [s[i] for s in shares]
        axes.barh(range(len(rows)), widths, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([pair_label(p.compared, p.reference) for p in rows], fontsize=7)
    axes.invert_yaxis()
    axes.set_xlim(0, 1)
    axes.set_xlabel("share of tasks: compared did worse / the same / better", fontsize=8)
    axes.set_title(title, fontsize=9, y=TITLE_Y)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_page(figure, path)


def failed_calls_page(arms: Sequence[ArmSummary], path: Path, title: str) -> Path | None:
    """Each arm's histogram of failed tool calls per episode, one row per arm (colour: share of
    the arm's episodes; the last column pools ``FAILED_CALLS_MAX`` and more)."""
    rows = [a for a in arms if a.failed_calls_histogram]
    if not rows:
        return None
    columns = FAILED_CALLS_MAX + 1
    grid = []
    for arm in rows:
        total = sum(arm.failed_calls_histogram.values())
        line = [0.0] * columns
        for calls, episodes in arm.failed_calls_histogram.items():
            line[min(calls, FAILED_CALLS_MAX)] += episodes / total
        grid.append(line)
    height = 1.5 + 0.3 * len(rows)
    figure = Figure(figsize=(9.0, height))
    axes = figure.add_axes((0.34, 1.0 / height, 0.5, 1 - 1.5 / height))
    # Most episodes sit at 0 failed calls: a square-root scale keeps the other columns visible.
    image = axes.imshow(
        grid, aspect="auto", cmap="viridis", norm=PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    )
    axes.set_xticks(range(columns))
    axes.set_xticklabels([*map(str, range(FAILED_CALLS_MAX)), f"{FAILED_CALLS_MAX}+"], fontsize=7)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([short(arm.label) for arm in rows], fontsize=7)
    axes.set_xlabel("failed tool calls in the episode (agent's and user's)", fontsize=8)
    axes.set_title(title, fontsize=9, y=TITLE_Y)
    colour_axes = figure.add_axes((0.86, 1.0 / height, 0.02, 1 - 1.5 / height))
    figure.colorbar(image, cax=colour_axes).set_label(
        "share of episodes (square-root scale)", fontsize=7
    )
    return _save_page(figure, path)


def cell_sweeps_page(summary: Summary, cells: Sequence[str], path: Path) -> Path | None:
    """Success@K' of every mode of each of a page of cells (a 2 x 3 grid, Wilson 95% bands):
    one image per ``CELLS_PER_PAGE`` cells instead of one per cell."""
    drawn = [(cell, [a for a in summary.arms.values() if a.cell == cell]) for cell in cells]
    drawn = [(cell, arms) for cell, arms in drawn if any(_band(arm)[0] for arm in arms)]
    if not drawn:
        return None
    figure = Figure(figsize=(9.0, 5.6))
    grid = figure.subplots(2, 3, sharex=True, sharey=True, squeeze=False)
    figure.subplots_adjust(left=0.07, right=0.86, bottom=0.09, top=0.93, wspace=0.08, hspace=0.22)
    handles: dict[str, Artist] = {}
    for index, axes in enumerate(grid.flat):
        if index >= len(drawn):
            axes.set_visible(False)
            continue
        cell, arms = drawn[index]
        for arm in arms:
            ks, mid, low, high = _band(arm)
            label = arm.mode or arm.label
            (line,) = axes.plot(ks, mid, marker="o", markersize=2, linewidth=1, label=label)
            axes.fill_between(ks, low, high, color=line.get_color(), alpha=0.1, linewidth=0)
            handles.setdefault(label, line)
        axes.set_title(short(cell, 36), fontsize=7, y=TITLE_Y)
        axes.set_ylim(0, 1)
        axes.set_xticks(list(BUDGETS))
        axes.tick_params(labelsize=6)
        axes.grid(alpha=0.3)
    figure.supxlabel("error budget K'", fontsize=8)
    figure.supylabel("success rate", fontsize=8)
    figure.legend(
        list(handles.values()),
        list(handles),
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(0.87, 0.93),
    )
    return _save_page(figure, path)
