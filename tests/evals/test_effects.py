"""The reviewer's numbers against their references: pass^k against τ²-bench's own computation
(its pandas code, restated), Clopper-Pearson against scipy, the detectable difference against
statsmodels' power solver, the task bootstrap against scipy's."""

from __future__ import annotations

import math
import random

import pytest

from evals.analysis import effects
from evals.analysis.stats import EQUIVALENCE_MARGIN, Interval, NotAvailable, PairedTable, TaskPairs
from evals.tau2.reward import pass_hat_ks as engine_pass_hat_ks

pd = pytest.importorskip("pandas")
scipy_stats = pytest.importorskip("scipy.stats")
power_module = pytest.importorskip("statsmodels.stats.power")


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


def test_paired_odds_ratio_is_the_discordant_split_with_its_exact_interval() -> None:
    table = PairedTable(both=30, reference_only=8, compared_only=20, neither=42)
    ratio = effects.paired_odds_ratio(table)
    assert isinstance(ratio, Interval)
    assert ratio.estimate == pytest.approx(20 / 8)
    ci = scipy_stats.binomtest(20, 28).proportion_ci(method="exact")
    assert ratio.low == pytest.approx(ci.low / (1 - ci.low), rel=1e-7)
    assert ratio.high == pytest.approx(ci.high / (1 - ci.high), rel=1e-7)
    assert isinstance(effects.paired_odds_ratio(PairedTable(5, 0, 0, 5)), NotAvailable)
    assert isinstance(effects.paired_odds_ratio(PairedTable(5, 0, 3, 5)), NotAvailable)


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


def test_detectable_difference_is_statsmodels_normal_power_at_the_runs_standard_error() -> None:
    pairs = _pairs(3, tasks=114, trials=4, discordance=0.25)
    result = effects.power(pairs, EQUIVALENCE_MARGIN)
    assert isinstance(result, effects.Power)
    # One-sample normal test (ratio 0): the effect in standard errors at nobs 1.
    solved = power_module.NormalIndPower().solve_power(
        effect_size=None, nobs1=1, alpha=0.05, power=0.8, ratio=0, alternative="two-sided"
    )
    assert result.detectable / result.standard_error == pytest.approx(solved, rel=1e-3)
    norm = scipy_stats.norm(0.0, result.standard_error)
    z = scipy_stats.norm.ppf(0.95)
    inside = norm.cdf(EQUIVALENCE_MARGIN - z * result.standard_error) - norm.cdf(
        -EQUIVALENCE_MARGIN + z * result.standard_error
    )
    assert result.tost_power == pytest.approx(max(inside, 0.0), abs=1e-9)
    at_margin = effects.power(pairs, result.margin_at_power)
    assert isinstance(at_margin, effects.Power)
    assert at_margin.tost_power == pytest.approx(0.8, abs=1e-6)


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
