"""The statistics of the study: intervals, paired tests, multiplicity, rank correlation.

Pure functions over counts. A statistic that the data cannot define (no episodes, no discordant
pairs, an arm that invented no names) is returned as ``NotAvailable`` with the reason, never as 0
or NaN, so that reports can say "n/a (why)" instead of printing a number that means nothing.

Methods: Wilson score interval for a proportion; Newcombe's hybrid score interval for a paired
difference of proportions (1998, method 10 as worked in Altman's *Statistics with Confidence*);
exact McNemar test over episode pairs (the paper's, kept for comparison: it takes trials as
independent); the within-task sign-flip test of no change (exact, the task as the unit); TOST
equivalence of paired success rates with the task as the unit (a null-imposed cluster-robust t,
a task-level variance floor, small-cluster df, one-sided skewness correction; its size at the
margin and the change test's at 0 are measured by ``benchmarks/tost_calibration.py``); Holm's
step-down adjustment; Spearman's rho with average ranks for ties; the ratio of two rates with
an episode-clustered interval.
The numpy parts are vectorised so that the calibration benchmark runs the very code reports use;
distributions come from scipy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy import special as scipy_special

__all__ = [
    "ALPHA",
    "EQUIVALENCE_MARGIN",
    "Z90",
    "Z95",
    "Interval",
    "NotAvailable",
    "PairedTable",
    "RateRatio",
    "TaskClusters",
    "TaskMoments",
    "TaskPairs",
    "Tost",
    "TostArrays",
    "average_ranks",
    "clustered_proportion",
    "difference_interval",
    "difference_intervals",
    "holm",
    "mcnemar_exact_p",
    "normal_cdf",
    "novel_share",
    "null_variance",
    "paired_difference",
    "rate_ratio",
    "sign_flip_p",
    "spearman",
    "t_quantile",
    "tost",
    "tost_arrays",
    "tosts",
    "wilson",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
ArrayLike = npt.ArrayLike

Z95 = 1.959963984540054  # two-sided 95%
Z90 = 1.6448536269514722  # two-sided 90%: the interval that matches TOST at alpha 0.05
EQUIVALENCE_MARGIN = 0.075  # ±7.5 points, the paper's equivalence bound
ALPHA = 0.05  # each one-sided test of TOST; the matching interval is the 90% one


@dataclass(frozen=True)
class NotAvailable:
    """A statistic the data cannot define, and why."""

    reason: str


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float


def normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _wilson_at(p: float, n: float, z: float) -> tuple[float, float]:
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At p = 0 (or 1) the bound is exactly 0 (1); the formula leaves rounding dust.
    low = 0.0 if p == 0 else max(0.0, centre - half)
    high = 1.0 if p == 1 else min(1.0, centre + half)
    return low, high


def wilson(successes: int, n: int, z: float = Z95) -> Interval | NotAvailable:
    """Wilson score interval for ``successes`` out of ``n``."""
    if n <= 0:
        return NotAvailable("no episodes")
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} not in [0, {n}]")
    p = successes / n
    return Interval(p, *_wilson_at(p, n, z))


def clustered_proportion(
    units: Sequence[tuple[int, int]], reason_if_empty: str, z: float = Z95
) -> Interval | NotAvailable:
    """A share pooled over clusters, given as (successes, trials) per cluster (an episode's
    failed calls, say), with Wilson's interval at the effective size n p(1-p)/CR1 variance
    (never above the plain count: clustering is not allowed to make the interval narrower)."""
    successes = sum(s for s, _ in units)
    total = sum(n for _, n in units)
    if total == 0:
        return NotAvailable(reason_if_empty)
    p = successes / total
    used = [(s, n) for s, n in units if n > 0]
    effective = float(total)
    if len(used) >= 2 and 0 < p < 1:
        groups = len(used)
        variance = groups / (groups - 1) * sum((s - p * n) ** 2 for s, n in used) / total**2
        if variance > 0:
            effective = min(effective, p * (1 - p) / variance)
    return Interval(p, *_wilson_at(p, effective, z))


@dataclass(frozen=True)
class PairedTable:
    """The 2x2 table of paired outcomes (reference arm, compared arm)."""

    both: int
    reference_only: int
    compared_only: int
    neither: int

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[bool, bool]]) -> PairedTable:
        both = sum(1 for ref, cmp in pairs if ref and cmp)
        ref_only = sum(1 for ref, cmp in pairs if ref and not cmp)
        cmp_only = sum(1 for ref, cmp in pairs if cmp and not ref)
        return cls(both, ref_only, cmp_only, len(pairs) - both - ref_only - cmp_only)

    @property
    def n(self) -> int:
        return self.both + self.reference_only + self.compared_only + self.neither

    @property
    def difference(self) -> float:
        """Compared minus reference success rate."""
        return (self.compared_only - self.reference_only) / self.n


def _as_interval(value: Interval | NotAvailable) -> Interval:
    if isinstance(value, NotAvailable):  # pragma: no cover - callers check n first
        raise ValueError(value.reason)
    return value


def paired_difference(table: PairedTable, z: float = Z95) -> Interval | NotAvailable:
    """Newcombe's hybrid score interval for (compared − reference) on paired binary outcomes."""
    n = table.n
    if n == 0:
        return NotAvailable("no paired episodes")
    a, b, c, d = table.both, table.reference_only, table.compared_only, table.neither
    p_ref, p_cmp = (a + b) / n, (a + c) / n
    ref = _as_interval(wilson(a + b, n, z))
    cmp = _as_interval(wilson(a + c, n, z))
    # phi with Newcombe's continuity adjustment of the numerator (0 inside [0, n/2]).
    marginals = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    adjusted = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = adjusted / math.sqrt(marginals) if marginals > 0 else 0.0
    lo_cmp, hi_cmp = p_cmp - cmp.low, cmp.high - p_cmp
    lo_ref, hi_ref = p_ref - ref.low, ref.high - p_ref
    theta = p_cmp - p_ref
    low = theta - math.sqrt(max(0.0, lo_cmp**2 - 2 * phi * lo_cmp * hi_ref + hi_ref**2))
    high = theta + math.sqrt(max(0.0, hi_cmp**2 - 2 * phi * hi_cmp * lo_ref + lo_ref**2))
    return Interval(theta, max(-1.0, low), min(1.0, high))


def mcnemar_exact_p(table: PairedTable) -> float | NotAvailable:
    """Two-sided exact McNemar p-value (binomial test on the discordant pairs)."""
    if table.n == 0:
        return NotAvailable("no paired episodes")
    discordant = table.reference_only + table.compared_only
    if discordant == 0:
        return 1.0
    smaller = min(table.reference_only, table.compared_only)
    tail = sum(math.comb(discordant, k) for k in range(smaller + 1)) / 2.0**discordant
    return min(1.0, 2.0 * tail)


# ---------------------------------------------------------------------------------------------
# Equivalence, with the task as the unit


@dataclass(frozen=True)
class TaskPairs:
    """Paired outcomes grouped by task: per task, the sum of (compared − reference) over its
    paired trials and how many trials were paired. The trials of one task are not independent
    (a task is easy or hard for both arms), so the task is the unit of the equivalence test."""

    sums: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, bool, bool]]) -> TaskPairs:
        """From (task id, reference success, compared success) per paired trial."""
        sums: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for task, ref, cmp in pairs:
            sums[task] = sums.get(task, 0) + int(cmp) - int(ref)
            sizes[task] = sizes.get(task, 0) + 1
        order = sorted(sums)
        return cls(tuple(sums[t] for t in order), tuple(sizes[t] for t in order))

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def tasks(self) -> int:
        return len(self.sizes)


def sign_flip_p(pairs: TaskPairs) -> float | NotAvailable:
    """Two-sided exact p of the within-task sign-flip test of no change, the task as the unit.

    Under the null the two arms are exchangeable within each task (all of a task's trials
    swapped together), so each task's sum of (compared − reference) is as likely to carry
    either sign. The statistic is the total sum; its null distribution, a sum of independent
    ±|d_g|, is computed exactly by convolution (no sampling, any number of tasks). Correlated or
    deterministic trials leave it valid, where McNemar's test over episode pairs is not: with
    task heterogeneity its pairs are not independent. With one trial per task it is McNemar's."""
    if pairs.n == 0:
        return NotAvailable("no paired episodes")
    magnitudes = [abs(s) for s in pairs.sums if s != 0]
    if not magnitudes:
        return 1.0
    total = sum(magnitudes)
    distribution = np.zeros(2 * total + 1)
    distribution[total] = 1.0
    for m in magnitudes:
        distribution = 0.5 * (np.roll(distribution, m) + np.roll(distribution, -m))
    observed = abs(sum(pairs.sums))
    values = np.abs(np.arange(-total, total + 1))
    return float(min(1.0, distribution[values >= observed].sum()))


def t_quantile(upper_tail: float | FloatArray, df: ArrayLike) -> FloatArray:
    """Student's t quantile with ``upper_tail`` above it, for each of ``df`` (> 0, fractional df
    allowed), from scipy. ``upper_tail`` may be an array broadcast with ``df``."""
    tails = np.asarray(upper_tail, dtype=float)
    if not bool(np.all((tails > 0.0) & (tails < 0.5))):
        raise ValueError(f"upper tail {upper_tail} not in (0, 0.5)")
    # scipy.special's stdtrit is the lower-tail quantile (what scipy.stats.t.isf computes, the
    # same numbers, without its per-call overhead).
    return np.asarray(-scipy_special.stdtrit(np.asarray(df, dtype=float), tails), dtype=float)


@dataclass(frozen=True)
class _Clusters:
    """Per-replicate arrays of one or many tables of task sums (leading axes are replicates)."""

    sums: FloatArray  # (..., G)
    sizes: FloatArray  # (..., G)
    pairs: FloatArray  # (...)
    estimate: FloatArray  # (...)
    skew: FloatArray  # (...) sample skewness of the per-task mean differences

    @classmethod
    def of(cls, sums: ArrayLike, sizes: ArrayLike) -> _Clusters:
        s = np.asarray(sums, dtype=float)
        n = np.broadcast_to(np.asarray(sizes, dtype=float), s.shape)
        pairs = n.sum(-1)
        means = s / n
        centred = means - means.mean(-1, keepdims=True)
        m2 = (centred**2).mean(-1)
        m3 = (centred**3).mean(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            skew = np.where(m2 > 1e-12, m3 / np.maximum(m2, 1e-12) ** 1.5, 0.0)
        return cls(s, n, pairs, s.sum(-1) / pairs, skew)

    def variance(self, delta: FloatArray) -> FloatArray:
        """The variance the test uses against ``delta``: null-imposed cluster-robust (residuals
        at the tested value, CR1 factor G/(G-1)), never below the least a difference of delta
        can have with the task as the unit: a difference of delta over G tasks whose mean
        differences are each 0 or ±1 (deterministic tasks, every changed task changed one way)
        has variance |delta|(1 - |delta|) / G. Counting pairs instead (/ N) assumed the trials
        of a task independent, which the study's premise denies; at temperature 0 with the
        scripted user that floor let a run that sampled none of the broken tasks (0.925^G of
        them at the margin) declare equivalence: 30.8% size at 15 tasks x 4 trials."""
        groups = self.sums.shape[-1]
        residual = self.sums - self.sizes * delta[..., None]
        cluster = groups / (groups - 1) * (residual * residual).sum(-1) / self.pairs**2
        floor = (np.abs(delta) - delta**2) / groups
        return np.asarray(np.maximum(cluster, floor), dtype=float)

    def excess(self, delta: FloatArray, side: int, alpha: float | FloatArray) -> FloatArray:
        """How far the one-sided statistic against ``delta`` passes its critical value (> 0:
        ``delta`` is rejected). ``side`` -1 tests H0: difference <= delta, +1 H0: >= delta."""
        groups = self.sums.shape[-1]
        residual = self.sums - self.sizes * delta[..., None]
        squares = residual * residual
        total = squares.sum(-1)
        variance = self.variance(delta)
        distance = -side * (self.estimate - delta)
        # Satterthwaite's effective df of the sum of the tasks' squared residuals (a few tasks
        # carrying the variance leave few df), at most G - 1.
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = np.where(
                variance > 0, distance / np.sqrt(variance), np.sign(distance) * np.inf
            )
            fourth = (squares * squares).sum(-1)
            df = np.where(fourth > 0, total * total / fourth - 1.0, groups - 1.0)
        df = np.clip(df, 1.0, groups - 1.0)
        q = t_quantile(alpha, df)
        # One-sided Cornish-Fisher term of the studentised mean: skewed task means make one tail
        # of t heavier; only the tightening direction is applied.
        skew = np.maximum(0.0, side * self.skew)
        q = q + skew * (2.0 * q * q + 1.0) / (6.0 * math.sqrt(groups))
        return np.asarray(statistic - q, dtype=float)

    def bound(self, side: int, margin: float, alpha: float, steps: int = 40) -> FloatArray:
        """The (1 - 2 alpha) interval's end on ``side`` (-1 low, +1 high), found by bisection
        and bracketed so that it lies inside the margin exactly when ``margin`` is rejected."""
        shape = self.estimate.shape
        at_margin = self.excess(np.full(shape, side * margin), side, alpha) > 0
        at_edge = self.excess(np.full(shape, float(side)), side, alpha) > 0
        rejected = np.where(at_margin, side * margin, float(side))
        accepted = np.where(at_margin, self.estimate, side * margin)
        for _ in range(steps):
            middle = (rejected + accepted) / 2.0
            out = self.excess(middle, side, alpha) > 0
            rejected = np.where(out, middle, rejected)
            accepted = np.where(out, accepted, middle)
        end = np.where(at_margin | at_edge, accepted, float(side))
        return np.asarray(np.clip(end, -1.0, 1.0), dtype=float)


TaskClusters = _Clusters  # the public name
QUANTILE_TABLE_POINTS = 4096


@dataclass(frozen=True)
class TaskMoments:
    """``_Clusters``' statistic for many replicates, each shifted by a constant per task
    (``shift`` x trials: the power simulation's "truth moved to the alternative"), from power
    sums over the tasks computed once: every test then costs O(replicates), not
    O(replicates x tasks). ``excess(delta, side, alpha, shift)`` equals ``_Clusters.of(sums -
    sizes * shift, sizes).excess(delta, side, alpha)`` up to rounding (checked in the tests).
    With ``tabled`` the t quantile is interpolated from a table of ``QUANTILE_TABLE_POINTS``
    exact values per alpha (log q against log df; within 1e-5 of the exact quantile, checked in
    the tests): the simulation's thousands of tests cost a table look-up each."""

    groups: int
    pairs: FloatArray  # (R,)
    total: FloatArray  # (R,) sum of the task sums
    skew: FloatArray  # (R,) shift-invariant
    power_sums: dict[tuple[int, int], FloatArray]  # (j, k) -> sum_g s_g^j n_g^k
    tabled: bool = False
    tables: dict[float, tuple[FloatArray, FloatArray]] = field(default_factory=dict)

    def quantile(self, alpha: float | FloatArray, df: FloatArray) -> FloatArray:
        if not self.tabled or np.ndim(alpha) != 0:
            return t_quantile(alpha, df)
        key = float(alpha)
        if key not in self.tables:
            logs = np.linspace(0.0, math.log(max(self.groups - 1.0, 1.0)), QUANTILE_TABLE_POINTS)
            self.tables[key] = (logs, np.log(t_quantile(key, np.exp(logs))))
        logs, values = self.tables[key]  # log q against log df: nearly straight, so few points
        return np.asarray(np.exp(np.interp(np.log(df), logs, values)), dtype=float)

    @classmethod
    def of(cls, sums: ArrayLike, sizes: ArrayLike, *, tabled: bool = False) -> TaskMoments:
        s = np.asarray(sums, dtype=float)
        n = np.broadcast_to(np.asarray(sizes, dtype=float), s.shape)
        clusters = _Clusters.of(s, n)
        s2, n2, sn = s * s, n * n, s * n
        power_sums = {
            (2, 0): s2.sum(-1),
            (1, 1): sn.sum(-1),
            (0, 2): n2.sum(-1),
            (4, 0): (s2 * s2).sum(-1),
            (3, 1): (s2 * sn).sum(-1),
            (2, 2): (sn * sn).sum(-1),
            (1, 3): (sn * n2).sum(-1),
            (0, 4): (n2 * n2).sum(-1),
        }
        return cls(s.shape[-1], clusters.pairs, s.sum(-1), clusters.skew, power_sums, tabled)

    def excess(
        self, delta: FloatArray, side: int, alpha: float | FloatArray, shift: FloatArray
    ) -> FloatArray:
        m, groups = self.power_sums, self.groups
        d = shift + delta  # the residuals s - n (shift + delta) of the shifted data at delta
        squares = m[2, 0] - 2 * d * m[1, 1] + d * d * m[0, 2]
        fourth = (
            m[4, 0] - 4 * d * m[3, 1] + 6 * d**2 * m[2, 2] - 4 * d**3 * m[1, 3] + d**4 * m[0, 4]
        )
        scale = np.maximum(m[4, 0], 1.0)  # rounding of the expanded sums, relative to their size
        squares = np.where(squares > 1e-9 * np.sqrt(scale), squares, 0.0)
        fourth = np.where(fourth > 1e-9 * scale, fourth, 0.0)
        cluster = groups / (groups - 1) * squares / self.pairs**2
        floor = (np.abs(delta) - delta**2) / groups
        variance = np.maximum(cluster, floor)
        estimate = self.total / self.pairs - shift
        distance = -side * (estimate - delta)
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = np.where(
                variance > 0, distance / np.sqrt(variance), np.sign(distance) * np.inf
            )
            df = np.where(fourth > 0, squares * squares / fourth - 1.0, groups - 1.0)
        df = np.clip(df, 1.0, groups - 1.0)
        q = self.quantile(alpha, df)
        skew = np.maximum(0.0, side * self.skew)
        q = q + skew * (2.0 * q * q + 1.0) / (6.0 * math.sqrt(groups))
        return np.asarray(statistic - q, dtype=float)

    def bound(
        self, side: int, margin: float, alpha: float, shift: FloatArray, steps: int = 40
    ) -> FloatArray:
        """``_Clusters.bound`` of the shifted data."""
        estimate = self.total / self.pairs - shift
        shape = estimate.shape
        at_margin = self.excess(np.full(shape, side * margin), side, alpha, shift) > 0
        at_edge = self.excess(np.full(shape, float(side)), side, alpha, shift) > 0
        rejected = np.where(at_margin, side * margin, float(side))
        accepted = np.where(at_margin, estimate, side * margin)
        for _ in range(steps):
            middle = (rejected + accepted) / 2.0
            out = self.excess(middle, side, alpha, shift) > 0
            rejected = np.where(out, middle, rejected)
            accepted = np.where(out, accepted, middle)
        end = np.where(at_margin | at_edge, accepted, float(side))
        return np.asarray(np.clip(end, -1.0, 1.0), dtype=float)


@dataclass(frozen=True)
class TostArrays:
    """Vectorised TOST results (one entry per replicate); see ``tost_arrays``."""

    estimate: FloatArray
    low: FloatArray
    high: FloatArray
    equivalent: BoolArray


def tost_arrays(
    sums: ArrayLike,
    sizes: ArrayLike,
    margin: float = EQUIVALENCE_MARGIN,
    alpha: float = ALPHA,
    *,
    bounds: bool = True,
) -> TostArrays:
    """``tost`` over many tables at once: ``sums`` (..., G) per-task sums of differences, ``sizes``
    broadcast to them. The benchmark's calibration and ``tost`` run this one code.

    ``bounds=False`` skips the bisection and returns the interval's ends as NaN: the verdict is
    the two tests at ±margin, which is what the interval's position says by construction
    (``_Clusters.bound`` brackets each end on the side of the margin its test decides).
    """
    clusters = _Clusters.of(sums, sizes)
    if clusters.sums.shape[-1] < 2:
        raise ValueError("a cluster-robust test needs at least 2 tasks")
    if not bounds:
        shape = clusters.estimate.shape
        lower = clusters.excess(np.full(shape, -margin), -1, alpha) > 0
        upper = clusters.excess(np.full(shape, margin), +1, alpha) > 0
        nan = np.full(shape, np.nan)
        return TostArrays(clusters.estimate, nan, nan, np.asarray(lower & upper, dtype=bool))
    low = clusters.bound(-1, margin, alpha)
    high = clusters.bound(+1, margin, alpha)
    equivalent = (low > -margin) & (high < margin)
    return TostArrays(clusters.estimate, low, high, np.asarray(equivalent, dtype=bool))


@dataclass(frozen=True)
class Tost:
    """Equivalence of two paired success rates within ±margin, the task as the unit.

    ``interval`` is the (1 - 2 alpha) interval the test inverts (90% at the default alpha):
    ``equivalent`` is true exactly when it lies inside (-margin, +margin). ``p_lower`` and
    ``p_upper`` are the smallest alpha at which each one-sided test rejects (1.0 when the
    estimate sits on the far side of that bound).
    """

    margin: float
    alpha: float
    difference: float
    interval: Interval
    p_lower: float  # H0: difference <= -margin
    p_upper: float  # H0: difference >= +margin
    pairs: int
    tasks: int

    @property
    def p(self) -> float:
        return max(self.p_lower, self.p_upper)

    @property
    def equivalent(self) -> bool:
        return self.interval.low > -self.margin and self.interval.high < self.margin

    @property
    def level(self) -> float:
        """The interval's confidence level, 1 - 2 alpha."""
        return 1.0 - 2.0 * self.alpha


def _p_values(clusters: _Clusters, delta: float, side: int) -> FloatArray:
    """Per replicate, the smallest alpha at which the one-sided test against ``delta`` rejects:
    a geometric bisection on alpha (30 steps, the ratio high / low ends below 1 + 3e-8), run for
    every replicate at once; 1.0 where it does not reject even at 0.4999."""
    at = np.full(clusters.estimate.shape, delta)

    def rejects(alpha: FloatArray) -> BoolArray:
        return np.asarray(clusters.excess(at, side, alpha) > 0, dtype=bool)

    low = np.full(at.shape, 1e-12)
    high = np.full(at.shape, 0.4999)
    at_top = rejects(high)
    at_floor = rejects(low)
    for _ in range(30):
        middle = np.sqrt(low * high)  # correctly rounded, as math.sqrt
        out = rejects(middle)
        high = np.where(out, middle, high)
        low = np.where(out, low, middle)
    return np.asarray(np.where(at_top, np.where(at_floor, 1e-12, high), 1.0), dtype=float)


def _wald_variance(sums: FloatArray, sizes: FloatArray) -> FloatArray:
    """Per row, the CR1 variance of the pooled difference at its own estimate."""
    groups = sums.shape[-1]
    pairs = sizes.sum(-1)
    estimate = sums.sum(-1) / pairs
    residual = sums - sizes * estimate[..., None]
    return np.asarray(groups / (groups - 1) * (residual * residual).sum(-1) / pairs**2)


def _wald_arrays(
    sums: FloatArray, sizes: FloatArray, alpha: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(estimate, low, high) per row: the task-level t interval of the pooled difference (CR1
    variance at the estimate, Student's t with G - 1 df), clamped to [-1, 1]."""
    groups = sums.shape[-1]
    estimate = sums.sum(-1) / sizes.sum(-1)
    variance = _wald_variance(sums, sizes)
    half = float(t_quantile(alpha, [groups - 1.0])[0]) * np.sqrt(variance)
    return estimate, np.clip(estimate - half, -1.0, 1.0), np.clip(estimate + half, -1.0, 1.0)


def difference_interval(pairs: TaskPairs, alpha: float = 0.025) -> Interval | NotAvailable:
    """Compared − reference with its (1 - 2 alpha) task-level t interval (95% by default):
    CR1 variance at the estimate, t with G - 1 df (with equal trials per task, the t interval
    of the task means). Not TOST's null-imposed inversion: that statistic is bounded by
    sqrt(G - 1), so at a dozen tasks its 95% interval can reach ±100 points (median width ~130
    points at 11 tasks x 4 against ~16-48 for this one); the verdict keeps TOST's own 90%.
    Where every task has the same difference (no spread), TOST's inversion is used instead."""
    if pairs.n == 0:
        return NotAvailable("no paired episodes")
    if pairs.tasks < 2:
        return NotAvailable(f"{pairs.tasks} task: a task-level interval needs at least 2 tasks")
    return difference_intervals([pairs], alpha)[0]


def difference_intervals(
    tables: Sequence[TaskPairs], alpha: float = 0.025
) -> list[Interval | NotAvailable]:
    """``difference_interval`` of each table; tables whose tasks have the same sizes (a sweep
    over budgets of one pairing) are computed in one vectorised pass, with the same result."""
    out: list[Interval | NotAvailable] = []
    batch: dict[tuple[int, ...], list[int]] = {}
    for index, table in enumerate(tables):
        if table.n == 0 or table.tasks < 2:
            out.append(difference_interval(table, alpha))
            continue
        out.append(NotAvailable("pending"))
        batch.setdefault(table.sizes, []).append(index)
    for sizes, members in batch.items():
        sums = np.array([tables[i].sums for i in members], dtype=float)
        size_array = np.broadcast_to(np.array(sizes, dtype=float), sums.shape)
        estimate, low, high = _wald_arrays(sums, size_array, alpha)
        # Where every task has the same difference the t interval has no spread and would read
        # as certainty ([0, 0] from 2 tasks): those rows take TOST's inversion, with its floor.
        flat = np.ptp(sums / size_array, axis=-1) == 0.0
        if flat.any():
            inverted = tost_arrays(sums[flat], size_array[flat], alpha=alpha)
            low[flat], high[flat] = inverted.low, inverted.high
        for row, i in enumerate(members):
            out[i] = Interval(float(estimate[row]), float(low[row]), float(high[row]))
    return out


def null_variance(pairs: TaskPairs, delta: float) -> float:
    """The variance of the estimated difference that the test uses against ``delta``."""
    clusters = _Clusters.of(np.array([pairs.sums]), np.array([pairs.sizes]))
    return float(clusters.variance(np.array([delta]))[0])


def tost(
    pairs: TaskPairs, margin: float = EQUIVALENCE_MARGIN, alpha: float = ALPHA
) -> Tost | NotAvailable:
    """TOST of |compared − reference| < ``margin`` (fractions: 0.075 = 7.5 points) on paired
    trials grouped by task: a null-imposed cluster-robust t with a small-cluster df (see
    ``_Clusters.excess``); ``benchmarks/tost_calibration.py`` measures its size at the margin."""
    return tosts([pairs], margin, alpha)[0]


def tosts(
    tables: Sequence[TaskPairs], margin: float = EQUIVALENCE_MARGIN, alpha: float = ALPHA
) -> list[Tost | NotAvailable]:
    """``tost`` of each table; tables whose tasks have the same sizes are tested in one
    vectorised pass (interval ends and p-values alike), with the same result."""
    out: list[Tost | NotAvailable] = []
    batch: dict[tuple[int, ...], list[int]] = {}
    for index, pairs in enumerate(tables):
        if pairs.n == 0:
            out.append(NotAvailable("no paired episodes"))
        elif pairs.tasks < 2:
            out.append(
                NotAvailable(f"{pairs.tasks} task: a task-level test needs at least 2 tasks")
            )
        else:
            out.append(NotAvailable("pending"))
            batch.setdefault(pairs.sizes, []).append(index)
    for sizes, members in batch.items():
        sums = np.array([tables[i].sums for i in members], dtype=float)
        sizes_array = np.array(sizes, dtype=float)
        result = tost_arrays(sums, sizes_array, margin, alpha)
        clusters = _Clusters.of(sums, sizes_array)
        p_lower = _p_values(clusters, -margin, -1)
        p_upper = _p_values(clusters, margin, +1)
        for row, i in enumerate(members):
            difference = float(result.estimate[row])
            out[i] = Tost(
                margin=margin,
                alpha=alpha,
                difference=difference,
                interval=Interval(difference, float(result.low[row]), float(result.high[row])),
                p_lower=float(p_lower[row]),
                p_upper=float(p_upper[row]),
                pairs=tables[i].n,
                tasks=tables[i].tasks,
            )
    return out


def holm(p_values: Sequence[float | NotAvailable]) -> list[float | NotAvailable]:
    """Holm step-down adjusted p-values; unavailable entries stay unavailable and do not count."""
    indexed = sorted(
        ((p, i) for i, p in enumerate(p_values) if not isinstance(p, NotAvailable)),
        key=lambda item: item[0],
    )
    m = len(indexed)
    adjusted: list[float | NotAvailable] = list(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_rank = (start + end) / 2 + 1
        for position in range(start, end + 1):
            ranks[order[position]] = mean_rank
        start = end + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | NotAvailable:
    """Spearman's rho: Pearson correlation of average ranks."""
    if len(x) != len(y):
        raise ValueError("x and y differ in length")
    if len(x) < 2:
        return NotAvailable(f"{len(x)} value(s): a rank correlation needs at least 2")
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        constant = "first" if sxx == 0 else "second"
        return NotAvailable(f"all values of the {constant} series are equal (no ranking)")
    return sxy / math.sqrt(sxx * syy)


def novel_share(
    reference: Mapping[str, int], compared: Mapping[str, int]
) -> tuple[int, int] | NotAvailable:
    """(compared-arm calls with names absent from the reference arm, all compared-arm calls)."""
    total = sum(compared.values())
    if total == 0:
        return NotAvailable("the compared arm invented no tool names")
    novel = sum(count for name, count in compared.items() if reference.get(name, 0) == 0)
    return novel, total


@dataclass(frozen=True)
class RateRatio:
    """Compared arm's rate over the reference arm's (events per unit of exposure, e.g. failed
    calls per agent call), with its interval."""

    ratio: Interval
    reference_rate: float
    compared_rate: float
    reference_events: int
    reference_exposure: int
    compared_events: int
    compared_exposure: int


def _log_ratio_variance(units: Sequence[tuple[int, int]]) -> tuple[float, float, int, int]:
    """(rate, variance of log rate, events, exposure) of a ratio estimator over clusters."""
    events = sum(e for e, _ in units)
    exposure = sum(x for _, x in units)
    rate = events / exposure
    groups = len(units)
    spread = sum((e - rate * x) ** 2 for e, x in units)
    variance = groups / (groups - 1) * spread / exposure**2
    return rate, variance / rate**2, events, exposure


def rate_ratio(
    reference: Sequence[tuple[int, int]], compared: Sequence[tuple[int, int]], z: float = Z95
) -> RateRatio | NotAvailable:
    """Ratio of two rates, each given as (events, exposure) per episode. Each arm's rate is a
    ratio estimator with an episode-clustered (CR1) variance; the arms are independent runs;
    the interval is the delta method on the log scale."""
    for name, units in (("reference", reference), ("compared", compared)):
        used = [u for u in units if u[1] > 0]
        if len(used) < 2:
            return NotAvailable(f"the {name} arm has {len(used)} episode(s) with exposure")
        if sum(e for e, _ in used) == 0:
            return NotAvailable(f"the {name} arm has no events")
    ref_rate, ref_var, ref_events, ref_exposure = _log_ratio_variance(
        [u for u in reference if u[1] > 0]
    )
    cmp_rate, cmp_var, cmp_events, cmp_exposure = _log_ratio_variance(
        [u for u in compared if u[1] > 0]
    )
    ratio = cmp_rate / ref_rate
    half = z * math.sqrt(ref_var + cmp_var)
    return RateRatio(
        ratio=Interval(ratio, ratio * math.exp(-half), ratio * math.exp(half)),
        reference_rate=ref_rate,
        compared_rate=cmp_rate,
        reference_events=ref_events,
        reference_exposure=ref_exposure,
        compared_events=cmp_events,
        compared_exposure=cmp_exposure,
    )
