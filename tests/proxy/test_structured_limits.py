"""A ``response_format`` is held to the tools' front-door limits (issue 51, finding 10): its schema
compiles with the same regex limits, so a pattern too large to match cheaply is refused as an
invalid schema, and one over ``--max-response-format-bytes`` of JSON gets 400 before anything is
compiled; its regular expressions and JSON nodes count with the tools' against the request's
``--max-schema-patterns`` and ``--max-schema-nodes``. Nothing is timed: the tests read refusals,
error bodies, verdicts, counts and cache sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest

from repairproxy.errors import BadRequestError
from repairproxy.settings import Settings
from repairproxy.structured import MAX_CACHED_SCHEMA_BYTES, FormatCache, OutputChannel
from repairproxy.types import RepairMode
from repairproxy.validation import (
    DEFAULT_MAX_SCHEMA_NODES,
    DEFAULT_MAX_SCHEMA_PATTERNS,
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
