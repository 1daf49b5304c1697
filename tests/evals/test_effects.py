"""The reviewer's numbers against their references: pass^k against τ²-bench's own computation
(its pandas code, restated), Clopper-Pearson against scipy, the task-level odds ratio's ends
against a published t table, the simulated power against a fresh simulation, the task bootstrap
against scipy's."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from evals.analysis import effects
from evals.analysis.stats import (
    EQUIVALENCE_MARGIN,
    Interval,
    NotAvailable,
    PairedTable,
    TaskPairs,
    tost_arrays,
)
from evals.tau2.reward import pass_hat_ks as engine_pass_hat_ks

pd = pytest.importorskip("pandas")
scipy_stats = pytest.importorskip("scipy.stats")


def _tau2_pass_hat_ks(rows: list[tuple[str, float]], num_trials: int) -> dict[int, float]:
    """τ²-bench's ``get_metrics_df`` / ``get_tasks_pass_hat_k`` / ``compute_metrics`` path."""
    df = pd.DataFrame(rows, columns=["task_id", "reward"])
    df["success"] = df.reward.apply(lambda r: (1 - 1e-6) <= r <= (1 + 1e-6))
    max_k = num_trials
    min_k = min(count for _, count in df.task_id.value_counts().items())
    max_k = min(max_k, min_k)
    out = {}
    for k in range(1, max_k + 1):
        per_task = df.groupby("task_id")["success"].apply(
            lambda g, k=k: math.comb(int(g.sum()), k) / math.comb(len(g), k)
        )
        out[k] = float(per_task.mean())
    return out


def test_pass_hat_k_is_tau2_benchs_on_the_same_file() -> None:
    rng = random.Random(7)
    rows = [
        (f"task_{t}", 1.0 if rng.random() < 0.2 + 0.06 * t else 0.0)
        for t in range(12)
        for _ in range(4)
    ]
    rows += [("task_extra", 1.0), ("task_extra", 1.0), ("task_extra", 0.0)]  # 3 trials: k <= 3
    ours = effects.pass_hat_ks(rows, num_trials=4)
    reference = _tau2_pass_hat_ks(rows, num_trials=4)
    assert set(ours) == set(reference) == {1, 2, 3}
    for k, value in reference.items():
        got = ours[k]
        assert isinstance(got, Interval)
        assert got.estimate == pytest.approx(value, abs=1e-12)
        assert 0.0 <= got.low <= got.estimate <= got.high <= 1.0
    by_task: dict[str, list[float]] = {}
    for task, reward in rows:
        by_task.setdefault(task, []).append(reward)
    engine = engine_pass_hat_ks(by_task, num_trials=4)
    assert {k: v.estimate for k, v in ours.items() if isinstance(v, Interval)} == pytest.approx(
        engine
    )


def test_pass_hat_k_counts_a_missing_reward_as_a_failure_and_caps_k_by_the_file() -> None:
    rows = [("a", 1.0), ("a", None), ("b", 1.0), ("b", 1.0)]
    ours = effects.pass_hat_ks(rows, num_trials=1)
    assert list(ours) == [1]
    value = ours[1]
    assert isinstance(value, Interval) and value.estimate == pytest.approx(0.75)
    single = effects.pass_hat_ks([("a", 1.0), ("a", 0.0)])
    assert isinstance(single[1], NotAvailable) and isinstance(single[2], NotAvailable)
    assert effects.pass_hat_ks([]) == {}


@pytest.mark.parametrize(("k", "n"), [(0, 5), (5, 5), (1, 10), (7, 20), (40, 456), (3, 3)])
def test_clopper_pearson_is_scipys_exact_interval(k: int, n: int) -> None:
    low, high = effects.clopper_pearson(k, n)
    expected = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert low == pytest.approx(expected.low, abs=1e-9)
    assert high == pytest.approx(expected.high, abs=1e-9)


def test_paired_odds_ratio_as_in_the_paper_is_the_discordant_split_with_its_exact_interval() -> (
    None
):
    table = PairedTable(both=30, reference_only=8, compared_only=20, neither=42)
    ratio = effects.paired_odds_ratio_as_in_the_paper(table)
    assert isinstance(ratio, Interval)
    assert ratio.estimate == pytest.approx(20 / 8)
    ci = scipy_stats.binomtest(20, 28).proportion_ci(method="exact")
    assert ratio.low == pytest.approx(ci.low / (1 - ci.low), rel=1e-7)
    assert ratio.high == pytest.approx(ci.high / (1 - ci.high), rel=1e-7)
    assert isinstance(
        effects.paired_odds_ratio_as_in_the_paper(PairedTable(5, 0, 0, 5)), NotAvailable
    )
    assert isinstance(
        effects.paired_odds_ratio_as_in_the_paper(PairedTable(5, 0, 3, 5)), NotAvailable
    )


def _score(discordant: list[tuple[int, int]], psi: float) -> float:
    """The task-level score statistic at odds ratio psi, written out for one value."""
    theta = psi / (1 + psi)
    residuals = [c - theta * (b + c) for b, c in discordant if b + c]
    groups = len(residuals)
    return abs(sum(residuals)) / math.sqrt(groups / (groups - 1) * sum(r * r for r in residuals))


def test_task_level_odds_ratio_ends_are_where_the_score_meets_the_published_t() -> None:
    # 11 tasks with discordant pairs: t(0.975, 10) = 2.228 (NIST e-Handbook, 1.3.6.7.2).
    discordant = [(1, 3), (0, 4), (2, 2), (1, 0), (0, 3), (2, 5), (1, 1), (0, 2), (3, 1), (1, 4)]
    discordant += [(0, 1), (0, 0), (0, 0)]  # tasks without discordant pairs do not count
    ratio = effects.paired_odds_ratio(discordant)
    assert isinstance(ratio, Interval)
    assert ratio.estimate == pytest.approx(26 / 11)
    assert _score(discordant, ratio.low) == pytest.approx(2.228, abs=2e-3)
    assert _score(discordant, ratio.high) == pytest.approx(2.228, abs=2e-3)
    assert ratio.low < ratio.estimate < ratio.high


def test_task_level_odds_ratio_widens_when_one_task_carries_the_pairs() -> None:
    # The same 36 vs 12 discordant pairs: spread over 24 tasks, or 24 of them in one task.
    spread = [(1, 2)] * 12 + [(0, 1)] * 12
    lumped = [(1, 1)] * 12 + [(0, 24)]
    a, b = effects.paired_odds_ratio(spread), effects.paired_odds_ratio(lumped)
    assert isinstance(a, Interval) and isinstance(b, Interval)
    assert a.estimate == b.estimate == 3.0
    assert b.high - b.low > a.high - a.low
    # Few tasks carrying the reference-only pairs leave the upper end unbounded, honestly.
    few = effects.paired_odds_ratio([(1, 2)] * 4 + [(0, 1)] * 4)
    assert isinstance(few, NotAvailable) and "unbounded" in few.reason
    assert isinstance(effects.paired_odds_ratio([(0, 0)]), NotAvailable)
    assert isinstance(effects.paired_odds_ratio([(0, 3), (0, 2)]), NotAvailable)  # unbounded
    assert isinstance(effects.paired_odds_ratio([(2, 3)]), NotAvailable)  # one task


def _pairs(seed: int, tasks: int, trials: int, discordance: float) -> TaskPairs:
    rng = random.Random(seed)
    rows = []
    for t in range(tasks):
        for _ in range(trials):
            draw = rng.random()
            ref, cmp = (True, False) if draw < discordance / 2 else (False, True)
            if draw >= discordance:
                ref = cmp = rng.random() < 0.5
            rows.append((f"t{t}", ref, cmp))
    return TaskPairs.from_pairs(rows)


def _fresh_tost_power(pairs: TaskPairs, truth: float, draws: int, seed: int) -> float:
    """TOST's equivalence rate when tasks are drawn afresh from the observed ones, each shifted
    so that the truth is ``truth``: the simulation ``power`` states, rerun with another RNG."""
    rng = np.random.default_rng(seed)
    sums = np.array(pairs.sums, dtype=float)
    sizes = np.array(pairs.sizes, dtype=float)
    shifted = sums - sizes * (sums.sum() / sizes.sum() - truth)
    drawn = rng.integers(0, pairs.tasks, (draws, pairs.tasks))
    return float(tost_arrays(shifted[drawn], sizes[drawn], bounds=False).equivalent.mean())


def test_power_is_the_tests_own_rate_on_resampled_tasks_not_a_normal_approximation() -> None:
    pairs = _pairs(3, tasks=114, trials=4, discordance=0.25)
    result = effects.power(pairs, EQUIVALENCE_MARGIN)
    assert isinstance(result, effects.Power) and result.replicates == effects.POWER_REPLICATES
    fresh = _fresh_tost_power(pairs, 0.0, 4000, seed=99)
    assert result.tost_power == pytest.approx(fresh, abs=0.06)  # 1000 draws: MC SE <= 1.6 points
    # At the stated margin, TOST shows equivalence in about 80% of fresh draws.
    sums, sizes = np.array(pairs.sums, float), np.array(pairs.sizes, float)
    rng = np.random.default_rng(7)
    drawn = rng.integers(0, pairs.tasks, (4000, pairs.tasks))
    shifted = (sums - sizes * sums.sum() / sizes.sum())[drawn]
    shown = tost_arrays(shifted, sizes[drawn], margin=result.margin_at_power, bounds=False)
    assert float(shown.equivalent.mean()) == pytest.approx(0.8, abs=0.06)


def test_power_grows_with_the_run_and_is_not_available_without_variance() -> None:
    small = effects.power(_pairs(1, 10, 4, 0.25), EQUIVALENCE_MARGIN)
    large = effects.power(_pairs(1, 114, 4, 0.25), EQUIVALENCE_MARGIN)
    assert isinstance(small, effects.Power) and isinstance(large, effects.Power)
    assert large.detectable < small.detectable and large.tost_power > small.tost_power
    same = TaskPairs.from_pairs([(f"t{t}", True, True) for t in range(10)])
    assert isinstance(effects.power(same, EQUIVALENCE_MARGIN), NotAvailable)


def test_cost_per_point_is_cost_over_gain_with_a_task_bootstrap_like_scipys() -> None:
    rng = random.Random(11)
    rows = []
    for t in range(60):
        for _ in range(4):
            ref = rng.random() < 0.4
            cmp = ref or rng.random() < 0.3
            rows.append((f"t{t}", ref, cmp, 0.0, float(rng.randint(500, 3000))))
    result = effects.cost_per_point(rows, "repair tokens")
    assert isinstance(result, effects.CostPerPoint)
    gain = sum(int(c) - int(r) for _, r, c, _, _ in rows)
    cost = sum(cc - rc for _, _, _, rc, cc in rows)
    per = result.per_point
    assert isinstance(per, Interval) and per.low < per.estimate < per.high
    assert per.estimate == pytest.approx(cost / (100 * gain))
    assert result.gain_points == pytest.approx(100 * gain / len(rows))
    by_task: dict[str, list[float]] = {}
    for task, r, c, rc, cc in rows:
        row = by_task.setdefault(task, [0.0, 0.0])
        row[0] += int(c) - int(r)
        row[1] += cc - rc
    gains = [v[0] for v in by_task.values()]
    costs = [v[1] for v in by_task.values()]
    reference = scipy_stats.bootstrap(
        (gains, costs),
        lambda g, c: sum(c) / (100 * sum(g)),
        paired=True,
        vectorized=False,
        n_resamples=2000,
        method="percentile",
        random_state=1,
    ).confidence_interval
    assert per.low == pytest.approx(reference.low, rel=0.08)
    assert per.high == pytest.approx(reference.high, rel=0.08)


def test_cost_per_point_with_a_shared_resampler_is_what_each_call_draws_alone() -> None:
    rng = random.Random(3)
    rows = []
    for t in range(30):
        for _ in range(2):
            ref = rng.random() < 0.3
            rows.append((f"t{t}", ref, ref or rng.random() < 0.6, 0.0, float(rng.randint(1, 9))))
    shared = effects.Resampler()
    first = effects.cost_per_point(rows, "repair tokens", shared)
    weights = shared.weights(30)
    again = effects.cost_per_point(rows[::-1], "repair tokens", shared)
    assert shared.weights(30) is weights  # drawn once for 30 tasks
    assert first == effects.cost_per_point(rows, "repair tokens")  # a fresh draw: the same
    assert again == effects.cost_per_point(rows[::-1], "repair tokens")
    assert isinstance(first, effects.CostPerPoint) and isinstance(first.per_point, Interval)


def test_cost_per_point_is_not_available_without_a_gain_that_excludes_zero() -> None:
    flat = [(f"t{t}", True, True, 0.0, 100.0) for t in range(10)]
    assert isinstance(effects.cost_per_point(flat, "repair tokens"), NotAvailable)
    # 15 tasks lose one success, 16 gain one: a gain of 1 of 31, which resampling often undoes.
    noisy = [(f"t{t}", t % 2 == 0, t % 2 == 1, 0.0, 100.0) for t in range(30)]
    noisy.append(("t_extra", False, True, 0.0, 100.0))
    result = effects.cost_per_point(noisy, "repair tokens")
    assert isinstance(result, effects.CostPerPoint)
    assert result.gain_points == pytest.approx(100 / 31)
    assert isinstance(result.per_point, NotAvailable)
    assert "unbounded" in result.per_point.reason
    assert isinstance(effects.cost_per_point([], "repair tokens"), NotAvailable)
