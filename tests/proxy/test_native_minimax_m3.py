"""MiniMax-M3's values read as its template writes them: ``]<]minimax[>[`` before every tag of
the call, a string as it is; under a union, the one alternative the elements fit, and none when
two readings fit (the template writes both alike: the call is reported, never promoted).
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.textcalls import promote_answer
from repairproxy.native import find_native_calls

NS = "]<]minimax[>["
UNION = {
    "type": "object",
    "properties": {
        "filter": {
            "anyOf": [
                {"type": "array", "items": {"type": "string"}},
                {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "op": {"type": "string"}},
                    "required": ["field", "op"],
                },
            ]
        },
        "label": {"oneOf": [{"type": "string"}, {"type": "object"}]},
        "limit": {
            "oneOf": [
                {"type": "integer"},
                {"type": "object", "properties": {"max": {"type": "integer"}}},
            ]
        },
        "markup": {"type": "string"},
        "spec": {
            "anyOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"a": {"type": "string"}}},
            ]
        },
    },
}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": UNION}}]


def _call(arguments: str) -> str:
    return f'{NS}<tool_call>\n{NS}<invoke name="f">{arguments}{NS}</invoke>\n{NS}</tool_call>'


def _element(key: str, inner: str) -> str:
    return f"{NS}<{key}>{inner}{NS}</{key}>"


def _read(text: str) -> list[Any]:
    return [call.arguments for match in find_native_calls(text, TOOLS) for call in match.calls]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (_element("filter", _element("item", "a") + _element("item", "b")), {"filter": ["a", "b"]}),
        (
            _element("filter", _element("field", "x") + _element("op", "eq")),
            {"filter": {"field": "x", "op": "eq"}},
        ),
        (_element("limit", "5"), {"limit": 5}),
        (_element("limit", _element("max", "10")), {"limit": {"max": 10}}),
        (_element("label", "hi"), {"label": "hi"}),
        (_element("markup", "<p>a</p>\n"), {"markup": "<p>a</p>\n"}),  # no namespace: value
    ],
)
def test_each_value_is_read_as_the_template_wrote_it(arguments: str, expected: Any) -> None:
    assert _read(_call(arguments)) == [expected]


@pytest.mark.parametrize(
    "arguments",
    [
        _element("label", _element("text", "hi")),  # the object, or the string holding it
        _element("markup", _element("b", "x")),  # a string schema holding namespaced markup
        _element("spec", _element("a", "1")),  # two object alternatives, two readings
    ],
)
def test_elements_the_schema_reads_two_ways_are_not_promoted(arguments: str) -> None:
    (raw,) = _read(_call(arguments))
    assert isinstance(raw, str)  # the raw text: validation reports it
    result = promote_answer({"tools": TOOLS}, _call(arguments))
    assert result.calls == () and result.flagged


@pytest.mark.parametrize(
    "arguments",
    [
        _element("limit", "about " + _element("max", "10")),  # text mixed with elements
        _element("limit", "5") + "junk",  # text outside any argument
        _element("limit", "5") + f"{NS}</max>",  # a closing tag with no opening one
    ],
)
def test_a_malformed_call_is_claimed_and_reported_not_read_by_another_format(
    arguments: str,
) -> None:
    text = _call(arguments)
    assert [type(raw) for raw in _read(text)] == [str]  # MiniMax-M2's reading never gets it
    result = promote_answer({"tools": TOOLS}, text)
    assert result.calls == () and result.flagged


def test_a_call_inside_the_reasoning_block_is_not_promoted() -> None:
    call = _call(_element("limit", "5"))
    for text in (f"<mm:think>Maybe {call}</mm:think>Done.", f"<mm:think>Plan:\n{call}"):
        result = promote_answer({"tools": TOOLS}, text)
        assert result.calls == () and not result.flagged


@pytest.mark.parametrize(
    "text",
    [
        f'<invoke name="f">{_element("limit", "5")}{NS}</invoke>',  # M3 elements, opener lost
        '<minimax:tool_call><invoke name="f"><limit>5</limit></invoke></minimax:tool_call>',
    ],
)
def test_an_invoke_holding_other_elements_than_parameters_is_not_read_as_empty(text: str) -> None:
    """MiniMax-M2's ``<invoke>`` reads ``<parameter name=...>`` only: other elements in it are
    values it cannot read, so the call is reported, never promoted as ``f({})``."""
    result = promote_answer({"tools": TOOLS}, text)
    assert result.calls == () and result.flagged
