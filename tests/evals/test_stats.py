"""evals.analysis.stats against hand-computed values, published tables, exact enumeration, and
reference implementations (statsmodels: a test dependency only; scipy's distributions are what the
module itself uses, so those are checked against published tables and closed forms instead)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import statsmodels.api as sm
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from benchmarks import tost_calibration
from evals.analysis.stats import (
    EQUIVALENCE_MARGIN,
    Interval,
    NotAvailable,
    PairedTable,
    RateRatio,
    TaskPairs,
    Tost,
    average_ranks,
    difference_interval,
    difference_intervals,
    holm,
    mcnemar_exact_p,
    novel_share,
    null_variance,
    paired_difference,
    rate_ratio,
    sign_flip_p,
    spearman,
    t_quantile,
    tost,
    tost_arrays,
    tosts,
    wilson,
)


def test_wilson_matches_the_textbook_interval_for_8_of_10() -> None:
    # p = 0.8, z² = 3.8415: centre 0.99207/1.38415 = 0.71674, half 0.31362/1.38415 = 0.22658.
    result = wilson(8, 10)
    assert isinstance(result, Interval)
    assert result.estimate == 0.8
    assert result.low == pytest.approx(0.4902, abs=1e-4)
    assert result.high == pytest.approx(0.9433, abs=1e-4)


def test_wilson_at_the_edges_stays_inside_0_1_and_is_not_degenerate() -> None:
    none = wilson(0, 10)
    assert isinstance(none, Interval)
    assert none.low == 0.0
    assert none.high == pytest.approx(3.8415 / 13.8415, abs=1e-4)  # z²/(n + z²)
    assert wilson(0, 0) == NotAvailable("no episodes")


def test_paired_difference_matches_newcombe_square_and_add_reference() -> None:
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", chapter 8 table
    # (59, 6 / 16, 80): estimate -0.0621, 95% CI -0.1186 to -0.0046.
    result = paired_difference(PairedTable(both=59, reference_only=16, compared_only=6, neither=80))
    assert isinstance(result, Interval)
    assert result.estimate == pytest.approx(-10 / 161)
    assert result.low == pytest.approx(-0.1186, abs=1e-4)
    assert result.high == pytest.approx(-0.0046, abs=1e-4)


def test_paired_difference_without_discordant_pairs_is_still_an_interval() -> None:
    result = paired_difference(PairedTable(5, 0, 0, 5))
    assert isinstance(result, Interval)
    assert result.estimate == 0.0
    assert result.low < 0 < result.high
    assert paired_difference(PairedTable(0, 0, 0, 0)) == NotAvailable("no paired episodes")


def test_mcnemar_exact_is_the_binomial_tail_of_the_discordant_pairs() -> None:
    # 1 vs 6 discordant: 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8/128 = 0.125.
    assert mcnemar_exact_p(PairedTable(10, 1, 6, 3)) == pytest.approx(0.125)
    assert mcnemar_exact_p(PairedTable(10, 0, 0, 3)) == 1.0


def test_holm_by_hand() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_skips_unavailable_values_and_caps_at_one() -> None:
    missing = NotAvailable("no pairs")
    adjusted = holm([0.01, missing, 0.6])
    assert adjusted[0] == pytest.approx(0.02)
    assert adjusted[1] is missing
    assert adjusted[2] == pytest.approx(0.6)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_average_ranks_share_ties() -> None:
    assert average_ranks([10, 20, 20, 5, 20]) == [2.0, 4.0, 4.0, 1.0, 4.0]


def test_spearman_with_ties_by_hand() -> None:
    # ranks x = 1, 2.5, 2.5, 4; y = 1, 3, 2, 4 -> 4.5 / sqrt(4.5 * 5) = 0.948683.
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.948683, abs=1e-6)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_undefined_cases_say_why() -> None:
    flat = spearman([0, 0, 0], [1, 2, 3])
    assert isinstance(flat, NotAvailable)
    assert "first series" in flat.reason
    assert isinstance(spearman([1], [1]), NotAvailable)


def test_novel_share_by_hand() -> None:
    reference = {"lookup_order": 3, "find_user": 1}
    compared = {"lookup_order": 2, "get_refund": 5, "check_order": 1, "find_user": 0}
    assert novel_share(reference, compared) == (6, 8)
    assert isinstance(novel_share(reference, {}), NotAvailable)


# --- reference implementations -------------------------------------------------------------


@pytest.mark.parametrize(("successes", "n"), [(0, 10), (1, 10), (8, 10), (10, 10), (57, 456)])
def test_wilson_matches_statsmodels(successes: int, n: int) -> None:
    result = wilson(successes, n)
    assert isinstance(result, Interval)
    low, high = proportion_confint(successes, n, alpha=0.05, method="wilson")
    assert (result.low, result.high) == pytest.approx((low, high), abs=1e-12)


def test_wilson_bounds_are_exact_at_the_edges() -> None:
    none, every = wilson(0, 7), wilson(7, 7)
    assert isinstance(none, Interval) and isinstance(every, Interval)
    assert none.low == 0.0  # not 5.6e-17
    assert every.high == 1.0


@pytest.mark.parametrize("table", [(10, 1, 6, 3), (59, 16, 6, 80), (5, 0, 9, 2), (3, 4, 4, 3)])
def test_mcnemar_matches_statsmodels_exact(table: tuple[int, int, int, int]) -> None:
    both, ref_only, cmp_only, neither = table
    reference = mcnemar([[both, ref_only], [cmp_only, neither]], exact=True).pvalue
    assert mcnemar_exact_p(PairedTable(*table)) == pytest.approx(reference, abs=1e-12)


def test_holm_matches_statsmodels() -> None:
    p = [0.01, 0.04, 0.03, 0.005, 0.2, 0.0001, 0.049]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


def test_spearman_matches_scipy_with_ties() -> None:
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    y = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]
    assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic)


# Student's t, one-sided upper quantiles, from a published table (NIST/SEMATECH e-Handbook of
# Statistical Methods, section 1.3.6.7.2, "Critical values of the Student's t distribution").
T_TABLE = {
    (1, 0.05): 6.314, (2, 0.05): 2.920, (5, 0.05): 2.015, (10, 0.05): 1.812,
    (30, 0.05): 1.697, (100, 0.05): 1.660, (1, 0.025): 12.706, (10, 0.025): 2.228,
    (30, 0.025): 2.042, (20, 0.005): 2.845, (3, 0.001): 10.215, (60, 0.01): 2.390,
}  # fmt: skip


def test_t_quantile_matches_a_published_table_and_the_closed_forms() -> None:
    for (df, tail), expected in T_TABLE.items():
        assert float(t_quantile(tail, [df])[0]) == pytest.approx(expected, abs=6e-4)
    for tail in (0.05, 0.01, 0.001):
        # df 1 (Cauchy) and df 2 have closed forms.
        assert float(t_quantile(tail, [1])[0]) == pytest.approx(1 / np.tan(np.pi * tail))
        two = 2 * tail
        assert float(t_quantile(tail, [2])[0]) == pytest.approx(np.sqrt(2 / (two * (2 - two)) - 2))
    # Fractional df are used as they are (no flooring): between the neighbouring integers.
    between = float(t_quantile(0.05, [9.7])[0])
    assert float(t_quantile(0.05, [10])[0]) < between < float(t_quantile(0.05, [9])[0])


def _task_data(seed: int, tasks: int, trials: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = np.full(tasks, trials)
    probabilities = rng.dirichlet([2.0, 0.4, 0.3, 2.0], size=tasks)
    counts = np.array([rng.multinomial(trials, p) for p in probabilities])
    return (counts[:, 2] - counts[:, 1]).astype(int), sizes


@pytest.mark.parametrize("seed", range(6))
def test_tost_variance_is_statsmodels_cluster_robust_at_the_estimate(seed: int) -> None:
    sums, sizes = _task_data(seed, tasks=12 + seed, trials=4)
    pairs = TaskPairs(tuple(int(v) for v in sums), tuple(int(v) for v in sizes))
    # One row per paired trial: the task's trials carry its differences in any order.
    rows, groups = [], []
    for task, (total, size) in enumerate(zip(sums, sizes, strict=True)):
        signs = [1] * max(total, 0) + [-1] * max(-total, 0)
        rows += signs + [0] * (size - len(signs))
        groups += [task] * size
    fit = sm.OLS(np.array(rows, dtype=float), np.ones((len(rows), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": np.array(groups)}
    )
    estimate = float(fit.params[0])
    assert estimate == pytest.approx(sum(sums) / sum(sizes))
    # statsmodels' CR1 factor G/(G-1) * (N-1)/(N-K) is G/(G-1) with one regressor.
    if null_variance(pairs, estimate) > (abs(estimate) - estimate**2) / pairs.tasks:
        assert null_variance(pairs, estimate) == pytest.approx(float(fit.bse[0]) ** 2)


def _reference_verdict(sums: np.ndarray, sizes: np.ndarray, margin: float) -> bool:
    """The test written out again with scipy's t and skewness, for one table."""
    groups, pairs = len(sums), sizes.sum()
    estimate = sums.sum() / pairs
    skew = float(scipy.stats.skew(sums / sizes, bias=True)) if np.ptp(sums / sizes) else 0.0
    verdicts = []
    for side in (-1, 1):
        delta = side * margin
        residual = sums - sizes * delta
        variance = max(
            groups / (groups - 1) * (residual**2).sum() / pairs**2,
            (abs(delta) - delta**2) / groups,
        )
        statistic = -side * (estimate - delta) / np.sqrt(variance)
        df = np.clip((residual**2).sum() ** 2 / (residual**4).sum() - 1, 1, groups - 1)
        q = scipy.stats.t.ppf(0.95, df)
        q += max(0.0, side * skew) * (2 * q * q + 1) / (6 * np.sqrt(groups))
        verdicts.append(statistic > q)
    return all(verdicts)


@pytest.mark.parametrize("seed", range(12))
def test_tost_verdict_matches_a_scipy_reimplementation(seed: int) -> None:
    sums, sizes = _task_data(100 + seed, tasks=25, trials=4)
    result = tost(TaskPairs(tuple(int(v) for v in sums), tuple(int(v) for v in sizes)))
    assert isinstance(result, Tost)
    assert result.equivalent == _reference_verdict(sums, sizes, EQUIVALENCE_MARGIN)


# --- TOST: one decision, bounded interval, properties ---------------------------------------


def test_tost_verdict_and_interval_are_one_decision() -> None:
    rng = np.random.default_rng(7)
    for tasks in (10, 25, 114):
        sums = rng.integers(-1, 2, size=(300, tasks)) * rng.integers(0, 2, size=(300, tasks))
        full = tost_arrays(sums, 4)
        fast = tost_arrays(sums, 4, bounds=False)
        assert (full.equivalent == fast.equivalent).all()
        inside = (full.low > -EQUIVALENCE_MARGIN) & (full.high < EQUIVALENCE_MARGIN)
        assert (inside == full.equivalent).all()
        assert ((full.low <= full.estimate) & (full.estimate <= full.high)).all()
        assert ((full.low >= -1.0) & (full.high <= 1.0)).all()


def test_tost_interval_is_clamped_to_minus_one_one() -> None:
    result = tost(TaskPairs((-1, -1, 1), (1, 1, 1)))
    assert isinstance(result, Tost)
    assert result.interval.low == -1.0 and result.interval.high <= 1.0
    assert not result.equivalent


def test_tost_by_hand_far_outside_the_margin() -> None:
    # 10 tasks x 4 trials, the compared arm loses 2 trials of every task: -50 points.
    result = tost(TaskPairs((-2,) * 10, (4,) * 10))
    assert isinstance(result, Tost)
    assert result.difference == pytest.approx(-0.5)
    assert not result.equivalent
    assert result.p_lower == 1.0 and result.p_upper < 0.05  # null-imposed: t <= sqrt(G - 1)
    assert result.interval.high < -EQUIVALENCE_MARGIN


def test_tosts_of_many_tables_equal_each_table_tested_alone() -> None:
    # The report tests every pair in one vectorised pass: batching must not move a number.
    rng = np.random.default_rng(5)
    tables = [TaskPairs((), ()), TaskPairs((1,), (4,))]
    for tasks, size in [(2, 1), (3, 2), (6, 4), (6, 4), (6, 4), (40, 4), (40, 4), (9, 1)]:
        skew = rng.uniform(-1, 1)
        sums = np.clip(np.round(rng.normal(skew * size / 2, size / 2, tasks)), -size, size)
        tables.append(TaskPairs(tuple(int(v) for v in sums), (size,) * tasks))
    alone = [tost(table) for table in tables]
    assert tosts(tables) == alone
    assert all(isinstance(result, Tost) for result in alone[2:])
    assert {r.p_lower for r in alone[2:] if isinstance(r, Tost)} - {1.0}  # not all trivial


def test_t_quantile_of_an_array_of_tails_is_each_tail_alone() -> None:
    tails = np.array([1e-12, 1e-4, 0.025, 0.05, 0.3, 0.4999, 0.05, 0.01])
    dfs = np.array([1.0, 2.0, 3.0, 9.7, 30.0, 113.0, 1.0, 2.0])
    alone = [float(t_quantile(float(t), [d])[0]) for t, d in zip(tails, dfs, strict=True)]
    assert t_quantile(tails, dfs).tolist() == alone
    with pytest.raises(ValueError, match="not in"):
        t_quantile(np.array([0.05, 0.5]), [3.0, 3.0])


def test_tost_needs_two_tasks() -> None:
    assert isinstance(tost(TaskPairs((0,), (100,))), NotAvailable)
    assert tost(TaskPairs((), ())) == NotAvailable("no paired episodes")


def test_task_pairs_group_trials_by_task() -> None:
    pairs = TaskPairs.from_pairs(
        [("b", True, False), ("a", False, True), ("a", True, True), ("b", False, False)]
    )
    assert (pairs.sums, pairs.sizes, pairs.n, pairs.tasks) == ((1, -1), (2, 2), 4, 2)


def test_identical_arms_need_enough_tasks_not_enough_pairs() -> None:
    """The floor counts tasks: 10 tasks x 10 identical trials are 10 units, not 100 (the old
    pair-level floor called them equivalent, p = 0.0096). With every task's difference 0 the
    statistic at ±m is sqrt(G m / (1 - m)) against t(0.95, G - 1): equivalence from G = 36 on,
    whatever the trials per task."""
    result = tost(TaskPairs((0,) * 10, (10,) * 10))
    assert isinstance(result, Tost) and not result.equivalent and result.p > 0.05
    for tasks in (10, 20, 35, 36, 60):
        verdicts = set()
        for trials in (1, 4, 10):
            outcome = tost(TaskPairs((0,) * tasks, (trials,) * tasks))
            assert isinstance(outcome, Tost)
            verdicts.add(outcome.equivalent)
        assert verdicts == {tasks >= 36}, tasks


@pytest.mark.parametrize("trials", [1, 4, 8])
def test_tost_size_on_deterministic_tasks_is_at_most_5_percent_exactly(trials: int) -> None:
    """Deterministic tasks at the margin: each task breaks in the compared arm with probability
    0.075 (all its trials fail, the reference's succeed), else nothing changes. The verdict
    depends only on how many tasks broke, so the size is an exact binomial sum (no sampling).
    The pair-level floor had 30.8% at 15 tasks x 4 trials (0.925^15: no broken task drawn)."""
    from math import comb

    for tasks in (10, 15, 20, 30, 60, 114):
        size = 0.0
        for broken in range(tasks + 1):
            sums = (-trials,) * broken + (0,) * (tasks - broken)
            outcome = tost(TaskPairs(sums, (trials,) * tasks))
            assert isinstance(outcome, Tost)
            if outcome.equivalent:
                m = EQUIVALENCE_MARGIN
                size += comb(tasks, broken) * m**broken * (1 - m) ** (tasks - broken)
        assert size <= 0.05, (tasks, trials, size)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.booleans()), min_size=10, max_size=10)
)
def test_ten_pairs_are_never_equivalent(pairs: list[tuple[int, bool, bool]]) -> None:
    # Why it holds for any 10 pairs: at most 10 tasks, so the floor (0.075 - 0.075²)/G is at
    # least (0.075 - 0.075²)/10 = 0.0833², which caps each
    # one-sided statistic below 2 × 0.075 / 0.0833 = 1.80 (an estimate past the other bound fails
    # that side anyway), under t(0.95, 9) = 1.833, and 10 pairs give at most 9 df.
    result = tost(TaskPairs.from_pairs([(str(t), r, c) for t, r, c in pairs]))
    assert isinstance(result, NotAvailable) or not result.equivalent


def test_calibration_quick_cells_hold_the_level() -> None:
    """A small version of ``python -m benchmarks.tost_calibration``: the deterministic and
    sparse cells where the pair-level floor failed, the change test at 0 beside, under the
    benchmark's own failure rule (5% + 2 MC SE, one re-run with a fresh seed)."""
    rng = np.random.default_rng(tost_calibration.SEED)
    limit = tost_calibration.bound(1000)
    for name in ("deterministic", "sparse-correlated", "unequal-arms"):
        for tasks in (15, 30):
            cell = tost_calibration.Cell(name, tasks, 4)
            row = tost_calibration.run_cell(cell, 1000, rng)
            assert max(row.tost_size, row.change_size) <= limit, row
    # McNemar over episode pairs, as in the paper, does not keep it where trials correlate.
    cell = tost_calibration.Cell("bimodal", 30, 8)
    assert tost_calibration.run_cell(cell, 1000, rng).mcnemar_size > 0.1


def test_the_vectorised_sign_flip_of_the_benchmark_is_sign_flip_p() -> None:
    rng = np.random.default_rng(11)
    for cell in (
        tost_calibration.Cell("bimodal", 12, 4),
        tost_calibration.Cell("missing-trials", 10, 8),
    ):
        sums, sizes, _ = tost_calibration.simulate(cell, 0.0, 200, rng)
        sums[:20] = 0  # all-zero tables: p = 1
        fast = tost_calibration.sign_flip_rejects(sums, cell.trials, alpha=0.2)
        for row, size, verdict in zip(sums, sizes, fast, strict=True):
            table = TaskPairs(tuple(int(v) for v in row), tuple(int(v) for v in size))
            p = sign_flip_p(table)
            assert isinstance(p, float) and (p <= 0.2) == verdict


# --- the change test: within-task sign flips ------------------------------------------------


def _brute_force_sign_flip(sums: tuple[int, ...]) -> float:
    import itertools

    observed = abs(sum(sums))
    hits = 0
    patterns = list(itertools.product((-1, 1), repeat=len(sums)))
    for signs in patterns:
        hits += abs(sum(s * v for s, v in zip(signs, sums, strict=True))) >= observed
    return hits / len(patterns)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-4, 4), min_size=1, max_size=12))
def test_sign_flip_p_is_the_enumeration_of_every_sign_pattern(sums: list[int]) -> None:
    p = sign_flip_p(TaskPairs(tuple(sums), (4,) * len(sums)))
    assert isinstance(p, float)
    assert p == pytest.approx(_brute_force_sign_flip(tuple(sums)), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.integers(0, 20))
def test_sign_flip_with_one_trial_per_task_is_mcnemars_exact_test(
    b: int, c: int, same: int
) -> None:
    sums = (-1,) * b + (1,) * c + (0,) * same
    table = PairedTable(same, b, c, 0)
    assert sign_flip_p(TaskPairs(sums, (1,) * len(sums))) == pytest.approx(mcnemar_exact_p(table))


def test_sign_flip_counts_a_deterministic_task_once_where_mcnemar_counts_its_trials() -> None:
    # 6 of 40 tasks broke in every one of 8 trials: 6 units (p = 2 / 2^6), not 48 pairs.
    sums = (-8,) * 6 + (0,) * 34
    assert sign_flip_p(TaskPairs(sums, (8,) * 40)) == pytest.approx(2 / 2**6)
    paper = mcnemar_exact_p(PairedTable(272, 48, 0, 0))
    assert isinstance(paper, float) and paper < 1e-13
    assert sign_flip_p(TaskPairs((), ())) == NotAvailable("no paired episodes")
    assert sign_flip_p(TaskPairs((0, 0), (3, 3))) == 1.0


# --- rate ratios ------------------------------------------------------------------------------


def _episodes(rng: np.random.Generator, count: int, rate: float) -> list[tuple[int, int]]:
    calls = rng.integers(3, 16, size=count)
    per_episode = rng.beta(2.0, 2.0 * (1 - rate) / rate, size=count)  # episodes differ
    return [(int(rng.binomial(n, p)), int(n)) for n, p in zip(calls, per_episode, strict=True)]


def test_rate_ratio_matches_statsmodels_poisson_with_episode_clusters() -> None:
    rng = np.random.default_rng(11)
    reference, compared = _episodes(rng, 150, 0.1), _episodes(rng, 160, 0.2)
    result = rate_ratio(reference, compared)
    assert isinstance(result, RateRatio)
    units = reference + compared
    events = np.array([e for e, _ in units], dtype=float)
    exposure = np.array([x for _, x in units], dtype=float)
    arm = np.array([0.0] * len(reference) + [1.0] * len(compared))
    fit = sm.GLM(
        events, sm.add_constant(arm), family=sm.families.Poisson(), offset=np.log(exposure)
    ).fit(cov_type="cluster", cov_kwds={"groups": np.arange(len(units))})
    assert result.ratio.estimate == pytest.approx(float(np.exp(fit.params[1])))
    low, high = np.exp(fit.conf_int()[1])
    # The same sandwich; the small-sample factors differ slightly (per arm vs pooled).
    assert result.ratio.low == pytest.approx(low, rel=0.01)
    assert result.ratio.high == pytest.approx(high, rel=0.01)


def test_a_two_and_a_half_fold_channel_reads_about_two_and_a_half() -> None:
    rng = np.random.default_rng(3)
    result = rate_ratio(_episodes(rng, 300, 0.08), _episodes(rng, 300, 0.2))
    assert isinstance(result, RateRatio)
    assert result.ratio.estimate == pytest.approx(2.5, rel=0.1)
    assert result.ratio.low < 2.5 < result.ratio.high


def test_rate_ratio_says_why_when_undefined() -> None:
    assert "no events" in str(rate_ratio([(0, 5), (0, 4)], [(1, 5), (2, 3)]))
    assert "1 episode" in str(rate_ratio([(1, 5)], [(1, 5), (2, 3)]))


def test_difference_interval_is_the_t_interval_of_the_task_means_by_hand() -> None:
    # Equal trials per task: the t interval of the 12 task means, written out with the published
    # t(0.975, 11) = 2.201 (NIST e-Handbook, 1.3.6.7.2).
    sums = (1, 0, -1, 0, 2, 0, 0, -1, 0, 1, 0, 0)
    means = np.array(sums) / 4
    half = 2.201 * means.std(ddof=1) / np.sqrt(12)
    result = difference_interval(TaskPairs(sums, (4,) * 12))
    assert isinstance(result, Interval)
    assert result.estimate == pytest.approx(means.mean())
    assert result.low == pytest.approx(means.mean() - half, abs=2e-4)
    assert result.high == pytest.approx(means.mean() + half, abs=2e-4)
    # No spread at all: not a [0, 0] certainty, TOST's inversion with its floor.
    same = difference_interval(TaskPairs((0, 0), (1, 1)))
    assert isinstance(same, Interval) and (same.low, same.high) == (-1.0, 1.0)


def test_difference_interval_stays_sane_at_eleven_tasks() -> None:
    """TOST's null-imposed inversion reached ±100 points at 11 tasks (its statistic is bounded
    by sqrt(G - 1)); the difference column's interval is the t interval and does not."""
    rng = np.random.default_rng(5)
    sums, sizes, _ = tost_calibration.simulate(
        tost_calibration.Cell("bimodal", 11, 4), 0.0, 400, rng
    )
    widths = []
    for row, size in zip(sums, sizes, strict=True):
        table = TaskPairs(tuple(int(v) for v in row), tuple(int(v) for v in size))
        interval = difference_interval(table)
        assert isinstance(interval, Interval)
        widths.append(interval.high - interval.low)
        inverted = tost(table, alpha=0.025)
        assert isinstance(inverted, Tost)
    assert float(np.median(widths)) < 0.6


def test_difference_intervals_at_once_are_each_tables_own() -> None:
    rng = np.random.default_rng(5)
    sizes = (4,) * 15
    tables = [TaskPairs(tuple(int(v) for v in rng.integers(-2, 3, 15)), sizes) for _ in range(9)]
    tables += [
        TaskPairs((1, -1, 0), (2, 2, 3)),  # other sizes: a pass of its own
        TaskPairs((1,), (4,)),  # one task: n/a, as difference_interval says
        TaskPairs((), ()),
    ]
    together = difference_intervals(tables)
    assert together == [difference_interval(t) for t in tables]
    assert isinstance(together[-1], NotAvailable) and isinstance(together[-2], NotAvailable)


def test_task_moments_are_the_clusters_statistic_of_the_shifted_data() -> None:
    """The power simulation's O(replicates) statistic equals the test's own on shifted data."""
    from evals.analysis.stats import TaskClusters, TaskMoments

    rng = np.random.default_rng(3)
    for tasks, trials in ((10, 1), (30, 4), (114, 8)):
        sums = rng.integers(-trials, trials + 1, (200, tasks)).astype(float)
        sizes = rng.integers(1, trials + 1, (200, tasks)).astype(float)
        sums = np.clip(sums, -sizes, sizes)
        shift = rng.uniform(-0.2, 0.2, 200)
        moments = TaskMoments.of(sums, sizes)
        clusters = TaskClusters.of(sums - sizes * shift[:, None], sizes)
        for delta in (-0.075, 0.0, 0.03, 0.075):
            at = np.full(200, delta)
            for side in (-1, 1):
                expected = clusters.excess(at, side, 0.05)
                got = moments.excess(at, side, 0.05, shift)
                assert np.allclose(got, expected, rtol=1e-7, atol=1e-7)
        for side in (-1, 1):
            assert np.allclose(
                moments.bound(side, 0.075, 0.05, shift),
                clusters.bound(side, 0.075, 0.05),
                atol=1e-7,
            )


def test_the_tabled_t_quantile_is_within_1e_5_of_the_exact_one() -> None:
    from evals.analysis.stats import TaskMoments

    moments = TaskMoments.of(np.zeros((1, 114)), 4, tabled=True)
    df = np.concatenate([np.linspace(1.0, 113.0, 5000), [1.0, 1.5, 2.0, 113.0]])
    for alpha in (0.05, 0.025):
        exact = t_quantile(alpha, df)
        assert np.max(np.abs(moments.quantile(alpha, df) - exact)) < 1e-5
