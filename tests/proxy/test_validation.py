"""Table-driven tests of call classification: every channel, nested schemas, $ref, caching."""

from __future__ import annotations

import difflib
import json
from typing import Any

import pytest

from repairproxy.errors import InvalidToolsError
from repairproxy.validation import (
    CallVerdict,
    Channel,
    CompiledTools,
    MessageVerdict,
    ToolsCache,
    find_call_in_text,
)

ADDRESS = {
    "type": "object",
    "properties": {
        "address1": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"type": "string"},
    },
    "required": ["address1", "city", "zip"],
    "additionalProperties": False,
}


def _tool(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"{name} tool"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


RETAIL_TOOLS = [
    _tool(
        "get_order_details",
        {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    ),
    _tool(
        "cancel_pending_order",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
            },
            "required": ["order_id", "reason"],
            "additionalProperties": False,
        },
    ),
    _tool(
        "exchange_delivered_order_items",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "item_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "new_item_ids": {"type": "array", "items": {"type": "string"}},
                "payment_method_id": {"type": "string"},
                "note": {"type": "string"},
            },
            "required": ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
        },
    ),
    _tool(
        "modify_user_address",
        {
            "type": "object",
            "$defs": {"address": ADDRESS},
            "properties": {"user_id": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "required": ["user_id", "address"],
        },
    ),
    _tool("list_all_product_types", None),
]

GOOD_ADDRESS = {"address1": "1 Main St", "city": "Austin", "zip": "78701"}

# (case id, tool name, arguments, expected channel, fragment the diagnosis or a path must contain)
CALL_CASES: list[tuple[str, str, Any, Channel, str]] = [
    ("simple valid", "get_order_details", '{"order_id": "#W1"}', Channel.VALID, ""),
    ("mapping arguments", "get_order_details", {"order_id": "#W1"}, Channel.VALID, ""),
    (
        "optional field absent",
        "exchange_delivered_order_items",
        {"order_id": "#W1", "item_ids": ["1"], "new_item_ids": ["2"], "payment_method_id": "p"},
        Channel.VALID,
        "",
    ),
    (
        "optional field present",
        "exchange_delivered_order_items",
        {
            "order_id": "#W1",
            "item_ids": ["1"],
            "new_item_ids": [],
            "payment_method_id": "p",
            "note": "x",
        },
        Channel.VALID,
        "",
    ),
    ("no parameters declared", "list_all_product_types", "{}", Channel.VALID, ""),
    (
        "ref valid",
        "modify_user_address",
        {"user_id": "u", "address": GOOD_ADDRESS},
        Channel.VALID,
        "",
    ),
    ("unknown name", "get_order", "{}", Channel.UNKNOWN_TOOL, "get_order_details"),
    (
        "unknown camel case",
        "cancelPendingOrder",
        "{}",
        Channel.UNKNOWN_TOOL,
        "cancel_pending_order",
    ),
    ("empty name", "", "{}", Channel.UNKNOWN_TOOL, "Declared tools"),
    (
        "broken json",
        "get_order_details",
        '{"order_id": "#W1"',
        Channel.INVALID_JSON,
        "not valid JSON",
    ),
    ("empty arguments", "get_order_details", "", Channel.INVALID_JSON, "not valid JSON"),
    ("single quotes", "get_order_details", "{'order_id': '#W1'}", Channel.INVALID_JSON, "JSON"),
    ("json array", "get_order_details", '["#W1"]', Channel.INVALID_JSON, "JSON object"),
    ("json string", "get_order_details", '"#W1"', Channel.INVALID_JSON, "JSON object"),
    ("decoded list arguments", "get_order_details", ["#W1"], Channel.INVALID_JSON, "JSON object"),
    ("decoded number arguments", "get_order_details", 7, Channel.INVALID_JSON, "JSON object"),
    (
        "non-json values",
        "get_order_details",
        {"order_id": {1, 2}},
        Channel.INVALID_JSON,
        "non-JSON",
    ),
    (
        "missing required",
        "get_order_details",
        "{}",
        Channel.SCHEMA_VIOLATION,
        '"order_id" is a required property',
    ),
    (
        "wrong type",
        "get_order_details",
        '{"order_id": 17}',
        Channel.SCHEMA_VIOLATION,
        "$.order_id: 17 is not of type",
    ),
    (
        "enum",
        "cancel_pending_order",
        {"order_id": "#W1", "reason": "bored"},
        Channel.SCHEMA_VIOLATION,
        "$.reason:",
    ),
    (
        "additional property",
        "cancel_pending_order",
        {"order_id": "#W1", "reason": "ordered by mistake", "force": True},
        Channel.SCHEMA_VIOLATION,
        "force",
    ),
    (
        "array item type",
        "exchange_delivered_order_items",
        {"order_id": "#W1", "item_ids": ["1", 2], "new_item_ids": [], "payment_method_id": "p"},
        Channel.SCHEMA_VIOLATION,
        "$.item_ids[1]",
    ),
    (
        "array min items",
        "exchange_delivered_order_items",
        {"order_id": "#W1", "item_ids": [], "new_item_ids": [], "payment_method_id": "p"},
        Channel.SCHEMA_VIOLATION,
        "$.item_ids",
    ),
    (
        "nested via ref missing",
        "modify_user_address",
        {"user_id": "u", "address": {"address1": "1 Main", "city": "Austin"}},
        Channel.SCHEMA_VIOLATION,
        '$.address: "zip" is a required property',
    ),
    (
        "nested via ref wrong type",
        "modify_user_address",
        {"user_id": "u", "address": {**GOOD_ADDRESS, "zip": 78701}},
        Channel.SCHEMA_VIOLATION,
        "$.address.zip",
    ),
    (
        "nested via ref extra",
        "modify_user_address",
        {"user_id": "u", "address": {**GOOD_ADDRESS, "country": "US"}},
        Channel.SCHEMA_VIOLATION,
        "country",
    ),
]


@pytest.fixture(scope="module")
def tools() -> CompiledTools:
    compiled = ToolsCache().compile({"tools": RETAIL_TOOLS})
    assert compiled is not None
    return compiled


@pytest.mark.parametrize(
    ("name", "arguments", "channel", "fragment"),
    [case[1:] for case in CALL_CASES],
    ids=[case[0] for case in CALL_CASES],
)
def test_check_call(
    tools: CompiledTools, name: str, arguments: Any, channel: Channel, fragment: str
) -> None:
    verdict = tools.check_call(name, arguments)
    assert verdict.channel is channel, verdict
    assert verdict.name == name
    if channel is Channel.VALID:
        assert verdict.diagnosis == ""
        assert verdict.error_paths == ()
    else:
        assert fragment in verdict.diagnosis
    if channel is Channel.SCHEMA_VIOLATION:
        assert any(
            fragment in path or fragment in verdict.diagnosis for path in verdict.error_paths
        )
        assert all(path.startswith("$") for path in verdict.error_paths)
    if channel is Channel.UNKNOWN_TOOL:
        assert verdict.closest_tool in tools.names


def test_schema_violation_lists_every_failing_path(tools: CompiledTools) -> None:
    verdict = tools.check_call("cancel_pending_order", {"order_id": 1, "reason": "bored"})
    assert verdict.channel is Channel.SCHEMA_VIOLATION
    assert [path.split(":")[0] for path in verdict.error_paths] == ["$.order_id", "$.reason"]


def test_unknown_tool_diagnosis_lists_declared_names(tools: CompiledTools) -> None:
    verdict = tools.check_call("get_user_details", "{}")
    for name in tools.names:
        assert name in verdict.diagnosis
    assert verdict.closest_tool == "get_order_details"


def test_closest_name(tools: CompiledTools) -> None:
    assert tools.closest_name("get_order_details") == "get_order_details"
    assert tools.closest_name("GET-ORDER-DETAILS") == "get_order_details"
    assert tools.closest_name("cancel_order") == "cancel_pending_order"
    assert tools.closest_name("exchange_items") == "exchange_delivered_order_items"
    assert CompiledTools([]).closest_name("anything") is None


def _call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# (case id, assistant message, expected channels in order, expected closest tool of first verdict)
MESSAGE_CASES: list[tuple[str, dict[str, Any], list[Channel], str | None]] = [
    ("plain text answer", {"role": "assistant", "content": "Your order shipped."}, [], None),
    ("text with unrelated json", {"content": 'Config: {"retries": 3, "name": "x"}'}, [], None),
    ("refusal only", {"content": None, "refusal": "I cannot help with that."}, [], None),
    (
        "one valid call",
        {"content": None, "tool_calls": [_call("get_order_details", '{"order_id":"#W1"}', "a")]},
        [Channel.VALID],
        None,
    ),
    (
        "parallel mixed",
        {
            "content": None,
            "tool_calls": [
                _call("get_order_details", '{"order_id":"#W1"}', "a"),
                _call("get_orders", "{}", "b"),
                _call("get_order_details", "{", "c"),
                _call("cancel_pending_order", '{"order_id":"#W1"}', "d"),
            ],
        },
        [Channel.VALID, Channel.UNKNOWN_TOOL, Channel.INVALID_JSON, Channel.SCHEMA_VIOLATION],
        None,
    ),
    (
        "legacy function_call",
        {"content": None, "function_call": {"name": "get_order", "arguments": "{}"}},
        [Channel.UNKNOWN_TOOL],
        "get_order_details",
    ),
    ("empty content", {"content": ""}, [Channel.EMPTY_OUTPUT], None),
    ("null content", {"content": None}, [Channel.EMPTY_OUTPUT], None),
    ("whitespace content", {"content": " \n "}, [Channel.EMPTY_OUTPUT], None),
    ("empty tool_calls list", {"content": None, "tool_calls": []}, [Channel.EMPTY_OUTPUT], None),
    (
        "bare json call",
        {
            "content": 'I will check. {"name": "get_order_details", '
            '"arguments": {"order_id": "#W1"}}'
        },
        [Channel.TOOL_CALL_IN_CONTENT],
        "get_order_details",
    ),
    (
        "parameters key",
        {"content": '{"name": "cancel_order", "parameters": {"order_id": "1"}}'},
        [Channel.TOOL_CALL_IN_CONTENT],
        "cancel_pending_order",
    ),
    (
        "tool_call tags",
        {
            "content": '<tool_call>\n{"name": "get_order_details", '
            '"arguments": {"order_id": "#W1"}}\n</tool_call>'
        },
        [Channel.TOOL_CALL_IN_CONTENT],
        "get_order_details",
    ),
    (
        "unclosed broken tag",
        {"content": '<tool_call>{"name": "modify_address", "arguments": {'},
        [Channel.TOOL_CALL_IN_CONTENT],
        "modify_user_address",
    ),
    (
        "fenced json",
        {
            "content": 'Here:\n```json\n{"type": "function", "function": '
            '{"name": "list_all_product_types", "arguments": "{}"}}\n```'
        },
        [Channel.TOOL_CALL_IN_CONTENT],
        "list_all_product_types",
    ),
    (
        "content parts",
        {
            "content": [
                {"type": "text", "text": '{"name": "get_order_details", '},
                {"type": "text", "text": '"arguments": {}}'},
            ]
        },
        [Channel.TOOL_CALL_IN_CONTENT],
        "get_order_details",
    ),
    (
        "llama function tag",
        {"content": '<function=get_order_details>{"order_id": "1"}</function>'},
        [Channel.TOOL_CALL_IN_CONTENT],
        "get_order_details",
    ),
]


@pytest.mark.parametrize(
    ("message", "channels", "closest"),
    [case[1:] for case in MESSAGE_CASES],
    ids=[case[0] for case in MESSAGE_CASES],
)
def test_check_message(
    tools: CompiledTools, message: dict[str, Any], channels: list[Channel], closest: str | None
) -> None:
    verdict = tools.check_message(message)
    assert [call.channel for call in verdict.calls] == channels
    assert verdict.ok == all(channel is Channel.VALID for channel in channels)
    assert verdict.error_channels == tuple(c for c in channels if c is not Channel.VALID)
    if channels and closest is not None:
        assert verdict.calls[0].closest_tool == closest
    for verdict_call in verdict.calls:
        assert (verdict_call.diagnosis == "") == (verdict_call.channel is Channel.VALID)


def test_parallel_calls_keep_index_and_id(tools: CompiledTools) -> None:
    message = {"tool_calls": [_call("get_order_details", "{}", "x1"), _call("nope", "{}", "x2")]}
    verdict = tools.check_message(message)
    assert [(c.index, c.call_id, c.name) for c in verdict.calls] == [
        (0, "x1", "get_order_details"),
        (1, "x2", "nope"),
    ]


def test_malformed_tool_call_entries_are_unknown_tools(tools: CompiledTools) -> None:
    verdict = tools.check_message({"tool_calls": ["garbage", {"id": "q", "function": None}]})
    assert verdict.error_channels == (Channel.UNKNOWN_TOOL, Channel.UNKNOWN_TOOL)
    assert verdict.calls[1].call_id == "q"


def test_message_verdict_without_calls_is_ok() -> None:
    assert MessageVerdict(()).ok
    assert MessageVerdict(()).error_channels == ()
    bad = CallVerdict(0, None, None, Channel.EMPTY_OUTPUT, "empty")
    assert not MessageVerdict((bad,)).ok


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no braces at all", None),
        ('{"a": 1} and {"b": 2}', None),
        ("{ not json", None),
        ('[{"name": "f", "arguments": {}}]', ("f",)),
        ('x {"name": "g", "arguments": "{}"} y', ("g",)),
        ("<tool_call>garbage</tool_call>", (None,)),
    ],
)
def test_find_call_in_text(text: str, expected: tuple[str | None] | None) -> None:
    assert find_call_in_text(text) == expected


# --- compiling and the cache ---------------------------------------------------------------------


def test_no_tools_means_no_validation() -> None:
    assert ToolsCache().compile({"messages": []}) is None


def test_legacy_functions_are_compiled_like_tools() -> None:
    functions = [tool["function"] for tool in RETAIL_TOOLS]
    compiled = ToolsCache().compile({"functions": functions})
    assert compiled is not None
    assert compiled.names == tuple(tool["function"]["name"] for tool in RETAIL_TOOLS)
    assert compiled.check_call("get_order_details", "{}").channel is Channel.SCHEMA_VIOLATION


def test_non_function_tools_are_ignored() -> None:
    compiled = ToolsCache().compile(
        {"tools": [{"type": "web_search"}, _tool("f", {"type": "object"})]}
    )
    assert compiled is not None
    assert compiled.names == ("f",)


@pytest.mark.parametrize(
    ("tools", "tool_name"),
    [
        ([_tool("bad_type", {"type": "objekt"})], "bad_type"),
        (
            [_tool("ok", {"type": "object"}), _tool("bad_required", {"required": "x"})],
            "bad_required",
        ),
        ([_tool("bad_ref", {"$ref": "#/$defs/missing"})], "bad_ref"),
        ([_tool("remote_ref", {"$ref": "https://example.invalid/schema.json"})], "remote_ref"),
        ([_tool("params_not_object", [])], "params_not_object"),  # type: ignore[arg-type]
    ],
)
def test_invalid_schema_names_the_tool(tools: list[dict[str, Any]], tool_name: str) -> None:
    with pytest.raises(InvalidToolsError) as caught:
        ToolsCache().compile({"tools": tools})
    assert caught.value.tool_name == tool_name
    assert tool_name in caught.value.message
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    "tools",
    [["not an object"], [{"type": "function"}], [{"type": "function", "function": {}}]],
)
def test_malformed_tools_list_is_rejected(tools: list[Any]) -> None:
    with pytest.raises(InvalidToolsError):
        ToolsCache().compile({"tools": tools})


def test_cache_compiles_once_per_distinct_list() -> None:
    cache = ToolsCache(max_entries=4)
    first = cache.compile({"tools": RETAIL_TOOLS})
    # The same tools, freshly parsed from the next request of the conversation: same entry.
    assert cache.compile({"tools": json.loads(json.dumps(RETAIL_TOOLS))}) is first
    assert len(cache) == 1
    other = cache.compile({"tools": RETAIL_TOOLS[:1]})
    assert other is not first and other is not None
    assert other.names == ("get_order_details",)
    # Reordered keys are still validated the same way (possibly from a second entry).
    reordered = cache.compile({"tools": json.loads(json.dumps(RETAIL_TOOLS, sort_keys=True))})
    assert reordered is not None and reordered.names == first.names  # type: ignore[union-attr]
    assert len(cache) <= 3


def test_cache_is_bounded_lru() -> None:
    cache = ToolsCache(max_entries=2)
    bodies = [{"tools": [_tool(f"tool_{i}", {"type": "object"})]} for i in range(3)]
    a = cache.compile(bodies[0])
    cache.compile(bodies[1])
    assert cache.compile(bodies[0]) is a  # touch: bodies[1] is now least recently used
    cache.compile(bodies[2])
    assert len(cache) == 2
    assert cache.compile(bodies[0]) is a
    assert cache.compile(bodies[1]) is not None  # recompiled after eviction
    with pytest.raises(ValueError):
        ToolsCache(max_entries=0)


def test_forbid_extra_arguments_closes_open_schemas() -> None:
    body = {"tools": RETAIL_TOOLS}
    extra = {"order_id": "#W1", "verbose": True}
    lenient = ToolsCache().compile(body)
    strict = ToolsCache(forbid_extra_arguments=True).compile(body)
    assert lenient is not None and strict is not None
    assert lenient.check_call("get_order_details", extra).channel is Channel.VALID
    verdict = strict.check_call("get_order_details", extra)
    assert verdict.channel is Channel.SCHEMA_VIOLATION
    assert "verbose" in verdict.diagnosis
    # Schemas that say something about extra properties, or have none, are left as declared.
    assert strict.check_call("get_order_details", {"order_id": "#W1"}).channel is Channel.VALID
    assert strict.check_call("list_all_product_types", {"anything": 1}).channel is Channel.VALID
    open_tool = _tool("open", {"type": "object", "properties": {}, "additionalProperties": True})
    opened = ToolsCache(forbid_extra_arguments=True).compile({"tools": [open_tool]})
    assert opened is not None
    assert opened.check_call("open", {"x": 1}).channel is Channel.VALID
    assert "additionalProperties" not in RETAIL_TOOLS[0]["function"]["parameters"]


def test_closest_name_matches_an_exhaustive_search() -> None:
    names = [tool["function"]["name"] for tool in RETAIL_TOOLS] + [
        "find_user_id_by_email",
        "find_user_id_by_name_zip",
        "get_product_details",
        "return_delivered_order_items",
        "transfer_to_human_agents",
    ]
    compiled = CompiledTools([(name, {"type": "object"}) for name in names])

    def exhaustive(query: str) -> str:
        def norm(text: str) -> str:
            return "".join(ch for ch in text.lower() if ch.isalnum())

        return max(names, key=lambda n: difflib.SequenceMatcher(None, norm(n), norm(query)).ratio())

    queries = [
        "get_order",
        "find_user",
        "return_items",
        "transfer",
        "lookup_email",
        "get_prod",
        "cancel",
        "exchange",
        "modify_address",
        "zzz",
        "get_user_info",
    ]
    for query in queries:
        assert compiled.closest_name(query) == exhaustive(query), query
        assert compiled.closest_name(query) == exhaustive(query), query  # remembered answer
