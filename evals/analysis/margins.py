"""The margin account: how close each arm's model came to writing another tool's name.

With ``--margin-probe`` the proxy measures, per tool call of the model's first answer, the
log-prob margin at the token where the written name leaves the nearest declared one, and sends
``name=margin`` pairs in ``X-Repairproxy-Tool-Name-Margins``; the engine records that header in the
assistant message's ``repairproxy`` field. A name the proxy reported as unknown in the same answer
is invented; the rest are declared names. Thin margins (under half a nat, the dashboard's
threshold) are where a small perturbation such as quantization flips which tool is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evals.analysis import stats
from evals.analysis.episodes import Episode
from evals.analysis.stats import Interval, NotAvailable

__all__ = ["THIN_MARGIN", "MarginGroup", "MarginView", "margin_view", "parse_margins"]

THIN_MARGIN = 0.5  # nats; repairproxy's dashboard uses the same threshold
_NO_PROBE = "no margins recorded: run the proxy with --margin-probe"


def parse_margins(value: Any) -> list[tuple[str, float]]:
    """``name=margin,...`` (the header as recorded) as (name, margin) pairs; bad items skipped."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    out = []
    for item in items:
        name, sep, number = str(item).strip().rpartition("=")
        if not sep or not name:
            continue
        try:
            out.append((name, float(number)))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class MarginGroup:
    """The margins of one kind of name (declared or invented) in one arm."""

    calls: int
    thin: int
    thin_share: Interval | NotAvailable  # Wilson at the episode-clustered effective size
    median: float | NotAvailable


@dataclass(frozen=True)
class MarginView:
    answers_with_margins: int
    all_calls: MarginGroup
    declared: MarginGroup
    invented: MarginGroup


def _median(values: Sequence[float], reason: str) -> float | NotAvailable:
    if not values:
        return NotAvailable(reason)
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _group(per_episode: Sequence[Sequence[float]], reason: str) -> MarginGroup:
    values = [m for episode in per_episode for m in episode]
    units = [(sum(1 for m in episode if m < THIN_MARGIN), len(episode)) for episode in per_episode]
    return MarginGroup(
        calls=len(values),
        thin=sum(u[0] for u in units),
        thin_share=stats.clustered_proportion(units, reason),
        median=_median(values, reason),
    )


def _unknown(proxy: Mapping[str, Any]) -> set[str]:
    raw = proxy.get("unknown_tools")
    if not raw:
        return set()  # most answers: nothing unknown
    names = raw if isinstance(raw, list) else str(raw).split(",")
    return {str(n).strip() for n in names if str(n).strip()}


def margin_view(episodes: Sequence[Episode]) -> MarginView:
    """Every recorded margin of the arm, split into declared and invented names."""
    answers = 0
    every: list[list[float]] = []
    declared: list[list[float]] = []
    invented: list[list[float]] = []
    for episode in episodes:
        mine: list[float] = []
        good: list[float] = []
        bad: list[float] = []
        for _, proxy in episode.answer_proxy:
            if not proxy:
                continue
            pairs = parse_margins(proxy.get("tool_name_margins"))
            if not pairs:
                continue
            answers += 1
            unknown = _unknown(proxy)
            for name, margin in pairs:
                mine.append(margin)
                (bad if name in unknown else good).append(margin)
        every.append(mine)
        declared.append(good)
        invented.append(bad)
    return MarginView(
        answers_with_margins=answers,
        all_calls=_group(every, _NO_PROBE),
        declared=_group(declared, "no margin of a declared name recorded"),
        invented=_group(invented, "no margin of an invented name recorded"),
    )
