"""From the points and the raw answers to ``screen.json``: rates, paired ratios, the flag rule.

Pure: the same points file and answer log always give byte-identical JSON (no clock, sorted keys),
which is how ``--report`` is checked. Every rate carries its Wilson interval
(``evals.analysis.stats``); each arm is compared with the reference on the points both answered.

Flag rule: an arm is flagged on an error channel when the lower bound of the 95% interval of its
paired rate ratio against the reference exceeds ``FLAG_RATIO`` (1.25): the channel is at least 25%
more frequent than at the reference, beyond sampling noise.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evals.analysis.stats import Z95, Interval, NotAvailable, novel_share, spearman, wilson
from evals.screen.answers import Answer
from evals.screen.judge import CHANNELS, ERROR_CHANNELS, THIN_MARGIN_NATS, Judge, Verdict

__all__ = ["FLAG_RATIO", "FORMAT", "PointLabel", "paired_rate_ratio", "summarize"]

FORMAT = 2  # 2: margins split by outcome, and the per-family pairs
FLAG_RATIO = 1.25


@dataclass(frozen=True)
class PointLabel:
    """A decision point as the points file keeps it (no prompt)."""

    key: str
    domain: str
    gold_name: str
    gold_arguments: dict[str, Any]


def paired_rate_ratio(
    pairs: Sequence[tuple[bool, bool]], z: float = Z95
) -> Interval | NotAvailable:
    """Ratio of the compared arm's rate to the reference's on paired points, with a log interval.

    ``pairs`` are (reference has it, compared has it). Var(log ratio) = (b + c) / ((a+b)(a+c)),
    the delta method for paired proportions (a: both, b: reference only, c: compared only).
    When either arm never shows the channel, 0.5 is added to each cell so the ratio stays finite
    (its interval is then wide, and flags only a large excess).
    """
    n = len(pairs)
    if n == 0:
        return NotAvailable("no paired points")
    a = sum(1 for ref, cmp in pairs if ref and cmp)
    b = sum(1 for ref, cmp in pairs if ref and not cmp)
    c = sum(1 for ref, cmp in pairs if cmp and not ref)
    if a + b == 0 and a + c == 0:
        return NotAvailable("neither arm showed this channel")
    fa, fb, fc = float(a), float(b), float(c)
    if a + b == 0 or a + c == 0:
        fa, fb, fc = fa + 0.5, fb + 0.5, fc + 0.5
    ratio = (fa + fc) / (fa + fb)
    se = math.sqrt((fb + fc) / ((fa + fb) * (fa + fc)))
    return Interval(ratio, ratio * math.exp(-z * se), ratio * math.exp(z * se))


def _stat(value: Interval | NotAvailable | float) -> Any:
    if isinstance(value, NotAvailable):
        return {"not_available": value.reason}
    if isinstance(value, Interval):
        return {
            "estimate": round(value.estimate, 6),
            "low": round(value.low, 6),
            "high": round(value.high, 6),
        }
    return round(value, 6)


def _rate(count: int, n: int) -> dict[str, Any]:
    return {"count": count, "rate": _stat(wilson(count, n))}


def _margins(margins: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(margins),
        "median": round(statistics.median(margins), 6) if margins else None,
        "thin": _rate(sum(m < THIN_MARGIN_NATS for m in margins), len(margins)),
    }


def _is_error(verdict: Verdict) -> bool:
    return any(verdict.has(channel) for channel in ERROR_CHANNELS)


def _arm_summary(answers: Sequence[Answer], verdicts: Mapping[str, Verdict]) -> dict[str, Any]:
    n = len(verdicts)
    margins = [v.margin for v in verdicts.values() if v.margin is not None]
    # Do thin margins go with the errors? The same margin, split by whether the answer erred.
    by_outcome = {
        outcome: _margins(
            [v.margin for v in verdicts.values() if v.margin is not None and _is_error(v) == erred]
        )
        for outcome, erred in (("error", True), ("no_error", False))
    }
    invented: Counter[str] = Counter(name for v in verdicts.values() for name in v.invented)
    return {
        "n": n,
        "channels": {ch: _rate(sum(v.has(ch) for v in verdicts.values()), n) for ch in CHANNELS},
        "text_only": _rate(sum(v.text_only for v in verdicts.values()), n),
        "next_action": {
            "gold_tool": _rate(sum(v.gold_name for v in verdicts.values()), n),
            "gold_call": _rate(sum(v.gold_call for v in verdicts.values()), n),
        },
        "margin": _margins(margins),
        "margin_by_outcome": by_outcome,
        "invented_names": dict(sorted(invented.items())),
        "answer_seconds": round(sum(a.seconds for a in answers), 3),
        "logprobs_requested": sum(a.logprobs for a in answers),
    }


def _compare(
    reference: Mapping[str, Verdict],
    compared: Mapping[str, Verdict],
    ref_names: Mapping[str, int],
    cmp_names: Mapping[str, int],
) -> dict[str, Any]:
    shared = sorted(set(reference) & set(compared))
    channels: dict[str, Any] = {}
    flagged: list[str] = []
    for channel in CHANNELS:
        pairs = [(reference[k].has(channel), compared[k].has(channel)) for k in shared]
        ratio = paired_rate_ratio(pairs)
        channels[channel] = {
            "reference_count": sum(ref for ref, _ in pairs),
            "count": sum(cmp for _, cmp in pairs),
            "ratio": _stat(ratio),
        }
        if channel in ERROR_CHANNELS and isinstance(ratio, Interval) and ratio.low > FLAG_RATIO:
            flagged.append(channel)
    names = sorted(set(ref_names) | set(cmp_names))
    rho = spearman([ref_names.get(n, 0) for n in names], [cmp_names.get(n, 0) for n in names])
    novel = novel_share(ref_names, cmp_names)
    return {
        "paired_n": len(shared),
        "channels": channels,
        "spearman_invented": _stat(rho),
        "novel_names": (
            {"not_available": novel.reason}
            if isinstance(novel, NotAvailable)
            else {"novel": novel[0], "total": novel[1], "share": round(novel[0] / novel[1], 6)}
        ),
        "flagged": flagged,
    }


def summarize(
    *,
    points: Sequence[PointLabel],
    tools: Mapping[str, list[dict[str, Any]]],
    answers: Sequence[Answer],
    arms: Sequence[str],
    reference: str,
    config: Mapping[str, Any],
    pairs: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """``screen.json`` as a dict (sorted, rounded; no clock).

    Every arm is compared with ``reference``; each (arm, its own reference) in ``pairs`` is
    compared too, e.g. a smaller model's Q2_K against its own shipped Q4_K_M.
    """
    judges = {domain: Judge(domain_tools) for domain, domain_tools in tools.items()}
    labels = {point.key: point for point in points}
    verdicts: dict[str, dict[str, Verdict]] = {arm: {} for arm in arms}
    by_arm: dict[str, list[Answer]] = {arm: [] for arm in arms}
    for answer in answers:
        label = labels.get(answer.point)
        if label is None or answer.arm not in verdicts:
            continue  # an answer to a point or arm this screen no longer asks about
        by_arm[answer.arm].append(answer)
        verdicts[answer.arm][answer.point] = judges[label.domain].judge(
            answer.completion, label.gold_name, label.gold_arguments
        )
    summaries = {arm: _arm_summary(by_arm[arm], verdicts[arm]) for arm in arms}
    comparisons = {
        arm: _compare(
            verdicts[reference],
            verdicts[arm],
            summaries[reference]["invented_names"],
            summaries[arm]["invented_names"],
        )
        for arm in arms
        if arm != reference
    }
    for arm, own in pairs:
        if arm not in verdicts or own not in verdicts or arm == own:
            raise ValueError(f"pair {arm}={own}: both must be screened arms, and differ")
    paired = [
        {
            "arm": arm,
            "reference": own,
            **_compare(
                verdicts[own],
                verdicts[arm],
                summaries[own]["invented_names"],
                summaries[arm]["invented_names"],
            ),
        }
        for arm, own in pairs
    ]
    return {
        "format": FORMAT,
        "config": dict(config),
        "rule": {
            "flag": (
                f"an error channel whose paired rate ratio against the reference has a 95% "
                f"lower bound above {FLAG_RATIO}"
            ),
            "flag_ratio": FLAG_RATIO,
            "thin_margin_nats": THIN_MARGIN_NATS,
            "error_channels": list(ERROR_CHANNELS),
        },
        "points": len(points),
        "reference": reference,
        "arms": summaries,
        "comparisons": comparisons,
        "flagged": {arm: c["flagged"] for arm, c in comparisons.items() if c["flagged"]},
        "pairs": paired,
    }
