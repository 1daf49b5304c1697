"""What each family's own chat template writes for a call is promoted exactly, and what it writes
for prose is not (``tests/data/textcalls/templates/``: llama.cpp's shipped templates rendered with
jinja2 by ``benchmarks.diagnostics.template_corpus``); the same for the model outputs of other
parsers' test suites (``tests/data/textcalls/outside/``: llama.cpp's ``tests/test-chat.cpp``,
SGLang's function-call tests).

Exact: every call's name and decoded arguments, in order, as JSON. The few cases the proxy reads
otherwise are listed with why (strict: one that starts passing fails here, so the list shrinks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.textcalls import promote_answer

DATA = Path(__file__).parents[1] / "data" / "textcalls"
CASES = [
    json.loads(line)
    for folder in ("templates", "outside")
    for path in sorted((DATA / folder).glob("*.jsonl"))
    for line in path.read_text(encoding="utf-8").splitlines()
    if line.strip()
]

# Each is read otherwise on purpose: llama.cpp's parser accepts what the proxy's rules refuse.
KNOWN_MISSES = {
    # A Kimi K2 call's closer <|tool_call_end|> is an ordinary special token, not a stop token
    # servers strip: a call without it did not finish (the list may have gone on), so by the
    # rule "a closing marker is required only where servers do not strip it as a stop token"
    # it is not a call, whatever the finish reason (hostile.jsonl cut_off-007 holds the shape).
    "llamacpp_kimi_k2_thinking-007-line5103": (
        "calls with no <|tool_call_end|> (not a stop token): unfinished, so not a call here"
    ),
    "llamacpp_kimi_k2_thinking-008-line5120": (
        "a call with no <|tool_call_end|> (not a stop token): unfinished, so not a call here"
    ),
    # The label's schema is string-or-object and MiniMax-M3's template writes {"text": "hi"} and
    # the string holding that markup alike: llama.cpp reads the string, the proxy reads neither
    # (the call is reported, never promoted with values it cannot know; native_format_hostile-030).
    "llamacpp_minimax_m3-017-line5793": (
        "MiniMax-M3 markup under a string-or-object union: two readings, so none is promoted"
    ),
}


def test_the_corpora_hold_calls_and_prose_from_each_source() -> None:
    sources = {
        str(case["provenance"].get("source") or case["provenance"].get("repo")) for case in CASES
    }
    assert len(sources) >= 3  # the templates, llama.cpp's chat tests, SGLang's tests
    assert sum(bool(case["expected_calls"]) for case in CASES) >= 400
    assert sum(not case["expected_calls"] for case in CASES) >= 100
    assert set(KNOWN_MISSES) <= {case["id"] for case in CASES}


def _params() -> list[Any]:
    return [
        pytest.param(
            case,
            id=case["id"],
            marks=(
                [pytest.mark.xfail(reason=KNOWN_MISSES[case["id"]], strict=True)]
                if case["id"] in KNOWN_MISSES
                else []
            ),
        )
        for case in CASES
    ]


@pytest.mark.parametrize("case", _params())
def test_what_the_template_writes_is_promoted_exactly_and_prose_is_not(
    case: dict[str, Any],
) -> None:
    result = promote_answer({"tools": case["tools"], "tool_choice": "auto"}, case["text"])
    got = json.dumps([[name, arguments] for name, arguments in result.calls], sort_keys=True)
    expected = json.dumps(
        [[call["name"], call["arguments"]] for call in case["expected_calls"]], sort_keys=True
    )
    assert got == expected
    for marker in case.get("wrapper_markers", ()):
        if result.calls and marker not in (case["expected_content"] or ""):
            assert marker not in (result.content or "")
