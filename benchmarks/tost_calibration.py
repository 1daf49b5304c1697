"""Size of the study's equivalence test at its margin: ``python -m benchmarks.tost_calibration``.

A test that says "equivalent within ±7.5 points" must say it at most 5% of the time when the true
difference is exactly ±7.5 points. This simulates paired trials the way the study makes them
(tasks × 4 trials, the trials of one task correlated) and counts how often
``evals.analysis.stats``'s TOST declares equivalence there, over a grid: 10 / 25 / 114 tasks (40 /
100 / 456 pairs), reference success 0.3 / 0.6 / 0.9, discordant pairs low (10%) / high (25%, or the
most the baseline allows), within-task correlation low (0.05) / high (0.5), the compared arm worse
or better by the margin.

Per task, the four cell probabilities (both succeed, only the reference, only the compared,
neither) are drawn from a Dirichlet around the cell's means with concentration 1/icc - 1 (the
intra-class correlation of each cell indicator is then icc), and the task's trials are a
multinomial draw from them. The replaced test (a Wald z on the discordant pairs, pairs taken as
independent) is shown beside it, and the power at a true difference of 0 (the "better" rows).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks.support.results import run_recorded
from evals.analysis.stats import ALPHA, EQUIVALENCE_MARGIN, Z90, tost_arrays

__all__ = ["Cell", "Row", "cells", "main", "run_cell", "simulate_sums"]

QUESTION = (
    "Does the equivalence test keep its 5% size at the margin on the grids τ²-bench produces?"
)

TASKS = (10, 25, 114)
TRIALS = 4
BASELINES = (0.3, 0.6, 0.9)
DISCORDANCE = {"low": 0.10, "high": 0.25}
ICC = {"low": 0.05, "high": 0.5}
SEED = 20261201
REPLICATES = 20_000

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Cell:
    tasks: int
    baseline: float
    discordance: str
    icc: str
    side: int  # -1: the compared arm is worse by the margin; +1: better by it

    @property
    def discordant(self) -> float:
        """The asked discordance, or the most a difference of the margin allows at this baseline."""
        room = 2 * (1 - self.baseline) if self.side > 0 else 2 * self.baseline
        return min(DISCORDANCE[self.discordance], room - EQUIVALENCE_MARGIN)

    def probabilities(self, difference: float) -> npt.NDArray[np.float64]:
        """(both, reference only, compared only, neither) with compared − reference = difference."""
        ref_only = (self.discordant - difference) / 2
        cmp_only = (self.discordant + difference) / 2
        cells = [self.baseline - ref_only, ref_only, cmp_only, 1 - self.baseline - cmp_only]
        return np.array(cells, dtype=float)


def cells() -> list[Cell]:
    return [
        Cell(tasks, baseline, discordance, icc, side)
        for tasks, baseline, discordance, icc, side in itertools.product(
            TASKS, BASELINES, DISCORDANCE, ICC, (-1, 1)
        )
    ]


def simulate_counts(
    cell: Cell, difference: float, replicates: int, rng: np.random.Generator
) -> IntArray:
    """(replicates, tasks, 4) counts of the four outcomes over each task's trials."""
    means = cell.probabilities(difference)
    concentration = 1.0 / ICC[cell.icc] - 1.0
    # A Dirichlet draw as normalised gammas (vectorised; tiny weights may underflow to 0).
    weights = concentration * means
    gammas = rng.standard_gamma(np.broadcast_to(weights, (replicates, cell.tasks, 4)))
    total = gammas.sum(-1, keepdims=True)
    drawn = np.where(total > 0, gammas / np.where(total > 0, total, 1.0), means)
    return np.asarray(rng.multinomial(TRIALS, drawn), dtype=np.int64)


def simulate_sums(
    cell: Cell, difference: float, replicates: int, rng: np.random.Generator
) -> IntArray:
    """(replicates, tasks) sums of (compared − reference) over each task's trials."""
    counts = simulate_counts(cell, difference, replicates, rng)
    return np.asarray(counts[..., 2] - counts[..., 1], dtype=np.int64)


def _wald_equivalent(counts: IntArray) -> npt.NDArray[np.bool_]:
    """The replaced test: Wald z on the discordant pairs, every pair independent."""
    ref_only = counts[..., 1].sum(-1).astype(float)
    cmp_only = counts[..., 2].sum(-1).astype(float)
    n = counts.shape[-2] * TRIALS
    difference = (cmp_only - ref_only) / n
    se = np.sqrt(np.maximum(0.0, ref_only + cmp_only - (cmp_only - ref_only) ** 2 / n)) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = (difference - Z90 * se > -EQUIVALENCE_MARGIN) & (
            difference + Z90 * se < EQUIVALENCE_MARGIN
        )
    return np.asarray(ok & (se > 0), dtype=np.bool_)


@dataclass(frozen=True)
class Row:
    cell: Cell
    size: float  # P(equivalent) at the margin, this test
    wald_size: float  # the same for the replaced test
    power: float | None  # P(equivalent) at a true difference of 0 (the "better" rows)


def run_cell(cell: Cell, replicates: int, rng: np.random.Generator) -> Row:
    counts = simulate_counts(cell, cell.side * EQUIVALENCE_MARGIN, replicates, rng)
    sums = counts[..., 2] - counts[..., 1]
    verdict = tost_arrays(sums, TRIALS, bounds=False).equivalent
    power = None
    if cell.side > 0:
        null = simulate_sums(cell, 0.0, replicates, rng)
        power = float(tost_arrays(null, TRIALS, bounds=False).equivalent.mean())
    return Row(cell, float(verdict.mean()), float(_wald_equivalent(counts).mean()), power)


def report(rows: list[Row], replicates: int, seed: int, seconds: float) -> str:
    mc = math.sqrt(ALPHA * (1 - ALPHA) / replicates)
    lines = [
        "TOST size at the margin (true difference exactly ±7.5 points), nominal 5% per side",
        f"replicates per cell {replicates}, seed {seed}, Monte Carlo SE at 5%: {100 * mc:.2f} pts",
        "",
        "tasks pairs base disc (p)     icc   side   | size    | Wald z (replaced) | power at 0",
    ]
    for row in rows:
        c = row.cell
        power = "" if row.power is None else f"{100 * row.power:6.1f}%"
        lines.append(
            f"{c.tasks:5d} {c.tasks * TRIALS:5d} {c.baseline:4.1f} {c.discordance:4s} "
            f"({c.discordant:.3f}) {c.icc:5s} {'worse' if c.side < 0 else 'better':6s} | "
            f"{100 * row.size:5.2f}%  | {100 * row.wald_size:5.2f}%            | {power}"
        )
    worst = max(rows, key=lambda r: r.size)
    worst_wald = max(rows, key=lambda r: r.wald_size)
    lines += [
        "",
        f"largest size: {100 * worst.size:.2f}% ({worst.cell}); "
        f"{'within' if worst.size <= 0.06 else 'ABOVE'} the 6% bound",
        f"replaced Wald z, largest size: {100 * worst_wald.wald_size:.2f}% ({worst_wald.cell})",
        f"{len(rows)} cells in {seconds:.1f} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--replicates", type=int, default=REPLICATES)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.replicates < 1:
        parser.error("--replicates must be positive")
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    rows = [run_cell(cell, args.replicates, rng) for cell in cells()]
    text = report(rows, args.replicates, args.seed, time.perf_counter() - started)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    worst = max(row.size for row in rows)
    return 0 if worst <= 0.06 else 1


if __name__ == "__main__":
    raise SystemExit(run_recorded("tost_calibration", main))
