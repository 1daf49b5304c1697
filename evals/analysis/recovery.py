"""Recovery after a failed agent call: its two readings, each with its episode-clustered interval.

Split from ``evals.analysis.summary`` (which re-exports these names); the definitions text in
``evals.analysis.definitions`` says what each reading counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evals.analysis import stats
from evals.analysis.episodes import Episode
from evals.analysis.stats import Interval, NotAvailable

__all__ = [
    "EVENTUAL_RECOVERY",
    "NEXT_CALL_RECOVERY",
    "Recovery",
    "recoveries",
    "recovery_counts",
]

NEXT_CALL_RECOVERY = "the next agent call succeeds"
EVENTUAL_RECOVERY = "a successful agent call follows before the episode ends"


def _recovery_units(episode: Episode) -> tuple[int, int, int, int]:
    """(next call succeeded, followed by a call with a result, a success followed, failed) over
    the failed agent calls of one episode; calls of the same answer do not follow each other."""
    recovered = followed = eventually = failed = 0
    agent = episode.agent_calls
    for position, call in enumerate(agent):
        if not call.error:
            continue
        failed += 1
        later = [c for c in agent[position + 1 :] if c.message_index > call.message_index]
        eventually += any(c.error is False for c in later)
        following = later[0] if later else None
        if following is None or following.error is None:
            continue
        followed += 1
        recovered += not following.error
    return recovered, followed, eventually, failed


def recovery_counts(episodes: Sequence[Episode]) -> tuple[int, int, int]:
    """(next call succeeded, followed by a call with a result, failed) summed over episodes."""
    units = [_recovery_units(e) for e in episodes]
    return sum(u[0] for u in units), sum(u[1] for u in units), sum(u[3] for u in units)


@dataclass(frozen=True)
class Recovery:
    """One reading of "the agent recovered from a failed call", with its interval."""

    reading: str
    recovered: int
    of: int  # the failed agent calls this reading counts over
    share: Interval | NotAvailable  # Wilson at the episode-clustered effective size


def recoveries(episodes: Sequence[Episode]) -> tuple[Recovery, Recovery]:
    """Both readings, named: ``NEXT_CALL_RECOVERY`` (over failed calls followed by another agent
    call with a result) and ``EVENTUAL_RECOVERY`` (over every failed agent call)."""
    units = [_recovery_units(e) for e in episodes]
    next_units = [(u[0], u[1]) for u in units]
    eventual_units = [(u[2], u[3]) for u in units]
    return (
        Recovery(
            NEXT_CALL_RECOVERY,
            sum(u[0] for u in next_units),
            sum(u[1] for u in next_units),
            stats.clustered_proportion(next_units, "no failed agent call was followed by another"),
        ),
        Recovery(
            EVENTUAL_RECOVERY,
            sum(u[0] for u in eventual_units),
            sum(u[1] for u in eventual_units),
            stats.clustered_proportion(eventual_units, "no failed agent call"),
        ),
    )
