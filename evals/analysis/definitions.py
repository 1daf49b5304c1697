"""What the study's words mean, written once: the report prints ``DEFINITIONS``, the docs'
definitions page quotes them, and every view that counts answers (analysis, transcript) decides
with ``answer_facts``.

Two views that each decided "caught" or "fixed" on their own disagreed (a first-answer count that
took in the re-asks' mistakes; a "fixed" that needed a re-ask, so promotions never counted). This
module imports nothing from the proxy or the analysis, so any view can follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFINITIONS", "AnswerFacts", "answer_facts", "definitions_markdown"]

DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "success",
        "reward 1 at the run's own error budget K; success@K' also needs fewer than K' failed "
        "tool calls (agent's and user's).",
    ),
    (
        "pair, task",
        "two arms' episodes of one task and trial; the task is the unit of every paired interval, "
        "test and power figure (difference, change test, odds ratio, TOST, power), since the "
        "trials of one task are not independent. McNemar's p and the exact odds-ratio interval "
        "over episode pairs are shown beside, labelled 'as in the paper', and decide nothing.",
    ),
    (
        "valid answer",
        "an agent answer that is not empty, writes no tool call as text, and whose every tool call "
        "names a declared tool with JSON-object arguments that match its schema (the proxy's "
        "channels unknown_tool, invalid_json, schema_violation, tool_call_in_content, "
        "empty_output).",
    ),
    (
        "caught in the first answer",
        "the model's first answer to a request was not valid; per channel, an answer counts once "
        "when its first answer showed the channel. Re-ask attempts are not counted. Where the "
        "record lists every attempt's channels together and the first answer's cannot be told "
        "apart (several re-asks, or one that did not give a valid answer), the answer is counted "
        "by the channels of all its attempts and reported as 'not separable'.",
    ),
    (
        "fixed",
        "caught in the first answer, changed by the proxy (a text call promoted to a real call, "
        "or a re-ask), and what reached the agent was valid and carried a tool call. A promotion "
        "is a fix; so is a re-ask. 'Valid on delivery' is the proxy's own verdict when recorded "
        "(X-Repairproxy-Delivered-Tool-Errors), else: none of the delivered calls failed as an "
        "invented name, a user-side tool or an argument error.",
    ),
    (
        "declined",
        "caught, re-asked, and the model answered the re-ask in plain text without a tool call "
        "(which the re-ask allows when no listed tool fits); valid, but not a fix.",
    ),
    (
        "withheld",
        "caught and re-asked, and the proxy refused the re-ask's reply (a listed tool called with "
        "values found nowhere in the conversation) and delivered the answer it held "
        "(X-Repairproxy-Repair-Result: withheld): the proxy's decision, not the model's failure.",
    ),
    (
        "still invalid after repair",
        "caught, changed by the proxy, not withheld, and what reached the agent was still not "
        "valid (or the re-ask failed upstream).",
    ),
    (
        "raw_hallucination_rate",
        "invented-name calls in the model's first answers over the calls counted for them. Per "
        "answer, the numerator is the larger of the environment's count (calls that ran and "
        "failed 'not found', user-side tools excepted) and the proxy's (names it caught in the "
        "first answer); the denominator is the first answer's calls as the proxy counted them "
        "(X-Repairproxy-First-Tool-Calls, text calls included), so 1 invented call re-asked into "
        "3 valid calls reads 1 of 1. Records without that header (runs before it) count the "
        "calls that ran plus the invented-name calls the proxy removed before they could run, "
        "which there reads 1 of 4.",
    ),
    (
        "recovery",
        "two readings, always named: 'the next agent call succeeds' (over failed agent calls "
        "followed by another agent call with a result) and 'a successful agent call follows "
        "before the episode ends' (over every failed agent call). Calls of one answer do not "
        "follow each other. Intervals: Wilson at the episode-clustered effective size.",
    ),
    (
        "equivalent",
        "the 90% interval of the paired difference lies inside ±7.5 points: TOST at 5% per side "
        "over tasks, each one-sided t at the tested value delta with the null-imposed "
        "cluster-robust variance (CR1), never below the task-level floor (|delta| - delta^2) / G "
        "for G tasks; Satterthwaite's df of the tasks' squared residuals (at most G - 1); the "
        "critical value raised by the one-sided Cornish-Fisher term skew (2q^2 + 1) / (6 sqrt G) "
        "when the task means' skewness makes that tail heavier. The interval is the test's own "
        "inversion and the verdict is that it lies inside; size at the margin measured by "
        "benchmarks/tost_calibration.py.",
    ),
    (
        "Holm family",
        "a set of comparisons fixed before any p-value is seen (the grid file's [families], else: "
        "precision cells at mode off; repair-mode comparisons; other comparisons). The change "
        "test's p (the within-task sign-flip test, exact; and McNemar's, as in the paper) is "
        "Holm-adjusted within its family only; equivalence is not adjusted (intersection-union).",
    ),
    (
        "amplification",
        "per channel, failed agent calls per agent call in the compared arm over the same in the "
        "reference arm; 95% interval on the log scale, each arm's rate clustered by episode.",
    ),
)

# The channels a delivered call can fail with that mean the answer itself was not valid.
INVALID_ON_DELIVERY = frozenset({"hallucinated_name", "user_side_tool", "argument"})


def definitions_markdown() -> str:
    """The definitions as a markdown list (docs/reference/definitions.md is written from it)."""
    return "\n".join(f"- **{term}**: {text}" for term, text in DEFINITIONS)


def _channels(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value if str(v))
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return ()


def _count(value: Any) -> int:
    if value is None:  # the usual case (no promotion recorded): no exception raised for it
        return 0
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class AnswerFacts:
    """What one agent answer was, by the definitions above."""

    first_channels: frozenset[str]  # channels the first answer showed (see ``separable``)
    separable: bool  # False: the record mixes re-ask attempts in; channels are all attempts'
    promoted: int
    reasks: int
    repair_failed: bool
    valid_on_delivery: bool | None  # None: not known
    withheld: bool = False  # the proxy refused the re-ask's reply (repair_result "withheld")
    delivered_calls: int | None = None  # tool calls the agent received; None: not known

    @property
    def caught(self) -> bool:
        return bool(self.first_channels)

    @property
    def changed(self) -> bool:
        return self.promoted > 0 or self.reasks > 0

    @property
    def declined(self) -> bool:
        return (
            self.caught
            and self.reasks > 0
            and not self.withheld
            and not self.repair_failed
            and self.valid_on_delivery is True
            and self.delivered_calls == 0
        )

    @property
    def fixed(self) -> bool:
        return (
            self.caught
            and self.changed
            and not self.withheld
            and not self.repair_failed
            and self.valid_on_delivery is True
            and not self.declined
        )

    @property
    def still_invalid(self) -> bool:
        return (
            self.caught
            and self.changed
            and not self.withheld
            and (self.repair_failed or self.valid_on_delivery is False)
        )


def answer_facts(
    record: Mapping[str, Any] | None,
    delivered_channels: frozenset[str] | None = None,
    delivered_calls: int | None = None,
) -> AnswerFacts | None:
    """The facts of one answer from the proxy's record (its ``x-repairproxy-*`` headers) and,
    when the record does not say, the channels its delivered calls failed with in the
    environment (``delivered_channels``; None: unknown); ``delivered_calls``: how many tool
    calls the agent received (None: unknown). None without a record."""
    if record is None:
        return None
    reasks = _count(record.get("repairs"))
    promoted = _count(record.get("promoted"))
    repair_failed = bool(record.get("repair_failed"))
    valid: bool | None
    if "delivered_tool_errors" in record:
        valid = not _channels(record.get("delivered_tool_errors"))
    elif delivered_channels is not None:
        valid = not (delivered_channels & INVALID_ON_DELIVERY)
    else:
        valid = None
    if "first_tool_errors" in record:
        first, separable = frozenset(_channels(record.get("first_tool_errors"))), True
    else:
        # ``tool_errors`` lists the first answer's channels, then each re-ask's: with no re-ask,
        # or one re-ask that gave a valid answer, it is the first answer's alone.
        every = frozenset(_channels(record.get("tool_errors")))
        separable = reasks == 0 or (reasks == 1 and valid is True and not repair_failed)
        first = every
    withheld = str(record.get("repair_result", "")) == "withheld"
    return AnswerFacts(
        first, separable, promoted, reasks, repair_failed, valid, withheld, delivered_calls
    )
