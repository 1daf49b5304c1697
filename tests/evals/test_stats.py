"""evals.stats against hand-computed values and one published reference table."""

from __future__ import annotations

import math

import pytest

from evals.stats import (
    Interval,
    NotAvailable,
    PairedTable,
    Tost,
    average_ranks,
    holm,
    mcnemar_exact_p,
    novel_share,
    paired_difference,
    spearman,
    tost,
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


def test_tost_by_hand() -> None:
    # b = 5, c = 3, n = 100: d = -0.02, se = sqrt(8 - 4/100)/100 = 0.028213.
    # p_lower = 1 - Φ(0.055/0.028213 = 1.94943) = 0.025621; p_upper = Φ(-3.36721) = 0.000380.
    result = tost(PairedTable(40, 5, 3, 52))
    assert isinstance(result, Tost)
    assert result.difference == pytest.approx(-0.02)
    assert result.standard_error == pytest.approx(math.sqrt(7.96) / 100)
    assert result.p_lower == pytest.approx(0.025621, abs=1e-5)
    assert result.p_upper == pytest.approx(0.000380, abs=1e-5)
    assert result.p == result.p_lower
    assert result.equivalent()
    assert result.ci90.low > -0.075 and result.ci90.high < 0.075


def test_tost_is_not_equivalent_when_the_interval_crosses_the_margin() -> None:
    # b = 10, c = 2, n = 40: d = -0.2, far outside ±0.075.
    result = tost(PairedTable(20, 10, 2, 8))
    assert isinstance(result, Tost)
    assert not result.equivalent()
    assert result.p_lower > 0.5


def test_tost_without_variance_says_why() -> None:
    result = tost(PairedTable(7, 0, 0, 3))
    assert isinstance(result, NotAvailable)
    assert "no discordant pairs" in result.reason


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
