"""An arm's numbers as the analysis reads them: what the proxy did, what repair cost, and the
whole per-arm summary that ``evals.analysis.pairs`` compares and the report prints.

Kept apart from ``evals.analysis.summary`` (which computes them) so that the pairs module can name
the type without importing the module that imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evals.analysis.margins import MarginView
from evals.analysis.recovery import Recovery
from evals.analysis.stats import Interval, NotAvailable

__all__ = ["ArmSummary", "ProxyView", "RepairCost"]


@dataclass(frozen=True)
class ProxyView:
    """What the proxy caught in the model's first answers and what reached the agent, by the
    study's definitions (``evals.analysis.definitions``)."""

    answers_recorded: int
    caught_by_channel: dict[str, int]  # channel -> answers whose first answer showed it
    caught_answers: int
    fixed_answers: int  # caught, changed (promoted or re-asked), valid on delivery
    repairs: int  # re-asks, summed
    repair_failures: int
    changed_answers: int = 0  # caught and promoted or re-asked
    still_invalid_answers: int = 0  # caught, changed, and still not valid on delivery
    unchecked_answers: int = 0  # caught and changed, delivered without calls: not checkable
    not_separable: int = 0  # caught answers whose record mixes the re-asks' channels in
    declined_answers: int = 0  # caught, re-asked, answered in plain text: valid, not a fix
    withheld_answers: int = 0  # caught, re-asked, the reply refused by the proxy (its decision)

    @property
    def fixed_share(self) -> float | NotAvailable:
        if self.answers_recorded == 0:
            return NotAvailable("no proxy headers recorded: run without the proxy")
        if self.caught_answers == 0:
            return NotAvailable("the proxy caught no invalid answer")
        return self.fixed_answers / self.caught_answers


@dataclass(frozen=True)
class RepairCost:
    episodes_with_headers: int
    extra_upstream_calls: float | NotAvailable  # per episode
    prompt_tokens: float | NotAvailable
    completion_tokens: float | NotAvailable
    seconds: float | NotAvailable
    overhead_ms_per_answer: float | NotAvailable


@dataclass(frozen=True)
class ArmSummary:
    label: str
    path: str
    agent_model: str | None
    max_errors: int | None
    episodes: int
    scored: int  # episodes the success statistics use
    nl_unjudged: int
    no_reward: int
    success: Interval | NotAvailable
    sweep: dict[int, Interval | NotAvailable]
    messages_mean: float | NotAvailable
    messages_median: float | NotAvailable
    failed_calls_mean: float | NotAvailable
    termination: dict[str, int]
    agent_tool_calls: int
    user_failed_calls: int
    channel_counts: dict[str, int]
    channel_rates: dict[str, float | NotAvailable]
    raw_hallucinated_calls: int
    raw_hallucination_rate: float | NotAvailable
    names_env: dict[str, int]
    names_proxy: dict[str, int]
    names: dict[str, int]  # per answer the larger of the two views, so no call counts twice
    recovery: float | NotAvailable  # NEXT_CALL_RECOVERY's share (kept for older readers)
    recovery_counts: tuple[int, int, int]  # recovered, with a next call, failed agent calls
    proxy: ProxyView
    repair_cost: RepairCost
    provenance: Mapping[str, Any] | None
    cell: str | None
    mode: str | None
    run_info: dict[str, Any] = field(default_factory=dict)
    recovery_readings: tuple[Recovery, ...] = ()
    pass_hat_k: dict[int, Interval | NotAvailable] = field(default_factory=dict)
    failed_calls_histogram: dict[int, int] = field(default_factory=dict)  # calls -> episodes
    margins: MarginView | None = (
        None  # the tool-name margin probe's account (evals.analysis.margins)
    )
