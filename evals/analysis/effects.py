"""What a reader of the paper asks beyond the difference: pass^k per arm, the paired odds ratio,
how small an effect the run could have seen, and what repair costs per point of success gained.

pass^k is τ²-bench's (``src/tau2/metrics/agent_metrics.py``: per task C(successes, k) / C(trials,
k), averaged over tasks, k up to the fewest trials any task has), over every episode of the file
as τ²-bench reads it. The rest follow the study's unit, the task, where an interval needs one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from evals.analysis.stats import (
    Interval,
    NotAvailable,
    PairedTable,
    TaskMoments,
    TaskPairs,
    _wald_variance,
    null_variance,
    t_quantile,
)

__all__ = [
    "BOOTSTRAP_REPLICATES",
    "POWER",
    "CostPerPoint",
    "Power",
    "Resampler",
    "clopper_pearson",
    "cost_per_point",
    "episode_costs",
    "paired_odds_ratio",
    "paired_odds_ratio_as_in_the_paper",
    "pass_hat_k",
    "pass_hat_ks",
    "power",
]

POWER = 0.8  # the power at which the smallest detectable difference is stated
BOOTSTRAP_REPLICATES = 4000
BOOTSTRAP_SEED = 20261202
SUCCESS_TOLERANCE = 1e-6  # τ²-bench's is_successful


def pass_hat_k(num_trials: int, success_count: int, k: int) -> float:
    """pass^k of one task, τ²-bench's formula: C(successes, k) / C(trials, k)."""
    if num_trials < k:
        raise ValueError(f"Number of trials {num_trials} is less than k {k}.")
    return math.comb(success_count, k) / math.comb(num_trials, k)


def pass_hat_ks(
    rewards: Sequence[tuple[str, float | None]], num_trials: int | None = None
) -> dict[int, Interval | NotAvailable]:
    """pass^k for k = 1..max_k from (task id, reward) per episode (a missing reward fails).

    max_k = the fewest trials any task has, capped by ``num_trials`` (the file's
    ``info.num_trials``), as τ²-bench's ``get_metrics_df``. The estimate is τ²-bench's mean over
    tasks; the interval is Student's t over tasks (the task is the unit), clamped to [0, 1].
    """
    by_task: dict[str, list[bool]] = {}
    for task, reward in rewards:
        ok = reward is not None and abs(reward - 1.0) <= SUCCESS_TOLERANCE
        by_task.setdefault(task, []).append(ok)
    if not by_task:
        return {}
    max_k = min(len(v) for v in by_task.values())
    if num_trials is not None:
        max_k = min(max_k, num_trials)
    out: dict[int, Interval | NotAvailable] = {}
    groups = len(by_task)
    for k in range(1, max_k + 1):
        values = [pass_hat_k(len(v), sum(v), k) for v in by_task.values()]
        mean = sum(values) / groups
        if groups < 2:
            out[k] = NotAvailable("1 task: an interval over tasks needs at least 2")
            continue
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (groups - 1))
        half = float(t_quantile(0.025, groups - 1)) * sd / math.sqrt(groups)
        out[k] = Interval(mean, max(0.0, mean - half), min(1.0, mean + half))
    return out


# ---------------------------------------------------------------------------------------------
# The paired odds ratio


def _log_comb(n: int, ks: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    lgamma = np.vectorize(math.lgamma, otypes=[float])
    return np.asarray(lgamma(n + 1.0) - lgamma(ks + 1.0) - lgamma(n - ks + 1.0), dtype=float)


def clopper_pearson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion, by bisection on the tails."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"successes {successes} not in [0, {n}]")
    tail = (1.0 - confidence) / 2.0

    def solve(ks: npt.NDArray[np.float64], rises: bool) -> float:
        """p where the binomial mass over ``ks`` equals ``tail`` (it rises with p when the ks
        are the upper tail, P(X >= s), and falls for the lower one, P(X <= s))."""
        log_comb = _log_comb(n, ks)
        low, high = 0.0, 1.0
        for _ in range(60):
            middle = (low + high) / 2.0
            mass = float(
                np.exp(log_comb + ks * math.log(middle) + (n - ks) * math.log1p(-middle)).sum()
            )
            if (mass > tail) == rises:
                high = middle
            else:
                low = middle
        return (low + high) / 2.0

    lower = 0.0 if successes == 0 else solve(np.arange(successes, n + 1, dtype=float), True)
    upper = 1.0 if successes == n else solve(np.arange(0, successes + 1, dtype=float), False)
    return lower, upper


ODDS_RATIO_GRID = np.exp(np.linspace(math.log(1e-4), math.log(1e4), 2001))


def paired_odds_ratio(discordant: Sequence[tuple[int, int]]) -> Interval | NotAvailable:
    """The paired (conditional) odds ratio, compared-only over reference-only pairs, with a 95%
    interval that takes the task as the unit: from (reference-only, compared-only) pairs per
    task, the ratio C / B of the totals, and the set of odds psi a null-imposed cluster-robust
    score statistic does not reject, T(theta) = (C - theta M) / sqrt(G/(G-1) sum_g (c_g - theta
    m_g)^2) with theta = psi / (1 + psi), m_g = b_g + c_g and Student's t with G - 1 df over the G
    tasks with discordant pairs. (The paper's exact interval on the discordant split takes
    every episode pair as independent: with task heterogeneity its level is not kept.)"""
    used = [(b, c) for b, c in discordant if b + c > 0]
    b_total = sum(b for b, _ in used)
    c_total = sum(c for _, c in used)
    if not used:
        return NotAvailable("no discordant pairs")
    if b_total == 0:
        return NotAvailable(f"no reference-only successes ({c_total} compared-only): unbounded")
    if len(used) < 2:
        return NotAvailable("discordant pairs in 1 task: a task-level interval needs 2")
    groups = len(used)
    b = np.array([u[0] for u in used], dtype=float)
    c = np.array([u[1] for u in used], dtype=float)
    m = b + c
    quantile = float(t_quantile(0.025, groups - 1))

    def accepted(psi: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        theta = psi / (1.0 + psi)
        residual = c[None, :] - theta[:, None] * m[None, :]
        spread = groups / (groups - 1) * (residual * residual).sum(-1)
        distance = np.abs(residual.sum(-1))
        return np.asarray(distance <= quantile * np.sqrt(spread), dtype=bool)

    grid = ODDS_RATIO_GRID
    inside = accepted(grid)
    estimate = c_total / b_total
    if not inside.any():  # pragma: no cover - the estimate's own neighbourhood is accepted
        return NotAvailable("no odds ratio accepted")
    if inside[-1]:
        return NotAvailable(f"odds ratio {estimate:.2f}: the interval's upper end is unbounded")
    first, last = int(np.argmax(inside)), len(grid) - 1 - int(np.argmax(inside[::-1]))

    def refine(good: float, bad: float) -> float:
        for _ in range(40):
            middle = math.sqrt(good * bad)
            if bool(accepted(np.array([middle]))[0]):
                good = middle
            else:
                bad = middle
        return good

    low = 0.0 if first == 0 else refine(float(grid[first]), float(grid[first - 1]))
    high = refine(float(grid[last]), float(grid[last + 1]))
    return Interval(estimate, min(low, estimate), max(high, estimate))


def paired_odds_ratio_as_in_the_paper(table: PairedTable) -> Interval | NotAvailable:
    """The paper's conditional odds ratio c / b with the exact 95% interval of the discordant
    split (Clopper-Pearson), every episode pair taken as independent; kept beside the task-level
    one for comparison."""
    b, c = table.reference_only, table.compared_only
    if b + c == 0:
        return NotAvailable("no discordant pairs")
    if b == 0:
        return NotAvailable(f"no reference-only successes ({c} compared-only): unbounded")
    low, high = clopper_pearson(c, b + c)
    return Interval(c / b, low / (1.0 - low), high / (1.0 - high))


# ---------------------------------------------------------------------------------------------
# What the run could have detected

POWER_REPLICATES = 1000  # Monte Carlo SE of a power near 80%: 1.3 points
POWER_SEED = 20261204


@dataclass(frozen=True)
class Power:
    """What the run could have shown, by simulation with the tests' own methods: the observed
    tasks resampled (``POWER_REPLICATES`` bootstrap draws of G tasks, a fixed seed), each task's
    mean difference shifted so that the truth is the alternative, and the very tests run on each
    draw. ``detectable``: the smallest true difference (either sign, the larger of the two) at
    which the difference column's two-sided 5% test (its 95% task-level t interval excludes 0)
    rejects in 80% of draws; ``tost_power``: the share of draws at a true difference of 0 in
    which the ±margin TOST shows equivalence; ``margin_at_power``: the smallest margin TOST
    shows in 80% of them.
    ``standard_error`` is the task-clustered one at the estimate (a description, not used)."""

    standard_error: float
    detectable: float
    tost_power: float
    margin_at_power: float
    replicates: int = POWER_REPLICATES


def power(pairs: TaskPairs, margin: float, alpha: float = 0.05) -> Power | NotAvailable:
    if pairs.n == 0:
        return NotAvailable("no paired episodes")
    if pairs.tasks < 2:
        return NotAvailable("a task-level simulation needs at least 2 tasks")
    sums = np.array(pairs.sums, dtype=float)
    sizes = np.array(pairs.sizes, dtype=float)
    estimate = float(sums.sum() / sizes.sum())
    means = sums / sizes
    if float(np.ptp(means)) == 0.0:
        return NotAvailable(
            "every task has the same difference: nothing to resample (the run cannot tell its "
            "own variance)"
        )
    se = math.sqrt(null_variance(pairs, estimate))
    rng = np.random.default_rng(POWER_SEED)
    drawn = rng.integers(0, pairs.tasks, (POWER_REPLICATES, pairs.tasks))
    moments = TaskMoments.of(sums[drawn], sizes[drawn], tabled=True)

    def shift(truth: float) -> npt.NDArray[np.float64]:
        """Each drawn task's mean difference moved by (estimate - truth): the truth is then
        ``truth`` in the population the draws come from."""
        return np.full(POWER_REPLICATES, estimate - truth)

    # The difference column's test: its 95% task-level t interval excludes 0. A constant shift
    # per trial leaves each draw's residuals at its own estimate, so its standard error, as it is.
    drawn_estimate = sums[drawn].sum(-1) / sizes[drawn].sum(-1)
    wald_half = float(t_quantile(alpha / 2.0, [pairs.tasks - 1.0])[0]) * np.sqrt(
        _wald_variance(sums[drawn], sizes[drawn])
    )

    def change_power(truth: float) -> float:
        moved = drawn_estimate - (estimate - truth)
        return float(np.mean(np.abs(moved) > wald_half))

    def smallest(sign: int) -> float:
        low, high = 0.0, 1.0
        if change_power(sign * high) < POWER:
            return 1.0
        for _ in range(10):  # to 0.1 point
            middle = (low + high) / 2.0
            if change_power(sign * middle) >= POWER:
                high = middle
            else:
                low = middle
        return high

    detectable = max(smallest(+1), smallest(-1))
    at_zero = shift(0.0)
    shape = at_zero.shape
    lower = moments.excess(np.full(shape, -margin), -1, alpha, at_zero) > 0
    upper = moments.excess(np.full(shape, margin), +1, alpha, at_zero) > 0
    tost_power = float(np.mean(lower & upper))
    reach = np.maximum(
        -moments.bound(-1, margin, alpha, at_zero, 14),
        moments.bound(+1, margin, alpha, at_zero, 14),
    )
    margin_at_power = float(np.quantile(reach, POWER, method="higher"))
    return Power(se, detectable, tost_power, margin_at_power)


# ---------------------------------------------------------------------------------------------
# Repair cost per point of success gained


class Resampler:
    """The task bootstrap's weights (``BOOTSTRAP_REPLICATES`` multinomial draws over the tasks,
    seeded with ``BOOTSTRAP_SEED``), drawn once per number of tasks: every pair of a report with
    that many tasks resamples with the same draws, as drawing them afresh gives anyway (~50 ms a
    draw at 114 tasks, twice per pair before)."""

    def __init__(self) -> None:
        self._weights: dict[int, npt.NDArray[np.int64]] = {}

    def weights(self, tasks: int) -> npt.NDArray[np.int64]:
        if tasks not in self._weights:
            rng = np.random.default_rng(BOOTSTRAP_SEED)
            drawn = rng.multinomial(tasks, np.full(tasks, 1.0 / tasks), BOOTSTRAP_REPLICATES)
            drawn.flags.writeable = False
            self._weights[tasks] = drawn
        return self._weights[tasks]


@dataclass(frozen=True)
class CostPerPoint:
    """Repair cost (per episode, compared − reference) over the success gained, in points."""

    measure: str
    gain_points: float
    cost_per_episode: float
    per_point: Interval | NotAvailable  # percentile interval of a task bootstrap


def cost_per_point(
    paired: Sequence[tuple[str, bool, bool, float, float]],
    measure: str,
    resampler: Resampler | None = None,
) -> CostPerPoint | NotAvailable:
    """From (task, reference success, compared success, reference cost, compared cost) per
    paired episode: the cost per episode of one percentage point of success gained, with a
    95% interval by resampling tasks (``BOOTSTRAP_REPLICATES``, a fixed seed; ``resampler``
    shares the draws between calls)."""
    if not paired:
        return NotAvailable("no paired episodes")
    tasks: dict[str, list[float]] = {}
    for task, ref, cmp, ref_cost, cmp_cost in paired:
        row = tasks.setdefault(task, [0.0, 0.0, 0.0])
        row[0] += int(cmp) - int(ref)
        row[1] += cmp_cost - ref_cost
        row[2] += 1
    table = np.array(list(tasks.values()))
    gain, cost, n = (float(v) for v in table.sum(axis=0))
    if gain <= 0:
        return NotAvailable("no success gained: no cost per point")
    estimate = cost / (100.0 * gain)
    result = CostPerPoint(
        measure, 100.0 * gain / n, cost / n, Interval(estimate, estimate, estimate)
    )
    if len(tasks) < 2:
        return _with(result, NotAvailable("1 task: a task bootstrap needs at least 2"))
    weights = (resampler or Resampler()).weights(len(tasks))
    gains = weights @ table[:, 0]
    costs = weights @ table[:, 1]
    if np.mean(gains <= 0) > 0.025:
        why = "the gain's bootstrap interval reaches 0: the cost per point is unbounded"
        return _with(result, NotAvailable(why))
    ratios = np.where(gains > 0, costs / (100.0 * np.maximum(gains, 1e-12)), np.inf)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return _with(result, Interval(estimate, float(low), float(high)))


def _with(result: CostPerPoint, per_point: Interval | NotAvailable) -> CostPerPoint:
    return CostPerPoint(result.measure, result.gain_points, result.cost_per_episode, per_point)


def episode_costs(proxy_answers: Sequence[Mapping[str, object]]) -> tuple[float, float]:
    """(repair tokens, repair seconds) of one episode from its recorded proxy headers."""

    def value(record: Mapping[str, object], key: str) -> float:
        raw = record.get(key)
        return float(raw) if isinstance(raw, int | float) else 0.0

    tokens = sum(
        value(p, "repair_prompt_tokens") + value(p, "repair_completion_tokens")
        for p in proxy_answers
    )
    return tokens, sum(value(p, "repair_seconds") for p in proxy_answers)
