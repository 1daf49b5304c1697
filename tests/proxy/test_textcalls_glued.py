"""Prose glued to a call: a family's special-token opener is an act, and so is bare JSON opening
the answer (Llama 3's format); what the prose says still counts; a closing remark that asks about
nothing the call does leaves the call a call.

The shapes come from vLLM's tool-parser tests (the native corpus: "Hello[TOOL_CALLS]add{...}",
"normal text<｜tool▁calls▁begin｜>...", "...<|tool_calls_section_end|> After tools.",
"{...} Would you like to know more?"); the refusals from the hostile corpus.
"""

from __future__ import annotations

import pytest

from repairproxy.textcalls import NotACall, read_text_calls

TOOLS = {"add": {"type": "object"}, "refund_order": {"type": "object"}}
MISTRAL = '[TOOL_CALLS]add{"a": 1, "b": 2}'
DEEPSEEK = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1, "b": 2}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
KIMI = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0 "
    '<|tool_call_argument_begin|>{"a": 1, "b": 2}<|tool_call_end|><|tool_calls_section_end|>'
)
BARE = '{"name": "add", "arguments": {"a": 1, "b": 2}}'


def _called(text: str) -> list[str | None]:
    return [call.name for call in read_text_calls(text, tools=TOOLS).calls]


def _reasons(text: str) -> set[NotACall]:
    return {reason for _, reason in read_text_calls(text, tools=TOOLS).prose}


@pytest.mark.parametrize(
    "text",
    [
        f"Hello{MISTRAL}",
        f"hi{{hi{MISTRAL}",
        f"normal text{DEEPSEEK}",
        f"some prefix text{DEEPSEEK} some suffix text",
        f"Before. {KIMI} After tools.",
        f"Let me check. <tool_call>{BARE}</tool_call> Anything else?",
        f"{BARE}\nWould you like to know more?",
        f"Here is the result: {BARE} Would you like to know more?",
        # Llama 3's JSON format answers with the call object itself: a remark after it on its
        # line is read like a next sentence (vLLM's llama3_json brace-in-trailing-text test).
        f"{BARE} I used it for this.",
        f"<think>Adding.</think>{BARE} I used it for this.",
    ],
)
def test_a_call_with_prose_glued_to_it_is_still_a_call(text: str) -> None:
    assert _called(text) == ["add"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"I will not run {MISTRAL}", NotACall.LEAD_IN),
        (f"I will not run {MISTRAL} unless you confirm.", NotACall.FOLLOWED),
        (f"{MISTRAL} and the sum came out as 3.", NotACall.FOLLOWED),
        (f"Yesterday{DEEPSEEK}", NotACall.LEAD_IN),
        (f"Yesterday {DEEPSEEK} went through.", NotACall.FOLLOWED),
        (f"For example: {MISTRAL}", NotACall.EXAMPLE),
        (f"{KIMI} Should I go ahead?", NotACall.FOLLOWED),
        (f"Sending {DEEPSEEK} requires your confirmation first.", NotACall.FOLLOWED),
        (f"{BARE}\nShall I proceed?", NotACall.FOLLOWED),
        (f"{BARE}\nWould you like me to run it?", NotACall.FOLLOWED),
        (f"{BARE} This was executed yesterday.", NotACall.FOLLOWED),
        (f"{BARE} I will not run it unless you confirm.", NotACall.FOLLOWED),
        (f"{BARE} was what I ran.", NotACall.FOLLOWED),
    ],
)
def test_what_glued_prose_says_still_counts(text: str, reason: NotACall) -> None:
    assert _called(text) == []
    assert _reasons(text) == {reason}


@pytest.mark.parametrize(
    "text",
    [
        f"Sending {BARE} now",  # no special token: a call inside a sentence stays prose
        f"Result: {BARE} I used it for this.",  # bare JSON inside the answer, followed on its line
    ],
)
def test_without_a_special_token_the_line_rules_hold(text: str) -> None:
    assert _called(text) == []
    assert _reasons(text) & {NotACall.IN_SENTENCE, NotACall.FOLLOWED}


def test_permission_words_before_a_call_are_how_an_agent_acts_on_a_confirmation() -> None:
    assert _called(f"Thanks for confirming, I will proceed.\n{BARE}") == ["add"]


GEMMA = "<|tool_call>call:add{a:1,b:2}<tool_call|>"
TAGGED = f"<tool_call>{BARE}</tool_call>"
SPECIAL = {"mistral": MISTRAL, "deepseek": DEEPSEEK, "kimi": KIMI, "gemma4": GEMMA, "tag": TAGGED}
REFUSING_LEADS = [
    "I will not run",
    "Yesterday I already ran",
    "If you confirm, I'll do",
    "For example,",
    "Maybe",
    "You could call",
]
REFUSING_TAILS = [
    "unless you confirm.",
    ", and it went through.",
    "\u2014 which I ran yesterday.",
    "and it went through.",
    "was what I ran.",
    "? Shall I proceed?",
    "Please confirm first.",
]
NEUTRAL = ["Sure.", "Checking now", "One moment", "Let me add those"]


@pytest.mark.parametrize("glue", ["", " "])
@pytest.mark.parametrize("lead", REFUSING_LEADS)
@pytest.mark.parametrize("form", SPECIAL)
def test_a_refusing_lead_glued_to_any_special_token_call_keeps_it_prose(
    form: str, lead: str, glue: str
) -> None:
    assert _called(f"{lead}{glue}{SPECIAL[form]}") == []


@pytest.mark.parametrize("glue", ["", " "])
@pytest.mark.parametrize("tail", REFUSING_TAILS)
@pytest.mark.parametrize("form", SPECIAL)
def test_a_refusing_tail_glued_to_any_special_token_call_keeps_it_prose(
    form: str, tail: str, glue: str
) -> None:
    assert _called(f"{SPECIAL[form]}{glue}{tail}") == []


@pytest.mark.parametrize(
    ("opening", "closing"),
    [('"', '"'), ("\u201c", "\u201d"), ("`", "`"), ("(", ")"), ("> ", "")],
    ids=["quotes", "curly quotes", "backticks", "parenthesis", "block quote"],
)
@pytest.mark.parametrize("form", SPECIAL)
def test_a_quoted_special_token_call_is_prose(form: str, opening: str, closing: str) -> None:
    assert _called(f"The log shows {opening}{SPECIAL[form]}{closing}") == []
    assert _called(f"{opening}{SPECIAL[form]}{closing}") == []


@pytest.mark.parametrize("glue", ["", " "])
@pytest.mark.parametrize("prose", NEUTRAL)
@pytest.mark.parametrize("form", SPECIAL)
def test_neutral_prose_glued_to_any_special_token_call_leaves_it_a_call(
    form: str, prose: str, glue: str
) -> None:
    assert _called(f"{prose}{glue}{SPECIAL[form]}") == ["add"]
    assert _called(f"{SPECIAL[form]}{glue}{prose}") == ["add"]
