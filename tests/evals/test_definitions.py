"""``answer_facts`` tells apart what the proxy did to a caught answer: fixed, declined (the model
answered the re-ask in text), withheld (the proxy refused the re-ask's reply) and still invalid,
from the headers the proxy sends (X-Repairproxy-Repair-Result, -Delivered-Tool-Errors)."""

from __future__ import annotations

from typing import Any

import pytest

from evals.analysis.definitions import answer_facts
from evals.tau2.chat import proxy_report


def _facts(headers: dict[str, str], delivered_calls: int | None) -> Any:
    record = proxy_report([(f"x-repairproxy-{name}", value) for name, value in headers.items()])
    facts = answer_facts(record, None, delivered_calls)
    assert facts is not None
    return facts


CAUGHT = {
    "tool-errors": "tool_call_in_content,unknown_tool",
    "first-tool-errors": "tool_call_in_content",
}


@pytest.mark.parametrize(
    ("headers", "calls", "expected"),
    [
        ({"repairs": "1", "repair-result": "fixed", "delivered-tool-errors": ""}, 1, "fixed"),
        ({"repairs": "1", "repair-result": "fixed", "delivered-tool-errors": ""}, 0, "declined"),
        (
            {
                "repairs": "1",
                "repair-result": "withheld",
                "delivered-tool-errors": "tool_call_in_content",
            },
            0,
            "withheld",
        ),
        (
            {"repairs": "2", "repair-result": "failed", "delivered-tool-errors": "unknown_tool"},
            1,
            "still invalid",
        ),
    ],
)
def test_each_repair_ending_has_its_own_name(
    headers: dict[str, str], calls: int, expected: str
) -> None:
    facts = _facts({**CAUGHT, **headers}, calls)
    names = {
        "fixed": facts.fixed,
        "declined": facts.declined,
        "withheld": facts.withheld,
        "still invalid": facts.still_invalid,
    }
    assert [name for name, on in names.items() if on] == [expected]
    assert facts.caught and facts.first_channels == frozenset({"tool_call_in_content"})


def test_the_delivered_channels_header_decides_valid_on_delivery() -> None:
    facts = _facts({**CAUGHT, "repairs": "1", "delivered-tool-errors": "schema_violation"}, 1)
    assert facts.valid_on_delivery is False
    old = _facts({**CAUGHT, "repairs": "1"}, 0)  # a record from before the header
    assert old.valid_on_delivery is None and not old.declined and not old.fixed
