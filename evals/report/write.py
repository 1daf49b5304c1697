"""Write an analysis: ``summary.json`` (every number), ``report.md`` and a self-contained
``report.html`` (the PNG figures embedded as base64), from one ``Summary``.

Rates are fractions in [0, 1] in the JSON and percentages in the text. An undefined statistic is
``{"value": "n/a", "reason": ...}`` in the JSON and "n/a (reason)" in the text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.analysis.definitions import DEFINITIONS
from evals.analysis.stats import EQUIVALENCE_MARGIN, Interval, NotAvailable, RateRatio, Tost
from evals.analysis.summary import (
    BUDGETS,
    ENV_CHANNELS,
    EVENTUAL_RECOVERY,
    NEXT_CALL_RECOVERY,
    PROXY_CHANNELS,
    ArmSummary,
    PairSummary,
    ProxyView,
    Recovery,
    RepairCost,
    Summary,
)
from evals.report import effects as report_effects
from evals.report import pages as report_pages
from evals.report.render import (
    Figure,
    Section,
    estimate,
    interval,
    na,
    number,
    p_value,
    pct,
    points,
    render_html,
    render_markdown,
)

__all__ = ["Figure", "Section", "summary_to_json", "write_report"]

SCHEMA = "repairproxy.analysis/1"
RECOVERY_READINGS = (NEXT_CALL_RECOVERY, EVENTUAL_RECOVERY)


# ---------------------------------------------------------------------------------------------
# JSON


def _value(value: Any) -> Any:
    if isinstance(value, NotAvailable):
        return {"value": "n/a", "reason": value.reason}
    if isinstance(value, Interval):
        return {"estimate": value.estimate, "low": value.low, "high": value.high}
    return value


def _tost(value: Tost | NotAvailable) -> Any:
    if isinstance(value, NotAvailable):
        return _value(value)
    return {
        "method": "task-clustered, null-imposed t (see the definitions)",
        "margin": value.margin,
        "alpha_per_side": value.alpha,
        "difference": value.difference,
        "interval_level": value.level,
        "interval": _value(value.interval),
        "p_lower": value.p_lower,
        "p_upper": value.p_upper,
        "p": value.p,
        "equivalent": value.equivalent,
        "pairs": value.pairs,
        "tasks": value.tasks,
    }


def _rate_ratio(value: RateRatio | NotAvailable) -> Any:
    if isinstance(value, NotAvailable):
        return _value(value)
    return {
        "ratio": _value(value.ratio),
        "reference_rate": value.reference_rate,
        "compared_rate": value.compared_rate,
        "reference": {"events": value.reference_events, "exposure": value.reference_exposure},
        "compared": {"events": value.compared_events, "exposure": value.compared_exposure},
    }


def _proxy(view: ProxyView) -> dict[str, Any]:
    return {
        "answers_recorded": view.answers_recorded,
        "caught_answers_by_channel": view.caught_by_channel,
        "caught_answers": view.caught_answers,
        "changed_answers": view.changed_answers,
        "fixed_answers": view.fixed_answers,
        "fixed_share": _value(view.fixed_share),
        "declined_answers": view.declined_answers,
        "withheld_answers": view.withheld_answers,
        "still_invalid_answers": view.still_invalid_answers,
        "unchecked_answers": view.unchecked_answers,
        "first_answer_not_separable": view.not_separable,
        "repairs": view.repairs,
        "repair_failures": view.repair_failures,
    }


def _cost(cost: RepairCost) -> dict[str, Any]:
    return {
        "episodes_with_headers": cost.episodes_with_headers,
        "extra_upstream_calls_per_episode": _value(cost.extra_upstream_calls),
        "repair_prompt_tokens_per_episode": _value(cost.prompt_tokens),
        "repair_completion_tokens_per_episode": _value(cost.completion_tokens),
        "repair_seconds_per_episode": _value(cost.seconds),
        "overhead_ms_per_answer": _value(cost.overhead_ms_per_answer),
    }


def _arm(arm: ArmSummary) -> dict[str, Any]:
    recovered, followed, failed = arm.recovery_counts
    return {
        "path": arm.path,
        "agent_model": arm.agent_model,
        "cell": arm.cell,
        "mode": arm.mode,
        "max_errors": arm.max_errors,
        "episodes": arm.episodes,
        "scored_episodes": arm.scored,
        "nl_unjudged_episodes": arm.nl_unjudged,
        "episodes_without_reward": arm.no_reward,
        "success": _value(arm.success),
        "success_at_budget": {str(k): _value(v) for k, v in arm.sweep.items()},
        "trajectory_messages_mean": _value(arm.messages_mean),
        "trajectory_messages_median": _value(arm.messages_median),
        "failed_calls_per_episode_mean": _value(arm.failed_calls_mean),
        "termination_reasons": arm.termination,
        "agent_tool_calls": arm.agent_tool_calls,
        "user_failed_calls": arm.user_failed_calls,
        "channel_counts": arm.channel_counts,
        "channel_rates": {k: _value(v) for k, v in arm.channel_rates.items()},
        "raw_hallucinated_calls": arm.raw_hallucinated_calls,
        "raw_hallucination_rate": _value(arm.raw_hallucination_rate),
        "hallucinated_names": arm.names,
        "hallucinated_names_env": arm.names_env,
        "hallucinated_names_proxy": arm.names_proxy,
        "recovery_rate": _value(arm.recovery),
        "recovery": {"recovered": recovered, "followed": followed, "failed_agent_calls": failed},
        "recovery_readings": [
            {
                "reading": r.reading,
                "recovered": r.recovered,
                "of_failed_agent_calls": r.of,
                "share": _value(r.share),
            }
            for r in arm.recovery_readings
        ],
        "proxy": _proxy(arm.proxy),
        "repair_cost": _cost(arm.repair_cost),
        **report_effects.arm_json(arm),
        "run_info": arm.run_info,
        "provenance": arm.provenance,
    }


def _pair(pair: PairSummary) -> dict[str, Any]:
    novel: Any
    if isinstance(pair.novel, NotAvailable):
        novel = _value(pair.novel)
    else:
        novel = {
            "novel": pair.novel[0],
            "total": pair.novel[1],
            "share": pair.novel[0] / pair.novel[1],
        }
    table = pair.table
    return {
        "reference": pair.reference,
        "compared": pair.compared,
        "family": pair.family,
        "paired_episodes": pair.paired,
        "paired_tasks": pair.tasks,
        "unpaired_reference": pair.unpaired_reference,
        "unpaired_compared": pair.unpaired_compared,
        "duplicates_left_out": {
            "reference": pair.duplicates_reference,
            "compared": pair.duplicates_compared,
        },
        "table": {
            "both": table.both,
            "reference_only": table.reference_only,
            "compared_only": table.compared_only,
            "neither": table.neither,
        },
        "difference": _value(pair.difference),
        "change_test": {
            "method": "within-task sign-flip test, exact (the task as the unit)",
            "p": _value(pair.change_p),
            "p_holm": _value(pair.change_p_holm),
        },
        "mcnemar_p": _value(pair.mcnemar_p),
        "mcnemar_p_holm": _value(pair.mcnemar_p_holm),
        "mcnemar_unit": "episode pairs, as in the paper (not valid when tasks differ)",
        "tost": _tost(pair.tost),
        "amplification": {k: _rate_ratio(v) for k, v in pair.amplification.items()},
        "amplification_per_episode": {
            k: _rate_ratio(v) for k, v in pair.amplification_per_episode.items()
        },
        "sweep_gap": {str(k): _value(v) for k, v in pair.sweep_gap.items()},
        "spearman_names": _value(pair.spearman),
        "spearman_name_count": pair.spearman_names,
        "novel_name_share": novel,
        **report_effects.pair_json(pair),
    }


def summary_to_json(summary: Summary) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "equivalence_margin": EQUIVALENCE_MARGIN,
        "budgets": list(BUDGETS),
        "arms": {label: _arm(arm) for label, arm in summary.arms.items()},
        "pairs": [_pair(p) for p in summary.pairs],
        "holm_families": summary.families,
        "definitions": dict(DEFINITIONS),
        "notes": summary.notes,
    }


# ---------------------------------------------------------------------------------------------
# Text


def _arm_sections(summary: Summary) -> list[Section]:
    arms = list(summary.arms.values())
    overview = Section(
        "Arms",
        ["Success = reward 1 at the run's own error budget; Wilson 95% interval."],
        [
            "arm",
            "agent model",
            "budget",
            "episodes scored",
            "success",
            "messages (mean / median)",
            "failed calls / episode",
            "NL unjudged",
            "no reward",
        ],
    )
    for a in arms:
        overview.rows.append(
            [
                a.label,
                a.agent_model or "?",
                str(a.max_errors),
                f"{a.scored} of {a.episodes}",
                interval(a.success),
                f"{number(a.messages_mean, 1)} / {number(a.messages_median, 1)}",
                number(a.failed_calls_mean),
                str(a.nl_unjudged),
                str(a.no_reward),
            ]
        )
    termination = Section("Termination reasons", header=["arm", "reasons"])
    for a in arms:
        termination.rows.append(
            [a.label, ", ".join(f"{reason} {n}" for reason, n in a.termination.items()) or "none"]
        )
    sweep = Section(
        "Budget sweep: success@K'",
        [
            "success@K' = reward 1 AND failed tool calls (agent's and user's) < K', recomputed "
            "from the messages; exact, because τ²-bench ends an episode when its errors reach "
            "the budget."
        ],
        ["arm", *[f"K'={k}" for k in BUDGETS]],
    )
    for a in arms:
        sweep.rows.append([a.label, *[estimate(a.sweep[k]) for k in BUDGETS]])
    channels = Section(
        "Failed agent tool calls by channel",
        [
            "Channel rates per agent tool call the environment ran; user side tool: the agent "
            "called a tool of the user's side (not an invented name). 'raw hallucinated' is "
            "raw_hallucination_rate (see Definitions): invented names in the model's first "
            "answers, the proxy's removed ones included, over the calls of those answers. Recovery "
            "in both readings, each over its own failed calls (see Definitions)."
        ],
        [
            "arm",
            "agent calls",
            *[c.replace("_", " ") for c in ENV_CHANNELS],
            "any",
            "raw hallucinated",
            "user failed calls",
            *[f"recovery: {r}" for r in RECOVERY_READINGS],
        ],
    )
    for a in arms:
        channels.rows.append(
            [
                a.label,
                str(a.agent_tool_calls),
                *[f"{a.channel_counts[c]} ({pct(a.channel_rates[c])})" for c in ENV_CHANNELS],
                f"{a.channel_counts['any']} ({pct(a.channel_rates['any'])})",
                f"{a.raw_hallucinated_calls} ({pct(a.raw_hallucination_rate)})",
                str(a.user_failed_calls),
                *[_recovery(r) for r in a.recovery_readings],
            ]
        )
    proxy = Section(
        "What the proxy caught and fixed",
        [
            "Answers caught in the model's first answer, per channel (from the recorded "
            "x-repairproxy-* headers); fixed, declined, withheld (the proxy refused the re-ask's "
            "reply), still invalid and not separable as in Definitions."
        ],
        [
            "arm",
            "answers",
            *PROXY_CHANNELS,
            "caught answers",
            "not separable",
            "changed",
            "fixed",
            "declined",
            "withheld",
            "still invalid",
            "re-asks",
            "re-ask failed",
        ],
    )
    cost = Section(
        "Repair cost per episode",
        header=[
            "arm",
            "episodes with headers",
            "extra upstream calls",
            "prompt tokens",
            "completion tokens",
            "seconds",
            "proxy overhead ms / answer",
        ],
    )
    for a in arms:
        view = a.proxy
        proxy.rows.append(
            [
                a.label,
                str(view.answers_recorded),
                *[str(view.caught_by_channel.get(c, 0)) for c in PROXY_CHANNELS],
                str(view.caught_answers),
                str(view.not_separable),
                str(view.changed_answers),
                pct(view.fixed_share)
                if isinstance(view.fixed_share, NotAvailable)
                else f"{view.fixed_answers} ({pct(view.fixed_share)})",
                str(view.declined_answers),
                str(view.withheld_answers),
                str(view.still_invalid_answers),
                str(view.repairs),
                str(view.repair_failures),
            ]
        )
        c = a.repair_cost
        cost.rows.append(
            [
                a.label,
                str(c.episodes_with_headers),
                number(c.extra_upstream_calls),
                number(c.prompt_tokens, 0),
                number(c.completion_tokens, 0),
                number(c.seconds),
                number(c.overhead_ms_per_answer),
            ]
        )
    names = Section("Hallucinated tool names (top 15 per arm)", header=["arm", "name → calls"])
    for a in arms:
        top = list(a.names.items())[:15]
        names.rows.append([a.label, ", ".join(f"{n} {k}" for n, k in top) or "none"])
    return [overview, termination, sweep, channels, proxy, cost, names]


def _ratio(value: RateRatio | NotAvailable) -> str:
    if isinstance(value, NotAvailable):
        return na(value)
    r = value.ratio
    return (
        f"{r.estimate:.2f}× [{r.low:.2f}, {r.high:.2f}] "
        f"({value.reference_events}/{value.reference_exposure} → "
        f"{value.compared_events}/{value.compared_exposure})"
    )


def _recovery(reading: Recovery) -> str:
    if isinstance(reading.share, NotAvailable):
        return na(reading.share)
    return f"{interval(reading.share)} of {reading.of}"


def _pair_sections(summary: Summary) -> list[Section]:
    if not summary.pairs:
        return [Section("Pairs", ["No pairs were compared (give --pair REF COMPARED)."])]
    families = Section(
        "Holm families",
        [
            "Fixed before any p-value is seen (the grid file's [families] table, else the built-in "
            "rule). The change test's p (and McNemar's, as in the paper) is Holm-adjusted within "
            "each family only. Equivalence is not "
            "adjusted: a claim that every pair of a family is equivalent is an intersection-union "
            "test, which holds its level without correction."
        ],
        ["family", "holds", "pairs"],
    )
    for name, holds in summary.families.items():
        count = sum(1 for p in summary.pairs if p.family == name)
        families.rows.append([name, holds, str(count)])
    section = Section(
        "Pairs: compared − reference",
        [
            f"Paired by task id and trial; the task is the unit (see Definitions). Difference with "
            f"its task-level 95% t interval (CR1 variance at the estimate, t with G − 1 df; "
            f"where every task has the same difference, which gives a t interval no width, "
            f"TOST's 95% inversion instead); "
            f"change test: the within-task sign-flip test, exact "
            f"(Holm within the family); beside it, as in the paper, McNemar's exact p over episode "
            f"pairs (trials taken as independent: not valid when tasks differ); TOST at "
            f"±{100 * EQUIVALENCE_MARGIN:.1f} points: equivalent exactly when the 90% interval "
            "lies inside the margin. Spearman: rank correlation of per-name hallucination counts "
            "over the union of names (zero-filled, average ranks). Novel share: compared-arm "
            "hallucinated calls whose name never occurs in the reference arm."
        ],
        [
            "family",
            "reference",
            "compared",
            "pairs (tasks)",
            "difference, 95% (points)",
            "change p, sign-flip over tasks (Holm)",
            "McNemar p (Holm), as in the paper",
            "TOST 90% interval (points)",
            "equivalent",
            "Spearman",
            "novel names",
        ],
    )
    gaps = Section(
        "Sweep gap: success@K' difference (points)",
        header=["reference", "compared", *[f"K'={k}" for k in BUDGETS]],
    )
    amplified = Section(
        "Amplification: failed-call rate ratio, compared / reference",
        [
            "Per channel, failed agent calls per agent call in the compared arm over the same in "
            "the reference arm; 95% interval on the log scale, each arm's rate clustered by "
            "episode (the calls of one episode are not independent)."
        ],
        ["reference", "compared", *[c.replace("_", " ") for c in (*ENV_CHANNELS, "any")]],
    )
    for p in summary.pairs:
        if isinstance(p.tost, Tost):
            # Two decimals: the verdict is the interval, so its ends must read as inside or not.
            tost_text = points(p.tost.interval, digits=2)
            equivalent = "yes" if p.tost.equivalent else "no"
        else:
            tost_text, equivalent = na(p.tost), "n/a"
        if isinstance(p.novel, NotAvailable):
            novel = na(p.novel)
        else:
            novel = f"{p.novel[0]}/{p.novel[1]} ({pct(p.novel[0] / p.novel[1])})"
        rho = na(p.spearman) if isinstance(p.spearman, NotAvailable) else f"{p.spearman:.3f}"
        section.rows.append(
            [
                p.family,
                p.reference,
                p.compared,
                f"{p.paired} ({p.tasks})",
                points(p.difference),
                f"{p_value(p.change_p)} ({p_value(p.change_p_holm)})",
                f"{p_value(p.mcnemar_p)} ({p_value(p.mcnemar_p_holm)})",
                tost_text,
                equivalent,
                f"{rho} over {p.spearman_names} names",
                novel,
            ]
        )
        gaps.rows.append([p.reference, p.compared, *[points(p.sweep_gap[k]) for k in BUDGETS]])
        amplified.rows.append(
            [
                p.reference,
                p.compared,
                *[_ratio(p.amplification[c]) for c in (*ENV_CHANNELS, "any")],
            ]
        )
    return [families, section, amplified, gaps]


def definitions_section() -> Section:
    """The study's definitions (``evals.analysis.definitions``), which every table above follows."""
    return Section(
        "Definitions",
        ["Every number of this report follows these; the documentation prints the same text."],
        ["term", "meaning"],
        [[term, text] for term, text in DEFINITIONS],
    )


def write_report(summary: Summary, out_dir: Path, title: str = "repairproxy analysis") -> None:
    """summary.json, the PNG figures, report.md and report.html into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(
        json.dumps(summary_to_json(summary), indent=2, ensure_ascii=False, allow_nan=False) + "\n",
        encoding="utf-8",
    )
    sections = [
        *_arm_sections(summary),
        *_pair_sections(summary),
        *report_effects.effect_sections(summary),
        report_pages.figures_section(summary, out_dir),
        definitions_section(),
        report_pages.provenance_appendix(summary),
    ]
    if summary.notes:
        sections.insert(0, Section("Notes", list(summary.notes)))
    (out_dir / "report.md").write_text(render_markdown(sections, title) + "\n", encoding="utf-8")
    (out_dir / "report.html").write_text(render_html(sections, title) + "\n", encoding="utf-8")
