"""Two arms compared: their episodes paired by (task, trial), and each pair's numbers.

The difference with its task-clustered interval, the sign-flip change test (and the paper's
episode-level McNemar beside it), TOST, the success@K' gaps, the
failed-call amplification, the effect sizes and the repair cost per point gained, computed for
all pairs in one vectorised pass. Split from ``evals.analysis.summary``, which re-exports the
public names and builds on them: it summarises each arm, picks the pairs and their Holm families.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evals.analysis import effects, stats
from evals.analysis.arm_view import ArmSummary
from evals.analysis.episodes import BUDGETS, ENV_CHANNELS, Arm, Episode
from evals.analysis.stats import Interval, NotAvailable

__all__ = [
    "COST_MEASURES",
    "DIFFERENCE_ALPHA",
    "PairSummary",
    "amplification",
    "beyond_budget",
    "keyed_by_trial",
    "scored_episodes",
    "summarize_pair",
    "summarize_pairs",
]


def beyond_budget(budget: int, run_budget: int | None) -> NotAvailable | None:
    """Past the run's own budget the sweep is unknown: those episodes were stopped there."""
    if run_budget is not None and budget > run_budget:
        return NotAvailable(f"beyond the run's budget K={run_budget} (episodes stopped there)")
    return None


def scored_episodes(arm: Arm) -> list[Episode]:
    """The episodes success statistics use: NL assertions nobody judged are counted apart."""
    return [e for e in arm.episodes if not e.nl_unjudged]


@dataclass(frozen=True)
class PairSummary:
    reference: str
    compared: str
    paired: int
    tasks: int  # tasks with at least one paired trial: the unit of the interval and TOST
    unpaired_reference: int
    unpaired_compared: int
    duplicates_reference: int  # repeated (task, trial) episodes left out of the pairing
    duplicates_compared: int
    table: stats.PairedTable
    difference: Interval | NotAvailable  # compared − reference, 95%, task-clustered
    mcnemar_p: float | NotAvailable  # the paper's: episode pairs as units (not valid here)
    tost: stats.Tost | NotAvailable
    sweep_gap: dict[int, Interval | NotAvailable]
    spearman: float | NotAvailable
    spearman_names: int
    novel: tuple[int, int] | NotAvailable
    amplification: dict[str, stats.RateRatio | NotAvailable] = field(default_factory=dict)
    amplification_per_episode: dict[str, stats.RateRatio | NotAvailable] = field(
        default_factory=dict
    )
    odds_ratio: Interval | NotAvailable = field(default=NotAvailable("not computed"))
    odds_ratio_paper: Interval | NotAvailable = field(default=NotAvailable("not computed"))
    # The within-task sign-flip test of no change: the task as the unit.
    change_p: float | NotAvailable = field(default=NotAvailable("not computed"))
    power: effects.Power | NotAvailable = field(default=NotAvailable("not computed"))
    cost_per_point: dict[str, effects.CostPerPoint | NotAvailable] = field(default_factory=dict)
    # (task, reference successes, compared successes, paired trials) per task
    task_shares: tuple[tuple[str, int, int, int], ...] = ()
    # Filled in per Holm family of a report.
    family: str = ""
    mcnemar_p_holm: float | NotAvailable = field(default=NotAvailable("not adjusted yet"))
    change_p_holm: float | NotAvailable = field(default=NotAvailable("not adjusted yet"))


def keyed_by_trial(episodes: Sequence[Episode]) -> tuple[dict[tuple[str, int], Episode], int]:
    """Key episodes by (task id, trial); without trials, by (task id, occurrence). A repeated
    key keeps its first episode; how many were left out is returned beside."""
    keyed: dict[tuple[str, int], Episode] = {}
    occurrences: Counter[str] = Counter()
    duplicates = 0
    for episode in episodes:
        trial = episode.trial
        if trial is None:
            trial = occurrences[episode.task_id]
            occurrences[episode.task_id] += 1
        if (episode.task_id, trial) in keyed:
            duplicates += 1
            continue
        keyed[(episode.task_id, trial)] = episode
    return keyed, duplicates


DIFFERENCE_ALPHA = 0.025  # the difference column's two-sided 95% task-level t interval


def amplification(
    reference: Sequence[Episode], compared: Sequence[Episode], *, per: str = "call"
) -> dict[str, stats.RateRatio | NotAvailable]:
    """Per channel, the compared arm's failed-call rate over the reference's, with an interval
    clustered by episode; ``any`` is every failed agent call. ``per`` "call": failed calls per
    agent call (the rate ratio); "episode": failed calls per episode (the count ratio, which
    also moves with how many calls an arm makes)."""

    channels = (*ENV_CHANNELS, "any")

    def counts(episodes: Sequence[Episode]) -> list[tuple[Mapping[str, int], int]]:
        return [(e.agent_failures, len(e.agent_calls) if per == "call" else 1) for e in episodes]

    ref_counts, cmp_counts = counts(reference), counts(compared)
    return {
        channel: stats.rate_ratio(
            [(failed.get(channel, 0), size) for failed, size in ref_counts],
            [(failed.get(channel, 0), size) for failed, size in cmp_counts],
        )
        for channel in channels
    }


def _budget_tables(
    paired: Sequence[tuple[str, Episode, Episode]], budgets: Sequence[int]
) -> list[stats.TaskPairs]:
    """``TaskPairs`` of success, then of success@K' for each of ``budgets``, from (task,
    reference, compared) per paired trial sorted by task: the tasks and sizes are computed once,
    each table's per-task sums in one numpy pass (the same integers as ``TaskPairs.from_pairs``)."""
    if not paired:
        return [stats.TaskPairs((), ()) for _ in range(len(budgets) + 1)]
    tasks = [task for task, _, _ in paired]
    starts = [i for i in range(len(tasks)) if i == 0 or tasks[i] != tasks[i - 1]]
    sizes = tuple(b - a for a, b in zip(starts, [*starts[1:], len(tasks)], strict=True))
    ref_ok = np.array([r.success for _, r, _ in paired], dtype=bool)
    cmp_ok = np.array([c.success for _, _, c in paired], dtype=bool)
    ref_failed = np.array([r.failed_calls for _, r, _ in paired])
    cmp_failed = np.array([c.failed_calls for _, _, c in paired])

    def table(ref: npt.NDArray[np.bool_], cmp: npt.NDArray[np.bool_]) -> stats.TaskPairs:
        sums = np.add.reduceat(cmp.astype(np.int64) - ref.astype(np.int64), starts)
        return stats.TaskPairs(tuple(int(v) for v in sums), sizes)

    # success_at: successful and stopped before ``k`` failed calls.
    return [table(ref_ok, cmp_ok)] + [
        table(ref_ok & (ref_failed < k), cmp_ok & (cmp_failed < k)) for k in budgets
    ]


@dataclass(frozen=True)
class _Pairing:
    """Two arms' scored episodes paired by (task, trial), and the pairing's task tables."""

    ref_keyed: dict[tuple[str, int], Episode]
    cmp_keyed: dict[tuple[str, int], Episode]
    ref_duplicates: int
    cmp_duplicates: int
    keys: list[tuple[str, int]]
    swept: list[int]  # the budgets both runs reached
    tables: list[stats.TaskPairs]  # success, then success@K' for each swept budget


def _pairing(reference: Arm, compared: Arm) -> _Pairing:
    ref_keyed, ref_duplicates = keyed_by_trial(scored_episodes(reference))
    cmp_keyed, cmp_duplicates = keyed_by_trial(scored_episodes(compared))
    keys = sorted(set(ref_keyed) & set(cmp_keyed))
    swept = [
        k
        for k in BUDGETS
        if not beyond_budget(k, reference.max_errors) and not beyond_budget(k, compared.max_errors)
    ]
    # The difference and every budget's table have the same tasks: one pass for all.
    tables = _budget_tables([(k[0], ref_keyed[k], cmp_keyed[k]) for k in keys], swept)
    return _Pairing(ref_keyed, cmp_keyed, ref_duplicates, cmp_duplicates, keys, swept, tables)


def summarize_pair(
    reference: Arm,
    compared: Arm,
    ref_summary: ArmSummary,
    cmp_summary: ArmSummary,
    *,
    resampler: effects.Resampler | None = None,
) -> PairSummary:
    return summarize_pairs([(reference, compared, ref_summary, cmp_summary)], resampler)[0]


def summarize_pairs(
    pairs: Sequence[tuple[Arm, Arm, ArmSummary, ArmSummary]],
    resampler: effects.Resampler | None = None,
) -> list[PairSummary]:
    """``summarize_pair`` of each (reference, compared, their summaries): the intervals and
    TOSTs of every pair are computed in one vectorised pass per task layout (the same numbers
    as pair by pair; the paper grid's 96 pairs took ~5 s of 1-element numpy calls that way)."""
    resampler = resampler or effects.Resampler()
    pairings = [_pairing(reference, compared) for reference, compared, _, _ in pairs]
    intervals = stats.difference_intervals(
        [table for pairing in pairings for table in pairing.tables], alpha=DIFFERENCE_ALPHA
    )
    tosts = stats.tosts([pairing.tables[0] for pairing in pairings])
    out = []
    offset = 0
    for (reference, compared, ref_summary, cmp_summary), pairing, tost in zip(
        pairs, pairings, tosts, strict=True
    ):
        difference, *gaps = intervals[offset : offset + len(pairing.tables)]
        offset += len(pairing.tables)
        out.append(
            _pair_summary(
                reference,
                compared,
                ref_summary,
                cmp_summary,
                pairing,
                difference,
                gaps,
                tost,
                resampler,
            )
        )
    return out


def _pair_summary(
    reference: Arm,
    compared: Arm,
    ref_summary: ArmSummary,
    cmp_summary: ArmSummary,
    pairing: _Pairing,
    difference: Interval | NotAvailable,
    gaps: Sequence[Interval | NotAvailable],
    tost: stats.Tost | NotAvailable,
    resampler: effects.Resampler,
) -> PairSummary:
    ref_keyed, cmp_keyed, keys = pairing.ref_keyed, pairing.cmp_keyed, pairing.keys
    table = stats.PairedTable.from_pairs(
        [(ref_keyed[k].success, cmp_keyed[k].success) for k in keys]
    )
    by_task = [(k[0], ref_keyed[k].success, cmp_keyed[k].success) for k in keys]
    by_budget = dict(zip(pairing.swept, gaps, strict=True))
    sweep_gap: dict[int, Interval | NotAvailable] = {}
    for k in BUDGETS:
        beyond = beyond_budget(k, reference.max_errors) or beyond_budget(k, compared.max_errors)
        sweep_gap[k] = by_budget[k] if beyond is None else beyond
    union = sorted(set(ref_summary.names) | set(cmp_summary.names))
    rho: float | NotAvailable
    if not union:
        rho = NotAvailable("neither arm invented a tool name")
    elif not ref_summary.names or not cmp_summary.names:
        which = reference.label if not ref_summary.names else compared.label
        rho = NotAvailable(f"{which} invented no tool names")
    else:
        rho = stats.spearman(
            [ref_summary.names.get(n, 0) for n in union],
            [cmp_summary.names.get(n, 0) for n in union],
        )
    ref_all, _ = keyed_by_trial(reference.episodes)
    cmp_all, _ = keyed_by_trial(compared.episodes)
    task_pairs = pairing.tables[0]
    return PairSummary(
        reference=reference.label,
        compared=compared.label,
        paired=len(keys),
        tasks=len({k[0] for k in keys}),
        unpaired_reference=len(ref_keyed) - len(keys),
        unpaired_compared=len(cmp_keyed) - len(keys),
        duplicates_reference=pairing.ref_duplicates,
        duplicates_compared=pairing.cmp_duplicates,
        table=table,
        difference=difference,
        mcnemar_p=stats.mcnemar_exact_p(table),
        tost=tost,
        sweep_gap=sweep_gap,
        spearman=rho,
        spearman_names=len(union),
        novel=stats.novel_share(ref_summary.names, cmp_summary.names),
        amplification=amplification(list(ref_all.values()), list(cmp_all.values())),
        amplification_per_episode=amplification(
            list(ref_all.values()), list(cmp_all.values()), per="episode"
        ),
        odds_ratio=effects.paired_odds_ratio(_discordant_by_task(by_task)),
        odds_ratio_paper=effects.paired_odds_ratio_as_in_the_paper(table),
        change_p=stats.sign_flip_p(task_pairs),
        power=effects.power(task_pairs, stats.EQUIVALENCE_MARGIN),
        cost_per_point=_costs_per_point([(ref_keyed[k], cmp_keyed[k]) for k in keys], resampler),
        task_shares=_task_shares(by_task),
    )


COST_MEASURES = ("repair tokens", "repair seconds")


def _costs_per_point(
    paired: Sequence[tuple[Episode, Episode]], resampler: effects.Resampler
) -> dict[str, effects.CostPerPoint | NotAvailable]:
    """Repair tokens and seconds per episode, per point of success gained (see effects)."""
    rows = [
        (ref.task_id, ref.success, cmp.success, ref.repair_costs, cmp.repair_costs)
        for ref, cmp in paired
    ]
    return {
        measure: effects.cost_per_point(
            [(task, r, c, rc[i], cc[i]) for task, r, c, rc, cc in rows], measure, resampler
        )
        for i, measure in enumerate(COST_MEASURES)
    }


def _discordant_by_task(by_task: Sequence[tuple[str, bool, bool]]) -> list[tuple[int, int]]:
    """(reference-only, compared-only) pairs per task, in task order."""
    tasks: dict[str, list[int]] = {}
    for task, ref, cmp in by_task:
        row = tasks.setdefault(task, [0, 0])
        row[0] += int(ref and not cmp)
        row[1] += int(cmp and not ref)
    return [(row[0], row[1]) for _, row in sorted(tasks.items())]


def _task_shares(
    by_task: Sequence[tuple[str, bool, bool]],
) -> tuple[tuple[str, int, int, int], ...]:
    tasks: dict[str, list[int]] = {}
    for task, ref, cmp in by_task:
        row = tasks.setdefault(task, [0, 0, 0])
        row[0] += ref
        row[1] += cmp
        row[2] += 1
    return tuple((task, row[0], row[1], row[2]) for task, row in sorted(tasks.items()))
