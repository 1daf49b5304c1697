"""A scripted workload of ``RequestRecord``s with known truth, for the metrics and dashboard tests.

Eight episodes of five requests, one tool call each (40 calls). Ten calls name invented tools
(hallucination rate 0.25); one breaks a schema, one is written as text and promoted, and one
environment error arrives later. Budget 3: six episodes reach k=1, three reach k=2, two exhaust it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from repairproxy.observe.record import (
    CaughtCall,
    EpisodeRecord,
    RepairResult,
    RepairResultKind,
    RequestRecord,
)
from repairproxy.types import Outcome

__all__ = ["BUDGET", "Truth", "scripted_workload", "warmup_record"]

BUDGET = 3
_INVENTED = ["lookup_order"] * 4 + ["find_user"] * 3 + ["cancel"] * 2 + ["refund_all"]
# Per episode, the error (channel, invented name, repair fixed?) of each of its five requests.
_Step = tuple[str, str | None, bool] | None
_EPISODES: list[list[_Step]] = [
    [("unknown_tool", "lookup_order", True)] * 2
    + [("unknown_tool", "lookup_order", False)] * 2
    + [None],
    [("unknown_tool", "find_user", True)] * 3 + [None] * 2,
    [("unknown_tool", "cancel", True)] * 2 + [None] * 3,
    [("unknown_tool", "refund_all", True)] + [None] * 4,
    [("schema_violation", None, True)] + [None] * 4,
    [None] * 5,  # one environment error on its third request
    [("tool_call_in_content", None, True)] + [None] * 4,  # a text call, promoted
    [None] * 5,
]


@dataclass(frozen=True)
class Truth:
    tool_calls: int = 40
    invented: int = 10
    hallucination_rate: float = 0.25
    invented_by_name: dict[str, int] = field(
        default_factory=lambda: {name: _INVENTED.count(name) for name in set(_INVENTED)}
    )
    episodes: int = 8
    over_budget: dict[int, int] = field(default_factory=lambda: {1: 6, 2: 3, 5: 0, 10: 0})
    exhausted: int = 2
    repairs_fixed: int = 10
    repairs_failed: int = 2
    promoted: int = 1
    answer_errors: dict[str, int] = field(
        default_factory=lambda: {
            "unknown_tool": 10,
            "schema_violation": 1,
            "tool_call_in_content": 1,
        }
    )
    env_errors: int = 1
    requests: int = 40
    outcomes: dict[str, int] = field(
        default_factory=lambda: {"ok": 28, "repaired": 10, "repair_exhausted": 2}
    )


def warmup_record(model: str) -> RequestRecord:
    """A request without tool calls: makes the model's series exist (at zero) before the load."""
    return RequestRecord(model=model, upstream_seconds=0.1, overhead_seconds=0.0001)


def scripted_workload(
    model: str, answered_right: frozenset[tuple[int, int]] = frozenset()
) -> list[RequestRecord]:
    """The workload; (episode, turn) pairs in ``answered_right`` lose their error (not Truth)."""
    records: list[RequestRecord] = []
    for number, steps in enumerate(_EPISODES):
        errors = 0
        for turn, step in enumerate(steps):
            if (number, turn) in answered_right:
                step = None
            record = RequestRecord(
                model=model,
                tool_calls=1,
                upstream_seconds=0.2 + 0.01 * turn,
                overhead_seconds=0.0002,
                first_byte_seconds=0.05 if turn == 0 else None,
                stream=turn == 0,
                tool_name_margins=[0.5 + number],
            )
            charged = 0
            if step is not None:
                channel, name, fixed = step
                text = channel == "tool_call_in_content"
                record.caught_calls.append(
                    CaughtCall(channel, form="text" if text else "structured", tool=name)
                )
                result = RepairResultKind.FIXED if fixed else RepairResultKind.FAILED
                record.repair_results.append(RepairResult(channel, result))
                record.outcome = Outcome.REPAIRED if fixed else Outcome.REPAIR_EXHAUSTED
                if text:
                    record.promoted = 1  # fixed by promotion, no re-ask, no budget charge
                else:
                    charged = 1
                    record.repair_attempts = 1 if fixed else 2
                    record.repair_prompt_tokens = 300 * record.repair_attempts
                    record.repair_completion_tokens = 20 * record.repair_attempts
                    record.repair_seconds = 0.3 * record.repair_attempts
            if number == 5 and turn == 2:
                record.env_errors.append("env_argument_error")
                charged = 1
            record.episode = EpisodeRecord(
                new=turn == 0,
                explicit=True,
                errors_before=errors,
                errors_after=errors + charged,
                budget=BUDGET,
                exhausted=errors + charged >= BUDGET,
            )
            errors += charged
            records.append(record)
    return records
