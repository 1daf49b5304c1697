"""A ``response_format`` is held to the tools' front-door limits (issue 51, finding 10): its schema
compiles with the same regex limits, so a pattern too large to match cheaply is refused as an
invalid schema, and one over ``--max-response-format-bytes`` of JSON gets 400 before anything is
compiled; its regular expressions and JSON nodes count with the tools' against the request's
``--max-schema-patterns`` and ``--max-schema-nodes``. Every schema (each tool, the format) is held
to ``MAX_SCHEMA_FANOUT``: the work of checking one value of an answer (``schema_fanout``), which a
``$ref`` fan-out multiplies. Nothing is timed: the tests read refusals, error bodies, verdicts,
bounds, counts and cache sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest

from repairproxy.errors import BadRequestError, InvalidToolsError
from repairproxy.settings import Settings
from repairproxy.structured import MAX_CACHED_SCHEMA_BYTES, FormatCache, OutputChannel
from repairproxy.types import RepairMode
from repairproxy.validation import (
    DEFAULT_MAX_SCHEMA_NODES,
    DEFAULT_MAX_SCHEMA_PATTERNS,
    MAX_SCHEMA_FANOUT,
    SchemaFanoutError,
    ToolsCache,
    schema_fanout,
    schema_fanout_from_bytes,
    schema_nodes,
    schema_patterns,
)
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion

# Compiles without limits and then costs ~0.2-0.5 s per 3,000-character value on the 2-core dev
# machine; its compiled program passes PATTERN_OPTIONS' size limit, so it is refused instead.
SLOW_PATTERN = r"(\w{100}){30}"
ASK = [{"role": "user", "content": "hi"}]


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _padded_schema(size: int) -> dict[str, Any]:
    """An ordinary object schema whose JSON takes at least ``size`` bytes (a long description)."""
    return {"type": "object", "description": "d" * size, "properties": {"a": {"type": "string"}}}


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


def _proxy(upstream: ScriptedUpstream, **overrides: Any) -> Any:
    settings = Settings(upstream=upstream.base_url, repair=RepairMode.REFLEXIVE)
    return running_proxy(replace(settings, **overrides))


def _post(proxy: RunningProxy, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.root_url}{path}", content=orjson.dumps(body), timeout=30)


# -- the pattern limits --------------------------------------------------------------------------


def test_a_pattern_too_large_to_match_cheaply_is_refused_as_an_invalid_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": SLOW_PATTERN}}}
    with pytest.raises(BadRequestError, match="not a valid JSON Schema") as caught:
        FormatCache().compile({"response_format": _format(schema)})
    assert caught.value.param == "response_format.json_schema.schema"


def test_a_normal_pattern_still_validates() -> None:
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{4}$"},
            # A lookahead needs fancy-regex's backtracking engine, which the limits bound.
            "user": {"type": "string", "pattern": r"^(?!admin)\w+$"},
        },
        "required": ["code", "user"],
    }
    output = FormatCache().compile({"response_format": _format(schema)})
    assert output is not None
    assert output.check('{"code": "AB-1234", "user": "ann"}').ok
    wrong_code = output.check('{"code": "ab-12", "user": "ann"}')
    assert wrong_code.channel is OutputChannel.SCHEMA_VIOLATION
    assert wrong_code.error_paths[0].startswith("$.code:")
    admin = output.check('{"code": "AB-1234", "user": "admin"}')
    assert admin.channel is OutputChannel.SCHEMA_VIOLATION
    assert admin.error_paths[0].startswith("$.user:")
    long_value = orjson.dumps({"code": "AB-1234", "user": "a" * 3000}).decode()
    assert output.check(long_value).ok


def test_the_slow_pattern_is_refused_through_the_proxy(upstream: ScriptedUpstream) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": SLOW_PATTERN}}}
    body = {"model": "m", "messages": ASK, "response_format": _format(schema)}
    with _proxy(upstream) as proxy:
        answer = _post(proxy, "/v1/chat/completions", body)
    assert answer.status_code == 400, answer.text
    assert "not a valid JSON Schema" in answer.json()["error"]["message"]
    assert upstream.requests == []  # refused before anything went upstream


# -- the byte cap --------------------------------------------------------------------------------


def test_a_format_over_the_cap_is_refused_before_compiling() -> None:
    cache = FormatCache(max_format_bytes=4096)
    # Invalid as a schema too: the cap answers first, so nothing was compiled.
    oversized = {"response_format": _format({"type": "x", "description": "d" * 4096})}
    with pytest.raises(BadRequestError, match="bytes of JSON; at most 4096") as caught:
        cache.compile(oversized)
    assert caught.value.param == "response_format"
    assert len(cache) == 0
    at_the_cap = {"response_format": _format(_padded_schema(3000))}
    assert cache.compile(at_the_cap) is not None


def test_an_accepted_format_is_compiled_once() -> None:
    # Every format the default cap accepts fits the cache: none is recompiled per request.
    cap = Settings(upstream="http://127.0.0.1:9/v1").max_response_format_bytes
    assert cap <= MAX_CACHED_SCHEMA_BYTES
    cache = FormatCache(max_format_bytes=cap)
    body = {"response_format": _format(_padded_schema(cap - 200))}
    assert len(orjson.dumps(body["response_format"])) <= cap
    first = cache.compile(body)
    assert first is not None and cache.compile(orjson.loads(orjson.dumps(body))) is first
    assert len(cache) == 1


def test_an_oversized_format_gets_an_openai_400(upstream: ScriptedUpstream) -> None:
    body = {"model": "m", "messages": ASK, "response_format": _format(_padded_schema(8192))}
    with _proxy(upstream, max_response_format_bytes=4096) as proxy:
        answer = _post(proxy, "/v1/chat/completions", body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "response_format"
    assert "at most 4096 are accepted" in error["message"]
    assert upstream.requests == []


def test_a_format_under_the_cap_goes_through(upstream: ScriptedUpstream) -> None:
    upstream.push(completion(content='{"a": "x"}'))
    body = {"model": "m", "messages": ASK, "response_format": _format(_padded_schema(1024))}
    with _proxy(upstream, max_response_format_bytes=4096) as proxy:
        answer = _post(proxy, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == '{"a": "x"}'


# -- the regex and node caps ---------------------------------------------------------------------

# Not a valid regular expression: a format holding it that gets the cap's 400, not the invalid
# schema's, was refused before anything was compiled.
UNCOMPILABLE = "("


def _patterned(count: int, first: int = 0) -> dict[str, Any]:
    """An object schema with ``count`` distinct patterns, numbered from ``first``."""
    properties = {f"p{i}": {"type": "string", "pattern": f"^x{i}$"} for i in range(first, count)}
    return {"type": "object", "properties": properties}


def test_patterns_are_counted_wherever_a_schema_nests_them() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^a$"},
            "again": {"type": "string", "pattern": "^a$"},  # the same regex compiles once
            "list": {"type": "array", "items": {"type": "string", "pattern": "^items$"}},
            "either": {"anyOf": [{"pattern": "^any$"}, {"allOf": [{"pattern": "^all$"}]}]},
            "one": {"oneOf": [{"not": {"pattern": "^not$"}}]},
            "keyed": {
                "type": "object",
                "patternProperties": {"^key$": {"type": "string", "pattern": "^value$"}},
            },
        },
        "$defs": {"d": {"pattern": "^defs$"}},
        # A $ref can point anywhere, so data that looks like a schema counts too.
        "examples": [{"pattern": "^example$"}],
    }
    assert schema_patterns(schema) == {
        "^a$",
        "^items$",
        "^any$",
        "^all$",
        "^not$",
        "^key$",
        "^value$",
        "^defs$",
        "^example$",
    }
    assert schema_patterns({"properties": {"pattern": {"type": "string"}}}) == set()


def test_nodes_are_the_objects_and_arrays_of_the_json() -> None:
    schema = {"anyOf": [{}, {"type": "array", "items": {"enum": ["a", "b"]}}]}
    # anyOf's list, the two branches, the root, items' object and enum's list.
    assert schema_nodes(orjson.dumps(schema)) == 6
    # A bracket inside a string counts too: an upper bound, read without a walk.
    assert schema_nodes(orjson.dumps({"description": "{[("})) == 3


def test_a_format_over_the_pattern_cap_is_refused_before_compiling() -> None:
    cache = FormatCache()
    schema = _patterned(DEFAULT_MAX_SCHEMA_PATTERNS)
    schema["properties"]["bad"] = {"type": "string", "pattern": UNCOMPILABLE}
    with pytest.raises(BadRequestError, match="--max-schema-patterns") as caught:
        cache.compile({"response_format": _format(schema)})
    assert caught.value.param == "response_format"
    assert f"{DEFAULT_MAX_SCHEMA_PATTERNS + 1} distinct regular expressions" in str(caught.value)
    assert f"at most {DEFAULT_MAX_SCHEMA_PATTERNS} are accepted" in str(caught.value)
    assert len(cache) == 0
    at_the_cap = cache.compile(
        {"response_format": _format(_patterned(DEFAULT_MAX_SCHEMA_PATTERNS))}
    )
    assert at_the_cap is not None and at_the_cap.patterns == DEFAULT_MAX_SCHEMA_PATTERNS


def test_pattern_property_keys_count_against_the_cap() -> None:
    keys = {f"^k{i}$": {"type": "string"} for i in range(3)}
    schema = {"type": "object", "patternProperties": keys}
    with pytest.raises(BadRequestError, match="3 distinct regular expressions"):
        FormatCache().compile({"response_format": _format(schema)}, max_patterns=2)
    assert FormatCache().compile({"response_format": _format(schema)}, max_patterns=3) is not None


def test_the_tools_patterns_count_against_the_formats() -> None:
    body = {"response_format": _format(_patterned(2))}
    with pytest.raises(
        BadRequestError, match=r"2 distinct .* and the tools 3; at most 4"
    ) as caught:
        FormatCache().compile(body, max_patterns=4, tools_patterns=3)
    assert caught.value.param == "response_format"
    assert FormatCache().compile(body, max_patterns=4, tools_patterns=2) is not None
    # A cached format is held to the request's caps too: the same body, the same answer.
    cache = FormatCache()
    assert cache.compile(body, max_patterns=4) is not None
    with pytest.raises(BadRequestError, match="--max-schema-patterns"):
        cache.compile(body, max_patterns=4, tools_patterns=3)


def test_a_format_over_the_node_cap_is_refused_before_compiling() -> None:
    cache = FormatCache()
    branches = {"type": "object", "anyOf": [{"type": UNCOMPILABLE}] * 64}
    nodes = schema_nodes(orjson.dumps(_format(branches)))
    with pytest.raises(BadRequestError, match="--max-schema-nodes") as caught:
        cache.compile({"response_format": _format(branches)}, max_nodes=nodes - 1)
    assert caught.value.param == "response_format"
    assert f"{nodes} JSON objects and arrays; at most {nodes - 1}" in str(caught.value)
    with pytest.raises(BadRequestError, match="and the tools 1; at most"):
        cache.compile({"response_format": _format(branches)}, max_nodes=nodes, tools_nodes=1)
    assert len(cache) == 0
    valid = {"type": "object", "anyOf": [{"type": "object"}] * 64}
    assert cache.compile({"response_format": _format(valid)}, max_nodes=nodes) is not None
    assert DEFAULT_MAX_SCHEMA_NODES >= 8192  # real schemas: ~35-50 bytes of JSON per node


def _tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_tools_and_format_over_the_pattern_cap_get_an_openai_400(
    upstream: ScriptedUpstream,
) -> None:
    # 9 in the tools and 8 in the format: each under the cap of 16, together over it.
    body = {
        "model": "m",
        "messages": ASK,
        "tools": [_tool("t", _patterned(9))],
        "response_format": _format(_patterned(9 + 8, first=9)),
    }
    with _proxy(upstream) as proxy:
        answer = _post(proxy, "/v1/chat/completions", body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "response_format"
    assert "and the tools 9; at most 16 are accepted" in error["message"]
    assert "--max-schema-patterns" in error["message"]
    assert upstream.requests == []


def test_tools_and_format_at_the_pattern_cap_go_through(upstream: ScriptedUpstream) -> None:
    upstream.push(completion(content='{"p9": "x9"}'))
    body = {
        "model": "m",
        "messages": ASK,
        "tools": [_tool("t", _patterned(9))],
        "response_format": _format(_patterned(9 + 7, first=9)),
    }
    with _proxy(upstream) as proxy:
        answer = _post(proxy, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    assert len(upstream.requests) == 1


def test_a_format_over_the_node_cap_gets_an_openai_400(upstream: ScriptedUpstream) -> None:
    wide = {"type": "object", "anyOf": [{"type": "object"}] * 100}
    body = {"model": "m", "messages": ASK, "response_format": _format(wide)}
    with _proxy(upstream, max_schema_nodes=100) as proxy:
        answer = _post(proxy, "/v1/chat/completions", body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "response_format"
    assert "at most 100 are accepted per request (--max-schema-nodes)" in error["message"]
    assert upstream.requests == []


# -- the fan-out cap: the work of checking one value of an answer --------------------------------


def _chain(levels: int, level: Any, leaf: Any = None) -> dict[str, Any]:
    """``levels`` definitions, each naming the next through ``level(ref)``: a schema of a few
    hundred bytes whose check of the value it checks multiplies per level."""
    defs = {f"d{i}": level({"$ref": f"#/$defs/d{i + 1}"}) for i in range(levels)}
    defs[f"d{levels}"] = leaf if leaf is not None else {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


FAN_OUTS = {
    "allOf": lambda ref: {"allOf": [ref, ref]},
    "oneOf": lambda ref: {"oneOf": [ref, {"not": ref}]},
    "if/then/else": lambda ref: {"if": ref, "then": ref, "else": ref},
    "mixed": lambda ref: {"anyOf": [ref, {"type": "string"}], "not": {"allOf": [ref]}},
}


@pytest.mark.parametrize("shape", list(FAN_OUTS))
def test_a_fan_out_over_the_limit_is_refused_before_compiling(shape: str) -> None:
    # Thirty levels: a check of the answer ``1`` that doubles (triples) per level, in 1.5 KB.
    schema = _chain(30, FAN_OUTS[shape], leaf={"type": UNCOMPILABLE})
    with pytest.raises(SchemaFanoutError) as walked:
        schema_fanout(schema)
    assert walked.value.bound is not None and walked.value.bound > MAX_SCHEMA_FANOUT
    cache = FormatCache()
    with pytest.raises(BadRequestError, match="schema fan-out limit") as caught:
        cache.compile({"response_format": _format(schema)})
    assert caught.value.param == "response_format"  # the cap's 400, not the invalid schema's
    assert f"at most {MAX_SCHEMA_FANOUT} are accepted per value" in str(caught.value)
    assert "one value of the answer" in str(caught.value)
    assert len(cache) == 0
    tools = ToolsCache()
    with pytest.raises(InvalidToolsError, match="schema fan-out limit") as refused:
        tools.compile({"tools": [_tool("fan", schema)]})
    assert refused.value.param == "tools" and refused.value.tool_name == "fan"
    assert "tool 'fan' can check one value of its arguments" in str(refused.value)
    assert len(tools) == 0


def test_the_limit_and_one_past_it() -> None:
    # Nine levels of an allOf naming the next twice: 2**9 checks of the integer, 511 of the
    # levels, the root: 1,024 in all, the limit. One required name at the root is one more.
    at_the_limit = _chain(9, FAN_OUTS["allOf"])
    assert schema_fanout(at_the_limit) == MAX_SCHEMA_FANOUT == 1024
    one_more = {**at_the_limit, "required": ["a"]}
    with pytest.raises(SchemaFanoutError) as caught:
        schema_fanout(one_more)
    assert caught.value.bound == MAX_SCHEMA_FANOUT + 1
    output = FormatCache().compile({"response_format": _format(at_the_limit)})
    assert output is not None and output.check("1").ok
    assert output.check('"x"').channel is OutputChannel.SCHEMA_VIOLATION
    with pytest.raises(BadRequestError, match=f"at least {MAX_SCHEMA_FANOUT + 1} subschemas"):
        FormatCache().compile({"response_format": _format(one_more)})
    assert ToolsCache().compile({"tools": [_tool("t", at_the_limit)]}) is not None
    with pytest.raises(InvalidToolsError, match="schema fan-out limit"):
        ToolsCache().compile({"tools": [_tool("t", one_more)]})


def test_names_and_values_a_schema_compares_count_too() -> None:
    # One check of a value against a 1,023-value enum compares it with each: a fan-out over it
    # multiplies that, so the values count, wherever the schema is.
    assert schema_fanout({"enum": list(range(1022))}) == 1024  # itself, the list, its values
    with pytest.raises(SchemaFanoutError):
        schema_fanout({"enum": list(range(1023))})
    doubled = {"$defs": {"e": {"enum": list(range(300))}}, "allOf": [{"$ref": "#/$defs/e"}] * 4}
    with pytest.raises(SchemaFanoutError):
        schema_fanout(doubled)
    assert schema_fanout({**doubled, "allOf": [{"$ref": "#/$defs/e"}] * 3}) == 1 + 3 * 302
    wide = {"type": "object", "required": ["a"] * 600, "properties": {"a": {}}}
    assert schema_fanout(wide) == 1 + 600 + 1  # a name required, a property looked up


@pytest.mark.parametrize(
    "definition",
    [
        {"a": {"$ref": "#/$defs/a"}},
        {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}},
        {"a": {"type": "object", "anyOf": [{"$ref": "#"}]}},
        {"a": {"if": {"$ref": "#/$defs/a"}, "then": {}}},
    ],
    ids=["ref to itself", "allOf and not", "the root", "if"],
)
def test_a_cycle_that_never_leaves_one_value_is_refused(definition: dict[str, Any]) -> None:
    schema = {"$defs": definition, "$ref": "#/$defs/a"}
    with pytest.raises(SchemaFanoutError, match="cycle of references") as caught:
        schema_fanout(schema)
    assert caught.value.bound is None
    with pytest.raises(BadRequestError, match="never leaves one value of the answer"):
        FormatCache().compile({"response_format": _format(schema)})


TREE = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
            },
            "required": ["value"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/Node",
}
# A JSON value of any depth: the object branch and the array branch recurse at different members.
JSON_VALUE = {
    "$defs": {
        "v": {
            "anyOf": [
                {"type": ["string", "number", "boolean", "null"]},
                {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}},
                {"type": "array", "items": {"$ref": "#/$defs/v"}},
            ]
        }
    },
    "$ref": "#/$defs/v",
}
# OpenAI's structured-outputs example of a recursive UI schema (a root reference).
UI = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["div", "button", "header", "section", "field"]},
        "label": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
        "attributes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
                "required": ["name", "value"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["type", "label", "children", "attributes"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("schema", [TREE, JSON_VALUE, UI], ids=["tree", "json value", "ui"])
def test_a_recursion_through_members_is_bounded_and_accepted(schema: dict[str, Any]) -> None:
    bound = schema_fanout(schema)
    assert bound <= 32  # each level of the answer costs what the one above did
    output = FormatCache().compile({"response_format": _format(schema)})
    assert output is not None
    deep: Any = {"value": 1} if schema is TREE else "leaf"
    for level in range(100):  # a hundred levels of the answer, each checked as the one above
        if schema is TREE:
            deep = {"value": level, "children": [deep]} if level % 2 else {"value": 1, "next": deep}
        elif schema is JSON_VALUE:
            deep = {"a": [deep, 1]}
        else:
            deep = {"type": "div", "label": "x", "children": [deep], "attributes": []}
    verdict = output.check(orjson.dumps(deep).decode())
    if schema is UI:  # the innermost "leaf" is no UI node
        assert verdict.channel is OutputChannel.SCHEMA_VIOLATION
    else:
        assert verdict.ok


def test_a_recursion_reached_twice_for_one_member_is_refused() -> None:
    # An expression tree whose two operators both name ``left``: oneOf checks every branch, so
    # each level of ``left`` doubles the checks of the one below (2 s at 12 levels, 750 bytes,
    # when collecting an invalid answer's errors).
    def operator(name: str) -> dict[str, Any]:
        expr = {"$ref": "#/$defs/Expr"}
        return {"properties": {"op": {"const": name}, "left": expr, "right": expr}}

    schema: dict[str, Any] = {
        "$defs": {
            "Expr": {"oneOf": [{"$ref": "#/$defs/Add"}, {"$ref": "#/$defs/Mul"}]},
            "Add": operator("add"),
            "Mul": operator("mul"),
        },
        "$ref": "#/$defs/Expr",
    }
    with pytest.raises(SchemaFanoutError, match="more times the deeper the value nests"):
        schema_fanout(schema)
    with pytest.raises(InvalidToolsError, match="tool 'calc' has a recursion"):
        ToolsCache().compile({"tools": [_tool("calc", schema)]})
    # Distinct members (``left``/``right`` in one operator, ``arg`` in another) are no fan-out.
    negation = {"properties": {"op": {"const": "neg"}, "arg": {"$ref": "#/$defs/Expr"}}}
    schema["$defs"]["Mul"] = negation
    assert schema_fanout(schema) <= 32


def test_pydantic_models_are_accepted() -> None:
    pydantic = pytest.importorskip("pydantic")
    from typing import Annotated, Literal

    class Address(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        street: str
        city: str
        zip: str | None = None

    class Person(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        name: str
        home: Address
        work: Address | None = None
        friends: list[Person] = pydantic.Field(default_factory=list)

    class Cat(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        kind: Literal["cat"]
        meows: int

    class Dog(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        kind: Literal["dog"]
        barks: float

    class Leaf(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        kind: Literal["leaf"]
        field: str
        value: str

    class And(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        kind: Literal["and"]
        all: list[Filter]

    class Or(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        kind: Literal["or"]
        any: list[Filter]

    class Not(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        kind: Literal["not"]
        inner: Filter

    Pet = Annotated[Cat | Dog, pydantic.Field(discriminator="kind")]
    Filter = Annotated[Leaf | And | Or | Not, pydantic.Field(discriminator="kind")]

    class Search(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        owner: Person
        pet: Pet
        pets: list[Pet]
        filter: Filter
        limit: int = 10

    for model in (Person, And, Or, Not, Search):
        model.model_rebuild()
    schema = Search.model_json_schema()
    assert "$defs" in schema and "oneOf" in orjson.dumps(schema).decode()
    assert schema_fanout(schema) <= 64
    assert schema_fanout(Person.model_json_schema()) <= 64
    output = FormatCache().compile({"response_format": _format(schema)})
    assert output is not None
    answer = {
        "owner": {"name": "a", "home": {"street": "s", "city": "c"}, "friends": []},
        "pet": {"kind": "cat", "meows": 3},
        "pets": [{"kind": "dog", "barks": 1.5}],
        "filter": {
            "kind": "not",
            "inner": {"kind": "and", "all": [{"kind": "leaf", "field": "f", "value": "v"}]},
        },
    }
    assert output.check(orjson.dumps(answer).decode()).ok


def test_the_tau2_tools_are_accepted() -> None:
    retail = pytest.importorskip("evals.tau2.domains.retail.tools")
    telecom = pytest.importorskip("evals.tau2.domains.telecom.agent_tools")
    users = pytest.importorskip("evals.tau2.domains.telecom.user_tools")
    for kit in (retail.RetailTools, telecom.TelecomTools, users.TelecomUserTools):
        tools = kit.openai_tools()
        compiled = ToolsCache(forbid_extra_arguments=True).compile({"tools": tools})
        assert compiled is not None and compiled.fanout <= MAX_SCHEMA_FANOUT
        for tool in tools:
            assert schema_fanout(tool["function"]["parameters"]) <= 32


def test_references_resolve_within_the_document_and_nowhere_else() -> None:
    by_id = {
        "$id": "https://example.com/root.json",
        "$defs": {"a": {"$id": "a.json", "allOf": [{"$ref": "#/$defs/b"}] * 2, "$defs": {"b": {}}}},
        "$ref": "a.json",
    }
    assert schema_fanout(by_id) == 1 + 1 + 2  # the root, a, b twice (a's own #/$defs)
    anchored = {
        "$defs": {"a": {"$anchor": "here", "type": "integer"}},
        "allOf": [{"$ref": "#here"}] * 3,
    }
    assert schema_fanout(anchored) == 1 + 3
    # A dynamic reference counts every subschema it may land on.
    dynamic = {
        "$dynamicAnchor": "node",
        "$defs": {"other": {"$dynamicAnchor": "node", "type": "integer"}},
        "properties": {"child": {"$dynamicRef": "#node"}},
    }
    assert schema_fanout(dynamic) >= 2
    for outside in ("https://json-schema.org/draft/2020-12/schema", "other.json", "#/$defs/none"):
        with pytest.raises(SchemaFanoutError, match="cannot follow"):
            schema_fanout({"$ref": outside})
    # The meta-schema compiles offline (jsonschema-rs bundles it); the walk cannot bound it.
    meta = {
        "type": "object",
        "properties": {"s": {"$ref": "https://json-schema.org/draft/2020-12/schema"}},
    }
    with pytest.raises(BadRequestError, match="cannot follow within the schema"):
        FormatCache().compile({"response_format": _format(meta)})


def test_the_bound_read_off_the_json_is_one() -> None:
    # Without a reference each subschema checks a value at most once: the JSON's values bound
    # the walk's answer, so a small schema needs no walk.
    for schema in (
        _patterned(20),
        {"anyOf": [{"const": i} for i in range(100)]},
        {"type": "object", "required": ["a", "b"], "properties": {"a": {"enum": [1, [2, 3]]}}},
        UI | {"properties": {}},
    ):
        key = orjson.dumps(schema)
        bound = schema_fanout_from_bytes(key)
        assert bound is not None and bound >= schema_fanout(schema)
    assert schema_fanout_from_bytes(orjson.dumps(TREE)) is None
    assert schema_fanout_from_bytes(orjson.dumps({"$dynamicRef": "#a"})) is None


def test_a_fan_out_gets_an_openai_400_and_never_reaches_the_upstream(
    upstream: ScriptedUpstream,
) -> None:
    schema = _chain(24, FAN_OUTS["allOf"])
    with _proxy(upstream) as proxy:
        as_format = _post(
            proxy,
            "/v1/chat/completions",
            {"model": "m", "messages": ASK, "response_format": _format(schema)},
        )
        as_tool = _post(
            proxy,
            "/v1/chat/completions",
            {"model": "m", "messages": ASK, "tools": [_tool("fan", schema)]},
        )
    for answer, param in ((as_format, "response_format"), (as_tool, "tools")):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
        assert f"at most {MAX_SCHEMA_FANOUT} are accepted per value" in error["message"]
        assert "(schema fan-out limit)" in error["message"]
    assert upstream.requests == []
