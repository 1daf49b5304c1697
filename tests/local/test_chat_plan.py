"""Request planning: tool choice modes, sampling params, errors; no model needed."""

from __future__ import annotations

import pytest

from repairproxy.local.chat import InvalidChatRequest, plan_chat
from repairproxy.local.grammar import JSON_OBJECT_GBNF, forced_call_grammar
from tests.support.tools import FIND_USER_BY_EMAIL, GET_ORDER

TOOLS = [FIND_USER_BY_EMAIL, GET_ORDER]
USER = [{"role": "user", "content": "hi"}]


def test_auto_tools_parse_without_grammar() -> None:
    plan = plan_chat({"messages": USER, "tools": TOOLS})
    assert plan.parse_tools and not plan.forced
    assert plan.params.grammar is None
    assert "<tools>" in plan.prompt


def test_tool_choice_none_keeps_text() -> None:
    plan = plan_chat({"messages": USER, "tools": TOOLS, "tool_choice": "none"})
    assert not plan.parse_tools and plan.params.grammar is None


def test_named_tool_choice_grammar_allows_only_that_name() -> None:
    choice = {"type": "function", "function": {"name": "get_order_details"}}
    plan = plan_chat({"messages": USER, "tools": TOOLS, "tool_choice": choice})
    assert plan.forced and plan.params.grammar is not None
    assert "get_order_details" in plan.params.grammar
    assert "find_user_id_by_email" not in plan.params.grammar


def test_required_allows_every_declared_name_and_several_calls() -> None:
    plan = plan_chat({"messages": USER, "tools": TOOLS, "tool_choice": "required"})
    grammar = plan.params.grammar or ""
    assert "find_user_id_by_email" in grammar and "get_order_details" in grammar
    assert grammar.startswith('root ::= block ( "\\n" block )*')


def test_named_choice_of_undeclared_tool_is_rejected() -> None:
    choice = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(InvalidChatRequest) as info:
        plan_chat({"messages": USER, "tools": TOOLS, "tool_choice": choice})
    assert info.value.param == "tool_choice"


def test_schema_converter_used_and_failure_falls_back() -> None:
    seen: list[str] = []

    def converter(schema: str) -> str:
        seen.append(schema)
        return 'root ::= "{}"'

    grammar = forced_call_grammar(["get_order_details"], TOOLS, schema_to_gbnf=converter)
    assert '"const": "get_order_details"' in seen[0]
    assert 'call ::= "{}"' in grammar

    def broken(_: str) -> str:
        raise ValueError("unsupported")

    fallback = forced_call_grammar(["get_order_details"], TOOLS, schema_to_gbnf=broken)
    assert 'name ::= "\\"get_order_details\\""' in fallback


def test_sampling_params_are_taken_from_the_request() -> None:
    body = {
        "messages": USER,
        "max_tokens": 7,
        "temperature": 0,
        "seed": 3,
        "stop": "END",
        "logprobs": True,
        "top_logprobs": 2,
    }
    params = plan_chat(body).params
    assert (params.max_tokens, params.temperature, params.seed) == (7, 0.0, 3)
    assert params.stop == ("END",)
    assert params.logprobs and params.top_logprobs == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "x"}]}, "messages"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "top_logprobs": 50}, "top_logprobs"),
        ({"messages": USER, "n": 2}, "n"),
    ],
)
def test_bad_requests_name_the_parameter(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidChatRequest) as info:
        plan_chat(body)
    assert info.value.param == param


def test_legacy_functions_become_tools() -> None:
    body = {
        "messages": USER,
        "functions": [t["function"] for t in TOOLS],
        "function_call": {"name": "get_order_details"},
    }
    plan = plan_chat(body)
    assert plan.forced and "get_order_details" in (plan.params.grammar or "")


ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}


def test_a_response_format_is_a_grammar_over_the_answer_when_no_tool_can_be_called() -> None:
    schema_format = {"type": "json_schema", "json_schema": {"name": "o", "schema": ORDER_SCHEMA}}
    seen: list[str] = []

    def converter(schema: str) -> str:
        seen.append(schema)
        return 'root ::= "{}"'

    plan = plan_chat({"messages": USER, "response_format": schema_format}, converter)
    assert plan.params.grammar == 'root ::= "{}"' and len(seen) == 1
    assert '"order_id"' in seen[0]
    plain = plan_chat({"messages": USER, "response_format": {"type": "json_object"}})
    assert plain.params.grammar == JSON_OBJECT_GBNF
    unconvertible = plan_chat({"messages": USER, "response_format": schema_format}, None)
    assert unconvertible.params.grammar == JSON_OBJECT_GBNF
    text = plan_chat({"messages": USER, "response_format": {"type": "text"}})
    assert text.params.grammar is None
    # Callable tools: a grammar over the content would forbid the calls; the proxy checks it.
    with_tools = plan_chat({"messages": USER, "tools": TOOLS, "response_format": schema_format})
    assert with_tools.params.grammar is None and with_tools.parse_tools
    no_calls = {"messages": USER, "tools": TOOLS, "tool_choice": "none"}
    assert plan_chat({**no_calls, "response_format": schema_format}, converter).params.grammar
