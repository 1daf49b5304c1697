"""The shipped grid studies' summary.json, recomputed without the project's analysis code: the
results files read with plain ``json``, each figure rebuilt from its definition with
statsmodels/scipy or by hand (issue 53: "an independent recomputation of the shipped analyses").

Recomputed, per arm: episodes, scored episodes (no unjudged natural-language assertions), episodes
without a reward, success count/rate with its Wilson 95% interval, success@K' (reward 1 and fewer
than K' failed tool calls, agent's and user's: tool messages with ``error: true``) for K' = 1..10
with Wilson intervals, failed calls per episode (mean, histogram), failed agent calls, failed user
calls, agent tool calls, termination reasons, messages per episode (mean, median), pass^k (mean
over tasks, t interval over tasks). Per pair: paired episodes and tasks, unpaired and duplicate
episodes, the 2x2 table, the task-level difference and each budget's (success@K') difference, the
within-task sign-flip p (every sign pattern enumerated) and McNemar's exact p (statsmodels), both
Holm-adjusted within the pair's family (statsmodels), and TOST (p per side, p, the 90% interval
as the test's inversion, the verdict). The TOST p is the project's bisection: checked to lie in
its stated bracket (exact <= shipped <= exact x (1 + 3e-8)), not to 1e-9.

Not recomputed (they need the project's error-message classifier, the proxy's record semantics,
a seeded simulation or nothing raw): failed calls by channel and channel rates, raw hallucination
rate, recovery, proxy counts and repair cost, tool-name margins, amplification, Spearman and
novel-name share, odds ratios, power, cost per point, run_info and provenance (copied metadata).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

STUDIES = Path(__file__).resolve().parents[2] / "studies"
CELLS = ("retail-q4-scripted-k10", "retail-q3-scripted-k10")
MODES = ("off", "reflexive")
PAIRS = (  # the README's --pair arguments, in order (tests/evals/test_shipped_studies.py)
    ("retail-q4-scripted-k10/off", "retail-q4-scripted-k10/reflexive"),
    ("retail-q3-scripted-k10/off", "retail-q3-scripted-k10/reflexive"),
    ("retail-q4-scripted-k10/off", "retail-q3-scripted-k10/off"),
    ("retail-q4-scripted-k10/reflexive", "retail-q3-scripted-k10/reflexive"),
)
STUDY_NAMES = ("cpu-grid", "cpu-grid-probe")
BUDGETS = range(1, 11)
MARGIN = 0.075  # the paper's equivalence margin, ±7.5 points
TOLERANCE = 1e-9
BISECTION_RATIO = 3e-8  # the project's TOST p: geometric bisection, high / low below 1 + 3e-8


@dataclass(frozen=True)
class Episode:
    task: str
    trial: int
    reward: float | None
    scored: bool
    failed_calls: int  # agent's and user's tool messages with error: true
    failed_agent_calls: int
    failed_user_calls: int
    agent_tool_calls: int
    messages: int
    termination: str

    @property
    def success(self) -> bool:
        return self.reward is not None and abs(self.reward - 1.0) <= 1e-6  # τ²-bench's tolerance

    def success_at(self, budget: int) -> bool:
        return self.success and self.failed_calls < budget


def _tool_results(messages: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Every tool result, τ²-bench's MultiToolMessage opened into its parts."""
    for message in messages:
        if message.get("role") != "tool":
            continue
        parts = message.get("tool_messages")
        yield from parts if isinstance(parts, list) else [message]


def _unjudged(reward_info: Mapping[str, Any] | None, task: Mapping[str, Any]) -> bool:
    """A reward that rests on natural-language assertions no judge scored."""
    if not reward_info:
        return False
    if reward_info.get("nl_assertions_scored") is not None:
        return not reward_info["nl_assertions_scored"]
    criteria = task.get("evaluation_criteria") or {}
    basis = reward_info.get("reward_basis") or criteria.get("reward_basis") or []
    has_assertions = bool(criteria.get("nl_assertions"))
    return "NL_ASSERTION" in basis and has_assertions and not reward_info.get("nl_assertions")


def _episodes(path: Path) -> tuple[list[Episode], Mapping[str, Any]]:
    data = json.loads(path.read_text())
    tasks = {str(t["id"]): t for t in data.get("tasks") or []}
    out = []
    for simulation in data["simulations"]:
        messages = simulation.get("messages") or []
        results = list(_tool_results(messages))
        failed = [r for r in results if r.get("error")]
        reward_info = simulation.get("reward_info")
        reward = reward_info.get("reward") if reward_info else None
        task = str(simulation["task_id"])
        out.append(
            Episode(
                task=task,
                trial=int(simulation["trial"]),
                reward=None if reward is None else float(reward),
                scored=not _unjudged(reward_info, tasks.get(task, {})),
                failed_calls=len(failed),
                failed_agent_calls=sum(
                    (r.get("requestor") or "assistant") == "assistant" for r in failed
                ),
                failed_user_calls=sum(r.get("requestor") == "user" for r in failed),
                agent_tool_calls=sum(
                    len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant"
                ),
                messages=len(messages),
                termination=str(simulation.get("termination_reason")),
            )
        )
    return out, data.get("info") or {}


def _wilson(successes: int, n: int) -> dict[str, float]:
    low, high = proportion_confint(successes, n, alpha=0.05, method="wilson")
    return {"estimate": successes / n, "low": float(low), "high": float(high)}


def _t_interval(values: Sequence[float], low: float, high: float) -> dict[str, float]:
    """Mean with the 95% Student t interval over the values (tasks), clamped to [low, high]."""
    mean = statistics.fmean(values)
    half = scipy_stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return {"estimate": mean, "low": max(low, mean - half), "high": min(high, mean + half)}


def _arm_figures(episodes: Sequence[Episode], info: Mapping[str, Any]) -> dict[str, Any]:
    scored = [e for e in episodes if e.scored]
    by_task: dict[str, list[bool]] = {}
    for e in episodes:  # pass^k: every episode, a missing reward fails (τ²-bench)
        by_task.setdefault(e.task, []).append(e.success)
    max_k = min(min(len(v) for v in by_task.values()), int(info.get("num_trials") or 10**9))
    pass_hat = {
        str(k): _t_interval(
            [math.comb(sum(v), k) / math.comb(len(v), k) for v in by_task.values()], 0.0, 1.0
        )
        for k in range(1, max_k + 1)
    }
    return {
        "episodes": len(episodes),
        "scored_episodes": len(scored),
        "nl_unjudged_episodes": len(episodes) - len(scored),
        "episodes_without_reward": sum(e.reward is None for e in episodes),
        "success": _wilson(sum(e.success for e in scored), len(scored)),
        "success_at_budget": {
            str(k): _wilson(sum(e.success_at(k) for e in scored), len(scored)) for k in BUDGETS
        },
        "failed_calls_per_episode_mean": statistics.fmean(e.failed_calls for e in episodes),
        "failed_calls_per_episode_histogram": {
            str(n): c for n, c in sorted(Counter(e.failed_calls for e in episodes).items())
        },
        "agent_tool_calls": sum(e.agent_tool_calls for e in episodes),
        "user_failed_calls": sum(e.failed_user_calls for e in episodes),
        "channel_counts": {"any": sum(e.failed_agent_calls for e in episodes)},
        "termination_reasons": dict(Counter(e.termination for e in episodes)),
        "trajectory_messages_mean": statistics.fmean(e.messages for e in episodes),
        "trajectory_messages_median": float(statistics.median(e.messages for e in episodes)),
        "pass_hat_k": pass_hat,
    }


def _keyed(episodes: Sequence[Episode]) -> tuple[dict[tuple[str, int], Episode], int]:
    """Scored episodes by (task, trial); a repeated key keeps the first."""
    keyed: dict[tuple[str, int], Episode] = {}
    for e in episodes:
        if e.scored:
            keyed.setdefault((e.task, e.trial), e)
    return keyed, sum(e.scored for e in episodes) - len(keyed)


def _task_differences(
    pairs: Sequence[tuple[Episode, Episode]], success: Any
) -> tuple[list[int], list[int]]:
    """Per task (sorted by id): the sum over its trials of compared − reference, and the trials."""
    sums: dict[str, int] = {}
    sizes: Counter[str] = Counter()
    for ref, cmp in pairs:
        sums[ref.task] = sums.get(ref.task, 0) + int(success(cmp)) - int(success(ref))
        sizes[ref.task] += 1
    order = sorted(sums)
    return [sums[t] for t in order], [sizes[t] for t in order]


def sign_flip_p(sums: Sequence[int]) -> float:
    """Exact two-sided p: the share of all 2^G sign patterns of the task sums whose total is at
    least as far from 0 as the observed one."""
    observed = abs(sum(sums))
    patterns = list(itertools.product((1, -1), repeat=len(sums)))
    extreme = sum(
        abs(sum(s * d for s, d in zip(signs, sums, strict=True))) >= observed for signs in patterns
    )
    return extreme / len(patterns)


def _one_sided_p(sums: Sequence[int], sizes: Sequence[int], delta: float, side: int) -> float:
    """TOST's one-sided p against ``delta`` (side -1: H0 difference <= delta; +1: >= delta), from
    the definition: null-imposed CR1 variance over tasks, floored at (|delta| - delta^2) / G,
    Satterthwaite's df of the squared residuals within [1, G - 1]. No skewness term: callers
    check the task means are not skewed toward the side."""
    groups, pairs = len(sums), sum(sizes)
    estimate = sum(sums) / pairs
    residuals = [s - n * delta for s, n in zip(sums, sizes, strict=True)]
    squares = [r * r for r in residuals]
    cr1 = groups / (groups - 1) * sum(squares) / pairs**2
    variance = max(cr1, (abs(delta) - delta * delta) / groups)
    distance = -side * (estimate - delta)
    fourth = sum(q * q for q in squares)
    df = sum(squares) ** 2 / fourth - 1.0 if fourth > 0 else groups - 1.0
    df = min(max(df, 1.0), groups - 1.0)
    if variance == 0:
        return 0.0 if distance > 0 else 1.0
    return float(scipy_stats.t.sf(distance / math.sqrt(variance), df))


def tost_inversion(sums: Sequence[int], sizes: Sequence[int], alpha: float) -> tuple[float, float]:
    """The (1 - 2 alpha) interval TOST inverts: the deltas in [-1, 1] neither one-sided test
    rejects at ``alpha``, found on a grid of 2001 points and refined by bisection."""
    grid = [i / 1000 - 1.0 for i in range(2001)]

    def kept(delta: float, side: int) -> bool:
        return _one_sided_p(sums, sizes, delta, side) >= alpha

    def end(side: int) -> float:
        """The first delta, walking in from the side's edge, that the side's test keeps."""
        ordered = grid if side < 0 else grid[::-1]
        first = next(i for i, delta in enumerate(ordered) if kept(delta, side))
        if first == 0:
            return float(side)
        outer, inner = ordered[first - 1], ordered[first]
        for _ in range(60):
            middle = (outer + inner) / 2
            outer, inner = (middle, inner) if not kept(middle, side) else (outer, middle)
        return inner

    return end(-1), end(+1)


def _skew(values: Sequence[float]) -> float:
    mean = statistics.fmean(values)
    m2 = statistics.fmean((v - mean) ** 2 for v in values)
    m3 = statistics.fmean((v - mean) ** 3 for v in values)
    return m3 / m2**1.5 if m2 > 1e-12 else 0.0


@dataclass(frozen=True)
class Pairing:
    reference: str
    compared: str
    pairs: list[tuple[Episode, Episode]]
    unpaired_reference: int
    unpaired_compared: int
    duplicates: tuple[int, int]

    def differences(self, budget: int | None = None) -> tuple[list[int], list[int]]:
        return _task_differences(
            self.pairs,
            (lambda e: e.success) if budget is None else (lambda e: e.success_at(budget)),
        )


def _pairing(arms: Mapping[str, list[Episode]], reference: str, compared: str) -> Pairing:
    ref, ref_duplicates = _keyed(arms[reference])
    cmp, cmp_duplicates = _keyed(arms[compared])
    keys = sorted(set(ref) & set(cmp))
    return Pairing(
        reference,
        compared,
        [(ref[k], cmp[k]) for k in keys],
        len(ref) - len(keys),
        len(cmp) - len(keys),
        (ref_duplicates, cmp_duplicates),
    )


@dataclass(frozen=True)
class Study:
    summary: Mapping[str, Any]
    arms: dict[str, list[Episode]]
    infos: dict[str, Mapping[str, Any]]
    pairings: list[Pairing]


def _study(name: str) -> Study:
    folder = STUDIES / name
    arms, infos = {}, {}
    for cell, mode in itertools.product(CELLS, MODES):
        arms[f"{cell}/{mode}"], infos[f"{cell}/{mode}"] = _episodes(
            folder / cell / mode / "results.json"
        )
    summary = json.loads((folder / "analysis" / "summary.json").read_text())
    return Study(summary, arms, infos, [_pairing(arms, r, c) for r, c in PAIRS])


def _pair_figures(study: Study) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pairing in study.pairings:
        sums, sizes = pairing.differences()
        assert len(set(sizes)) == 1, "equal trials per task: the task means' mean is the pooled one"
        table = {
            "both": sum(r.success and c.success for r, c in pairing.pairs),
            "reference_only": sum(r.success and not c.success for r, c in pairing.pairs),
            "compared_only": sum(c.success and not r.success for r, c in pairing.pairs),
            "neither": sum(not r.success and not c.success for r, c in pairing.pairs),
        }
        contingency = [
            [table["both"], table["reference_only"]],
            [table["compared_only"], table["neither"]],
        ]
        out.append(
            {
                "reference": pairing.reference,
                "compared": pairing.compared,
                "paired_episodes": len(pairing.pairs),
                "paired_tasks": len(sums),
                "unpaired_reference": pairing.unpaired_reference,
                "unpaired_compared": pairing.unpaired_compared,
                "duplicates_left_out": dict(
                    zip(("reference", "compared"), pairing.duplicates, strict=True)
                ),
                "table": table,
                "difference": {
                    "estimate": statistics.fmean(s / n for s, n in zip(sums, sizes, strict=True))
                },
                "sweep_gap": {
                    str(k): {
                        "estimate": statistics.fmean(
                            s / n for s, n in zip(*pairing.differences(k), strict=True)
                        )
                    }
                    for k in BUDGETS
                },
                "change_test": {"p": sign_flip_p(sums)},
                "mcnemar_p": float(mcnemar(contingency, exact=True).pvalue),
                "tost": {
                    "difference": sum(sums) / sum(sizes),
                    "pairs": sum(sizes),
                    "tasks": len(sums),
                },
            }
        )
    # Holm within each family (the family is the grid's, fixed before any p: taken as shipped).
    families: dict[str, list[int]] = {}
    for index, shipped in enumerate(study.summary["pairs"]):
        families.setdefault(shipped["family"], []).append(index)
    for members in families.values():
        change = multipletests([out[i]["change_test"]["p"] for i in members], method="holm")[1]
        paper = multipletests([out[i]["mcnemar_p"] for i in members], method="holm")[1]
        for i, change_holm, paper_holm in zip(members, change, paper, strict=True):
            out[i]["change_test"]["p_holm"] = float(change_holm)
            out[i]["mcnemar_p_holm"] = float(paper_holm)
    return out


def _leaves(
    expected: Any, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    if isinstance(expected, Mapping):
        for key, value in expected.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(expected, list):
        for index, value in enumerate(expected):
            yield from _leaves(value, (*path, index))
    else:
        yield path, expected


def _at(tree: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _recomputed(study: Study) -> dict[str, Any]:
    return {
        "arms": {
            label: _arm_figures(episodes, study.infos[label])
            for label, episodes in study.arms.items()
        },
        "pairs": _pair_figures(study),
    }


def _mismatches(recomputed: Any, summary: Any) -> tuple[int, list[str]]:
    count, wrong = 0, []
    for path, value in _leaves(recomputed):
        shipped = _at(summary, path)
        count += 1
        if isinstance(value, float) and not isinstance(shipped, bool):
            same = isinstance(shipped, int | float) and abs(shipped - value) <= TOLERANCE
        else:
            same = type(shipped) is type(value) and shipped == value
        if not same:
            wrong.append(f"{'.'.join(map(str, path))}: recomputed {value!r}, shipped {shipped!r}")
    return count, wrong


@pytest.fixture(scope="module", params=STUDY_NAMES)
def study(request: pytest.FixtureRequest) -> Study:
    return _study(request.param)


def test_the_shipped_pairs_are_the_readmes(study: Study) -> None:
    assert [(p["reference"], p["compared"]) for p in study.summary["pairs"]] == list(PAIRS)
    assert sorted(study.summary["arms"]) == sorted(study.arms)
    assert study.summary["budgets"] == list(BUDGETS)
    assert study.summary["equivalence_margin"] == MARGIN


def test_every_recomputed_figure_equals_the_shipped_summary(study: Study) -> None:
    _, wrong = _mismatches(_recomputed(study), study.summary)
    assert wrong == []


def test_tost_equals_its_definition(study: Study) -> None:
    for pairing, shipped in zip(study.pairings, study.summary["pairs"], strict=True):
        sums, sizes = pairing.differences()
        means = [s / n for s, n in zip(sums, sizes, strict=True)]
        assert _skew(means) == 0.0  # no Cornish-Fisher term applies (else: extend this test)
        tost = shipped["tost"]
        assert (tost["margin"], tost["alpha_per_side"], tost["interval_level"]) == (
            MARGIN,
            0.05,
            0.9,
        )
        for side, delta, key in ((-1, -MARGIN, "p_lower"), (+1, MARGIN, "p_upper")):
            exact = _one_sided_p(sums, sizes, delta, side)
            if exact >= 0.4999:
                assert tost[key] == 1.0  # the project reports 1 where it rejects at no level
            else:
                assert exact <= tost[key] <= exact * (1 + BISECTION_RATIO), (key, exact, tost[key])
        assert tost["p"] == max(tost["p_lower"], tost["p_upper"])
        low, high = tost_inversion(sums, sizes, alpha=0.05)
        assert tost["interval"]["low"] == pytest.approx(low, abs=TOLERANCE)
        assert tost["interval"]["high"] == pytest.approx(high, abs=TOLERANCE)
        assert tost["interval"]["estimate"] == sum(sums) / sum(sizes)
        assert tost["equivalent"] is (low > -MARGIN and high < MARGIN)


def _difference_intervals(
    study: Study,
) -> Iterator[tuple[str, list[int], list[int], Mapping[str, float]]]:
    for pairing, shipped in zip(study.pairings, study.summary["pairs"], strict=True):
        name = f"{pairing.reference} vs {pairing.compared}"
        yield f"{name} difference", *pairing.differences(), shipped["difference"]
        for k in BUDGETS:
            yield f"{name} success@{k}", *pairing.differences(k), shipped["sweep_gap"][str(k)]


def test_difference_intervals_with_spread_are_task_level_t_intervals(study: Study) -> None:
    """Where the task differences spread, the shipped interval is the task-level 95% t interval
    (none of the shipped pairs spreads today: every task's difference is 0, so this checks the
    count too and is ready for a study that does)."""
    spread = 0
    for name, sums, sizes, shipped in _difference_intervals(study):
        means = [s / n for s, n in zip(sums, sizes, strict=True)]
        if len(set(means)) == 1:
            continue
        spread += 1
        expected = _t_interval(means, -1.0, 1.0)
        assert shipped["low"] == pytest.approx(expected["low"], abs=TOLERANCE), name
        assert shipped["high"] == pytest.approx(expected["high"], abs=TOLERANCE), name
    assert spread == 0


def test_a_difference_interval_without_spread_is_tosts_95_inversion(study: Study) -> None:
    """What the shipped interval is where the task differences have no spread (all of them here)."""
    flat = 0
    for _, sums, sizes, shipped in _difference_intervals(study):
        if len({s / n for s, n in zip(sums, sizes, strict=True)}) != 1:
            continue
        flat += 1
        low, high = tost_inversion(sums, sizes, alpha=0.025)
        assert (shipped["low"], shipped["high"]) == pytest.approx((low, high), abs=TOLERANCE)
    assert flat == 4 * 11


def test_the_recomputations_own_arithmetic() -> None:
    """The independent helpers against values worked by hand."""
    assert sign_flip_p([1, 1, 1]) == 2 / 8  # only all-plus and all-minus reach |3|
    assert sign_flip_p([2, -1]) == 1.0
    assert sign_flip_p([0, 0]) == 1.0
    # Two tasks, df 1: t's 97.5% quantile is tan(0.475 pi) = 12.706...
    interval = _t_interval([0.0, 1.0], -1.0, 1.0)
    half = math.tan(0.475 * math.pi) * 0.5 / math.sqrt(2)
    assert interval == pytest.approx({"estimate": 0.5, "low": -1.0, "high": min(1.0, 0.5 + half)})
    # Two deterministic tasks, no change: at delta = 0.075 the floor (0.075 - 0.075^2) / 2 rules,
    # df 1 (Cauchy): p = 1/2 - atan(0.075 / sqrt(floor)) / pi.
    floor = (0.075 - 0.075**2) / 2
    expected = 0.5 - math.atan(0.075 / math.sqrt(floor)) / math.pi
    assert _one_sided_p([0, 0], [1, 1], 0.075, +1) == pytest.approx(expected, rel=1e-12)
