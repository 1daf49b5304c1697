"""The statistics of the study: intervals, paired tests, multiplicity, rank correlation.

Pure functions over counts. A statistic that the data cannot define (no episodes, no discordant
pairs, an arm that invented no names) is returned as ``NotAvailable`` with the reason, never as 0
or NaN, so that reports can say "n/a (why)" instead of printing a number that means nothing.

Methods: Wilson score interval for a proportion; Newcombe's hybrid score interval for a paired
difference of proportions (1998, method 10 as worked in Altman's *Statistics with Confidence*);
exact McNemar test; TOST equivalence of paired proportions with a Wald z; Holm's step-down
adjustment; Spearman's rho with average ranks for ties.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "EQUIVALENCE_MARGIN",
    "Z90",
    "Z95",
    "Interval",
    "NotAvailable",
    "PairedTable",
    "Tost",
    "average_ranks",
    "holm",
    "mcnemar_exact_p",
    "normal_cdf",
    "novel_share",
    "paired_difference",
    "spearman",
    "tost",
    "wilson",
]

Z95 = 1.959963984540054  # two-sided 95%
Z90 = 1.6448536269514722  # two-sided 90%: the interval that matches TOST at alpha 0.05
EQUIVALENCE_MARGIN = 0.075  # ±7.5 points, the paper's equivalence bound


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


def wilson(successes: int, n: int, z: float = Z95) -> Interval | NotAvailable:
    """Wilson score interval for ``successes`` out of ``n``."""
    if n <= 0:
        return NotAvailable("no episodes")
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} not in [0, {n}]")
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


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


@dataclass(frozen=True)
class Tost:
    """Two one-sided tests of |compared − reference| < margin (Wald z on paired differences)."""

    margin: float
    difference: float
    standard_error: float
    p_lower: float  # H0: difference <= -margin
    p_upper: float  # H0: difference >= +margin
    ci90: Interval

    @property
    def p(self) -> float:
        return max(self.p_lower, self.p_upper)

    def equivalent(self, alpha: float = 0.05) -> bool:
        return self.p < alpha


def tost(table: PairedTable, margin: float = EQUIVALENCE_MARGIN) -> Tost | NotAvailable:
    """TOST equivalence of two paired success rates at ±``margin`` (fractions, 0.075 = 7.5 pts)."""
    n = table.n
    if n == 0:
        return NotAvailable("no paired episodes")
    b, c = table.reference_only, table.compared_only
    se = math.sqrt(max(0.0, (b + c) - (c - b) ** 2 / n)) / n
    if se == 0.0:
        why = "no discordant pairs" if b + c == 0 else "every discordant pair goes one way"
        return NotAvailable(f"{why}: the paired difference has no estimated variance")
    diff = table.difference
    p_lower = 1.0 - normal_cdf((diff + margin) / se)
    p_upper = normal_cdf((diff - margin) / se)
    ci90 = Interval(diff, diff - Z90 * se, diff + Z90 * se)
    return Tost(margin, diff, se, p_lower, p_upper, ci90)


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
