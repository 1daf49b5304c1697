"""The report's sections on what a reviewer asks beyond the difference: pass^k per arm, effect
sizes with what the run could have detected, and repair cost per point of success gained (the
numbers come from ``evals.analysis.effects`` through the summary)."""

from __future__ import annotations

from typing import Any

from evals.analysis.effects import CostPerPoint, Power
from evals.analysis.margins import THIN_MARGIN, MarginGroup, MarginView
from evals.analysis.stats import EQUIVALENCE_MARGIN, Interval, NotAvailable
from evals.analysis.summary import COST_MEASURES, ArmSummary, PairSummary, Summary
from evals.report.render import Section, na, number, points

__all__ = ["arm_json", "effect_sections", "pair_json"]


def _interval_json(value: Interval | NotAvailable) -> Any:
    if isinstance(value, NotAvailable):
        return {"value": "n/a", "reason": value.reason}
    return {"estimate": value.estimate, "low": value.low, "high": value.high}


def _power_json(value: Power | NotAvailable) -> Any:
    if isinstance(value, NotAvailable):
        return {"value": "n/a", "reason": value.reason}
    return {
        "method": (
            f"simulation: {value.replicates} bootstrap draws of the observed tasks, each task's "
            "difference shifted to the alternative, the tests run on each draw"
        ),
        "replicates": value.replicates,
        "standard_error": value.standard_error,
        "detectable_difference_at_80_power": value.detectable,
        "tost_power_at_zero": value.tost_power,
        "margin_shown_at_80_power": value.margin_at_power,
    }


def _cost_json(value: CostPerPoint | NotAvailable) -> Any:
    if isinstance(value, NotAvailable):
        return {"value": "n/a", "reason": value.reason}
    return {
        "gain_points": value.gain_points,
        "cost_per_episode": value.cost_per_episode,
        "per_point": _interval_json(value.per_point),
    }


def _group_json(group: MarginGroup) -> dict[str, Any]:
    return {
        "calls": group.calls,
        "thin": group.thin,
        "thin_share": _interval_json(group.thin_share),
        "median": group.median
        if not isinstance(group.median, NotAvailable)
        else _interval_json(group.median),
    }


def _margins_json(view: MarginView | None) -> Any:
    if view is None:
        return None
    return {
        "thin_below_nats": THIN_MARGIN,
        "answers_with_margins": view.answers_with_margins,
        "all": _group_json(view.all_calls),
        "declared_names": _group_json(view.declared),
        "invented_names": _group_json(view.invented),
    }


def arm_json(arm: ArmSummary) -> dict[str, Any]:
    return {
        "tool_name_margins": _margins_json(arm.margins),
        "pass_hat_k": {str(k): _interval_json(v) for k, v in arm.pass_hat_k.items()},
        "failed_calls_per_episode_histogram": {
            str(k): v for k, v in arm.failed_calls_histogram.items()
        },
    }


def pair_json(pair: PairSummary) -> dict[str, Any]:
    return {
        "odds_ratio_paired": _interval_json(pair.odds_ratio),
        "odds_ratio_paired_as_in_the_paper": _interval_json(pair.odds_ratio_paper),
        "power": _power_json(pair.power),
        "cost_per_point": {k: _cost_json(v) for k, v in pair.cost_per_point.items()},
    }


def _ratio(value: Interval | NotAvailable) -> str:
    if isinstance(value, NotAvailable):
        return na(value)
    return f"{value.estimate:.2f} [{value.low:.2f}, {value.high:.2f}]"


def _pass_section(arms: list[ArmSummary]) -> Section:
    ks = sorted({k for a in arms for k in a.pass_hat_k})
    section = Section(
        "pass^k per arm",
        [
            "τ²-bench's pass^k: per task C(successes, k) / C(trials, k), averaged over tasks, k up "
            "to the fewest trials any task has; every episode of the file, as τ²-bench reads it "
            "(so NL-unjudged episodes count with the reward the file holds). 95% interval: "
            "Student's t over tasks."
        ],
        ["arm", *[f"pass^{k}" for k in ks]],
    )
    for a in arms:
        cells = []
        for k in ks:
            value = a.pass_hat_k.get(k)
            if value is None:
                cells.append("n/a (fewer trials)")
            elif isinstance(value, NotAvailable):
                cells.append(na(value))
            else:
                cells.append(
                    f"{100 * value.estimate:.1f} [{100 * value.low:.1f}, {100 * value.high:.1f}]"
                )
        section.rows.append([a.label, *cells])
    return section


def _power_cells(value: Power | NotAvailable) -> list[str]:
    if isinstance(value, NotAvailable):
        return [na(value)] * 4
    return [
        f"{100 * value.standard_error:.2f}",
        f"{100 * value.detectable:.1f}",
        f"{100 * value.tost_power:.0f}%",
        f"±{100 * value.margin_at_power:.1f}",
    ]


def _effects_section(pairs: list[PairSummary]) -> Section:
    margin = 100 * EQUIVALENCE_MARGIN
    section = Section(
        "Effect sizes and what the run could detect",
        [
            "Difference: compared − reference, task-level 95% t (as the pairs table). Odds "
            "ratio: the paired (conditional) odds ratio compared-only / reference-only with a "
            "95% interval over tasks (a null-imposed cluster-robust score interval, t with G − 1 "
            "df over the tasks with discordant pairs); beside it, as in the paper, the exact "
            "interval of the discordant split with every episode pair independent (its level is "
            "not kept when tasks differ). Power by simulation (1,000 bootstrap draws of the "
            "observed tasks, each task's difference shifted to the alternative, the tests run on "
            "each draw): the smallest true difference the difference column's two-sided 5% test "
            f"finds in 80% of draws; the share of draws in which the ±{margin:.1f}-point TOST "
            "shows equivalence when the true difference is 0; and the smallest margin the TOST "
            "shows in 80% of them. A 'no difference' reading is only as strong as the "
            "detectable difference is small."
        ],
        [
            "reference",
            "compared",
            "difference, 95% (points)",
            "odds ratio, 95% (tasks)",
            "odds ratio, 95% (as in the paper: pairs)",
            "SE (points)",
            "detectable at 80% (points)",
            f"TOST ±{margin:.1f} power at 0",
            "margin shown at 80%",
        ],
    )
    for p in pairs:
        section.rows.append(
            [
                p.reference,
                p.compared,
                points(p.difference),
                _ratio(p.odds_ratio),
                _ratio(p.odds_ratio_paper),
                *_power_cells(p.power),
            ]
        )
    return section


def _cost_cells(value: CostPerPoint | NotAvailable | None, digits: int) -> list[str]:
    if value is None:
        return ["n/a", "n/a"]
    if isinstance(value, NotAvailable):
        return [na(value), ""]
    per = value.per_point
    per_text = (
        na(per)
        if isinstance(per, NotAvailable)
        else f"{per.estimate:.{digits}f} [{per.low:.{digits}f}, {per.high:.{digits}f}]"
    )
    return [number(value.cost_per_episode, digits), per_text]


def _cost_section(pairs: list[PairSummary]) -> Section:
    section = Section(
        "Repair cost per point of success gained",
        [
            "Per pair: the repair cost per episode (compared − reference; the proxy's "
            "repair-prompt + repair-completion tokens, and repair seconds) over the success gained "
            "in percentage points: what one point of success costs per episode. 95% interval: "
            "percentile of a task bootstrap (4,000 resamples of tasks, fixed seed). n/a when no "
            "success was gained or the gain's interval reaches 0 (the ratio is then unbounded)."
        ],
        [
            "reference",
            "compared",
            "gain (points)",
            "extra tokens / episode",
            "tokens per point, 95%",
            "extra seconds / episode",
            "seconds per point, 95%",
        ],
    )
    for p in pairs:
        tokens = p.cost_per_point.get(COST_MEASURES[0])
        seconds = p.cost_per_point.get(COST_MEASURES[1])
        gain = (
            f"{tokens.gain_points:+.1f}"
            if isinstance(tokens, CostPerPoint)
            else points(p.difference)
        )
        section.rows.append(
            [p.reference, p.compared, gain, *_cost_cells(tokens, 0), *_cost_cells(seconds, 3)]
        )
    return section


def _group_cells(group: MarginGroup) -> list[str]:
    if group.calls == 0:
        return ["0", "", ""]
    share = group.thin_share
    if isinstance(share, NotAvailable):
        thin = na(share)
    else:
        low, high = 100 * share.low, 100 * share.high
        thin = f"{group.thin} ({100 * share.estimate:.1f}% [{low:.1f}, {high:.1f}])"
    return [str(group.calls), thin, number(group.median)]


def _margin_section(arms: list[ArmSummary]) -> Section:
    section = Section(
        "Tool-name margins",
        [
            "With the proxy's --margin-probe: per tool call of the model's first answer, the "
            "log-prob of the chosen token minus its strongest rival's, at the token where the "
            "written name leaves the nearest declared name (not its first token: Retail's names "
            f"share prefixes). Thin: under {THIN_MARGIN} nats, where a small perturbation "
            "(quantization) flips the choice. Invented: names the proxy reported unknown in that "
            "answer. Thin share with Wilson 95% at the episode-clustered size; median in nats."
        ],
        [
            "arm",
            "answers",
            "calls",
            "thin",
            "median",
            "declared: calls",
            "declared: thin",
            "declared: median",
            "invented: calls",
            "invented: thin",
            "invented: median",
        ],
    )
    probed = [a for a in arms if a.margins is not None and a.margins.answers_with_margins]
    if not probed:
        section.paragraphs.append(
            "No arm recorded margins: run the proxy with --margin-probe (the paper grid does)."
        )
        section.header = []
        return section
    for a in probed:
        view = a.margins
        assert view is not None
        section.rows.append(
            [
                a.label,
                str(view.answers_with_margins),
                *_group_cells(view.all_calls),
                *_group_cells(view.declared),
                *_group_cells(view.invented),
            ]
        )
    return section


def effect_sections(summary: Summary) -> list[Section]:
    sections = [_pass_section(list(summary.arms.values()))]
    sections.append(_margin_section(list(summary.arms.values())))
    if summary.pairs:
        sections += [_effects_section(summary.pairs), _cost_section(summary.pairs)]
    return sections
