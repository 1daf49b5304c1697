"""Calls an answer presents as examples are not calls: lead-ins over several blocks, listings in
one fence, answers cut off inside a fence.

The first case is a real answer (the embedded demo, retail task 70, Qwen2.5-Coder-1.5B Q4_K_M):
steps, then "Here is an example of how you can call these functions:" and four fences, the last
cut at the token limit. It reached the agent as a call to the third fence's tool. The hostile
corpus (category ``presented_as_example``) holds it with variants; these tests pin the rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repairproxy.textcalls import NotACall, read_text_calls

CORPUS = Path(__file__).parents[1] / "data" / "textcalls" / "hostile.jsonl"
CASES = {
    case["id"]: case
    for case in map(json.loads, CORPUS.read_text(encoding="utf-8").splitlines())
    if case["category"] == "presented_as_example"
}

GET = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
LIST = '{"name": "list_all_product_types", "arguments": {}}'


def _fence(body: str) -> str:
    return f"```json\n{body}\n```"


def test_the_demo_answer_promotes_nothing() -> None:
    case = CASES["presented_as_example-001"]
    assert case["provenance"].startswith("embedded demo")
    reading = read_text_calls(case["content"], conversation=case["messages"])
    assert reading.calls == ()
    assert {call.name for call, _ in reading.prose} == {
        "find_order_details",
        "modify_pending_order_items",
    }


def test_an_example_lead_in_governs_every_fence_after_it() -> None:
    # The fence between them is no call (no arguments): the lead-in reaches over it.
    text = (
        "Here is an example of how you can call these functions:\n\n"
        + _fence(GET)
        + "\n\n"
        + _fence('{"name": "list_all_product_types"}')
        + "\n\n"
        + _fence(LIST)
    )
    reading = read_text_calls(text)
    assert reading.calls == ()
    assert [reason for _, reason in reading.prose] == [NotACall.EXAMPLE, NotACall.EXAMPLE]


def test_a_lead_in_is_found_over_a_block_longer_than_a_sentence_window() -> None:
    long_block = _fence(json.dumps({"rows": ["x" * 60] * 20}))
    text = f"For example:\n{long_block}\n{_fence(GET)}"
    assert read_text_calls(text).calls == ()


def test_after_an_example_later_calls_belong_to_the_presentation() -> None:
    text = f"Example:\n\n{_fence(GET)}\n\nThen the products:\n\n{_fence(LIST)}"
    reading = read_text_calls(text)
    assert reading.calls == ()
    assert [reason for _, reason in reading.prose] == [NotACall.EXAMPLE, NotACall.EXAMPLE]


def test_several_values_in_one_fence_are_a_listing() -> None:
    text = f"```json\n{GET}\n// or\n{GET.replace('#W1', '#W2')}\n```"
    reading = read_text_calls(text)
    assert reading.calls == ()
    assert {reason for _, reason in reading.prose} == {NotACall.EXAMPLE}


def test_an_answer_cut_off_inside_a_fence_promotes_nothing() -> None:
    text = f'I need the order first.\n\n{_fence(GET)}\n\n```json\n{{\n  "name": "list_all'
    reading = read_text_calls(text)
    assert reading.calls == ()
    assert [reason for _, reason in reading.prose] == [NotACall.CUT_OFF]
    assert [c.name for c in read_text_calls(text + 'product_types", "arguments": {}}\n```').calls]


@pytest.mark.parametrize(
    "text",
    [
        f"Let me look up your order.\n\n{_fence(GET)}",
        f"Here is the call:\n{_fence(GET)}",
        f"1. I look up the order (for example #W1).\n\nStarting with step 1:\n\n{_fence(GET)}",
        f"I'll look up the order and the products now.\n\n{_fence(GET)}\n\n{_fence(LIST)}",
    ],
    ids=["plain lead-in", "here is the call", "example earlier, plain lead-in", "two fences"],
)
def test_a_fenced_call_made_as_an_act_is_still_a_call(text: str) -> None:
    reading = read_text_calls(text)
    assert reading.prose == ()
    assert reading.calls


def test_an_answer_cut_off_inside_a_bare_value_promotes_nothing() -> None:
    text = f'{GET}\n{{"name": "get_order_details", "arguments": {{"order_id": "#W2'
    reading = read_text_calls(text)
    assert reading.calls == ()
    assert [reason for _, reason in reading.prose] == [NotACall.CUT_OFF]


def test_an_identifier_is_one_word_not_a_cue() -> None:
    # "last_name" holds no "last" (a narration cue).
    assert read_text_calls(f"{GET}\nI will need your first_name and last_name as well.").calls


def _call(name: str) -> str:
    return f'{{"name": "{name}", "arguments": {{}}}}'


DECLARED = {name: {"type": "object"} for name in ("a", "b", "c", "d", "e")}


def test_one_call_to_each_of_a_run_of_declared_tools_recites_the_toolkit() -> None:
    text = "\n".join(_call(name) for name in ("b", "c", "d", "e"))
    reading = read_text_calls(text, tools=DECLARED)
    assert reading.calls == ()
    assert {reason for _, reason in reading.prose} == {NotACall.TOOLKIT}


@pytest.mark.parametrize(
    "names",
    [("a", "b", "c"), ("a", "c", "b", "d"), ("a", "b", "b", "c"), ("a", "b", "c", "x")],
    ids=["three", "out of order", "a repeat", "an undeclared name"],
)
def test_other_sets_of_calls_are_still_calls(names: tuple[str, ...]) -> None:
    text = "\n".join(_call(name) for name in names)
    assert [c.name for c in read_text_calls(text, tools=DECLARED).calls] == list(names)


def test_special_token_calls_to_every_declared_tool_are_acts() -> None:
    text = "".join(f"<tool_call>{_call(name)}</tool_call>\n" for name in ("a", "b", "c", "d"))
    assert len(read_text_calls(text, tools=DECLARED).calls) == 4


@pytest.mark.parametrize(
    ("lead", "promoted"),
    [
        (
            "### Step 2\nUse the `check_apn_settings()` function to verify them.",
            False,
        ),
        ("Call the lookup with your order id:", False),
        ("Let me use the order lookup for that:", True),
        ("I will call the lookup now:", True),
    ],
    ids=["use, after a heading", "call", "use inside a sentence", "call inside a sentence"],
)
def test_an_instruction_to_the_reader_presents_the_call(lead: str, promoted: bool) -> None:
    assert bool(read_text_calls(f"{lead}\n{_fence(GET)}").calls) is promoted


@pytest.mark.parametrize(
    ("earlier", "promoted"),
    [
        ("You can do this by calling the `get_order_details` function.", False),
        ("1. **Find it**: Use the `get_order_details` function to find the order.", False),
        ("If needed you will need to use the order lookup tool.", False),
        ("Your gift card balance stays; you can use it later.", True),
        ("I'll use the `get_order_details` function to look that up.", True),
        ("Let me call the lookup for you.", True),
    ],
    ids=[
        "you can do this by",
        "imperative use",
        "you will need to use",
        "you can use it",
        "I'll use",
        "let me call",
    ],
)
def test_prose_telling_the_reader_how_to_use_the_tools_presents_later_calls(
    earlier: str, promoted: bool
) -> None:
    text = f"{earlier}\n\nHere is the request:\n{_fence(GET)}"
    assert bool(read_text_calls(text).calls) is promoted
