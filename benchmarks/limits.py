"""What one hostile request costs the event loop and the tools cache, printed before/after.

* the largest event-loop lag (a 1 ms ticker's worst delay) while a 4 MB chat stream with declared
  tools goes through the relay's parser, gate and ``upstream.timed`` (which yields between chunks),
  for prose and for a call written as text, in 1 MB and 4 MB to show the growth is linear;
* the same lag while ``constrained`` mode judges a 100 KB answer against 5,000 declared tools;
* the memory a compiled tools list really takes per byte of its JSON (RSS, since jsonschema-rs
  allocates outside Python's allocator, where tracemalloc cannot see it): the factor behind
  ``validation.COMPILED_BYTES_PER_JSON_BYTE``.
* the worst accepted schemas at the default caps (bytes, tools, distinct regular expressions,
  JSON nodes, the fan-out per value of an answer), one shape per dimension: what compiling them
  (through the caches, as a request does: the fan-out walk included, and timed alone) and
  checking an answer against them cost, for the tools and for a ``response_format``;
* the ``$ref`` fan-outs at the fan-out cap (an ``allOf``, ``anyOf``, ``oneOf``,
  ``if``/``then``/``else`` naming the next level twice, and one over a ``required`` list): the
  deepest accepted, what checking a valid and an invalid answer costs, and what the level past
  the cap would cost if it were compiled anyway.

Run it on today's tree and on an older checkout to compare (``PYTHONPATH=/path/to/old``):

    python -m benchmarks.limits
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from benchmarks.support.results import run_recorded
from repairproxy.asgi.gate import SSEParser, ToolCallGate
from repairproxy.repair import RepairPolicy, escalated_tool_choice
from repairproxy.settings import Settings
from repairproxy.structured import FormatCache
from repairproxy.types import RepairMode
from repairproxy.upstream.client import UpstreamTimer, timed
from repairproxy.validation import (
    MAX_SCHEMA_FANOUT,
    CompiledTools,
    SchemaFanoutError,
    ToolsCache,
    schema_fanout,
    schema_nodes,
    schema_validator,
)

__all__ = ["main"]

QUESTION = "What does one hostile request cost the event loop and the tools cache?"


def _event(text: str) -> bytes:
    payload = {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream(size: int, first: str) -> list[bytes]:
    body = _event(first) + _event("word " * 8) * (size // len(_event("word " * 8)))
    return [body[i : i + 16384] for i in range(0, len(body), 16384)]


async def _max_lag(work: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(the work's wall seconds, the worst delay of a 1 ms ticker meanwhile, seconds)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - started
    done = True
    await task
    return elapsed, worst


async def _relay(chunks: list[bytes]) -> None:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    parser, gate = SSEParser(), ToolCallGate()
    async for chunk in timed(body(), UpstreamTimer()):
        for event in parser.feed(chunk):
            gate.feed(event)
    gate.assembler.completion()


async def _constrained(tools: int, text_bytes: int) -> None:
    compiled = CompiledTools([(f"tool_{i}", {"type": "object"}) for i in range(tools)])
    text = ("plain words " * (text_bytes // 12)) + ' {"name": "tool_x", "arguments": {}}'
    message = {"role": "assistant", "content": text}
    verdict = compiled.check_message(message)
    policy = RepairPolicy(mode=RepairMode.CONSTRAINED)
    escalated_tool_choice({}, verdict, 2, policy, message, compiled)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _compiled_factor(lists: int = 8, tools: int = 200) -> tuple[float, int]:
    """RSS growth per byte of tools JSON over ``lists`` distinct lists kept in the cache."""
    cache: Any = ToolsCache(max_entries=lists + 1)
    if hasattr(cache, "max_bytes"):
        cache.max_bytes = 1 << 40
    if hasattr(cache, "max_tools_bytes"):  # each list passes the cap: the factor needs size
        cache.max_tools_bytes = 1 << 40
    bodies = []
    for variant in range(lists):
        properties = {
            f"v{variant}_p{i}": {"type": "string", "description": "a field " * 4} for i in range(20)
        }
        bodies.append(
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": f"t{i}",
                            "parameters": {"type": "object", "properties": properties},
                        },
                    }
                    for i in range(tools)
                ]
            }
        )
    json_bytes = sum(len(orjson.dumps([b["tools"], None])) for b in bodies)
    before = _rss()
    for body in bodies:
        cache.compile(body)
    return (_rss() - before) / json_bytes, json_bytes


@dataclass(frozen=True)
class _Caps:
    """What a request's schemas may be: the serve defaults unless given."""

    tools_bytes: int
    format_bytes: int
    tools: int
    patterns: int
    nodes: int
    fanout: int = MAX_SCHEMA_FANOUT

    @classmethod
    def defaults(cls) -> _Caps:
        settings = Settings(upstream="http://127.0.0.1:9/v1")
        return cls(
            settings.max_tools_bytes,
            settings.max_response_format_bytes,
            settings.max_tools,
            settings.max_schema_patterns,
            settings.max_schema_nodes,
        )


# One pattern near PATTERN_OPTIONS' size limit: 14 bytes whose program takes ~1-3 ms to build.
_NEAR_LIMIT = r"(\w{{100}}){{27}}{}"
_LOOKAROUND = r"^(?!x{})[a-z]{{1,2}}\d*$"
_SIMPLE = r"^[a-z]{{1,2}}\d*{}$"
# A 3,000-character value: what a pattern near the limit is slowest to match.
_LONG_VALUE = ("a" * 99 + " ") * 30


def _fits(document: Any, limit: int, caps: _Caps, wrap: Callable[[Any], Any]) -> bool:
    key = orjson.dumps(wrap(document))
    return len(key) <= limit and schema_nodes(key) <= caps.nodes and _within_fanout(document, caps)


def _within_fanout(schema: Any, caps: _Caps) -> bool:
    try:
        return schema_fanout(schema, caps.fanout) <= caps.fanout
    except SchemaFanoutError:
        return False


# One object checks each of its properties once per value: past this many they are grouped in
# objects of this many, so a shape grows to the node cap without passing the fan-out cap.
_PER_OBJECT = MAX_SCHEMA_FANOUT // 2


def _grow(make: Callable[[int], Any], fits: Callable[[Any], bool]) -> tuple[Any, int]:
    """The largest ``make(count)`` that still ``fits`` (the step doubles, then halves), and its
    count."""
    count, step = 0, 1
    while step:
        trial = make(count + step)
        if fits(trial):
            count += step
            step *= 2
        else:
            step //= 2
    return make(count), count


def _properties(count: int, pattern: str | None, patterns: int) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for i in range(count):
        spec: dict[str, Any] = {"type": "string"}
        if pattern is not None and i < patterns:
            spec["pattern"] = pattern.format(i)
        properties[f"p{i}"] = spec
    return _grouped(properties)


def _grouped(properties: dict[str, Any]) -> dict[str, Any]:
    """An object of ``properties``, in objects of ``_PER_OBJECT`` when there are more."""
    if len(properties) > _PER_OBJECT:
        names = list(properties)
        properties = {
            f"g{start}": _grouped({n: properties[n] for n in names[start : start + _PER_OBJECT]})
            for start in range(0, len(names), _PER_OBJECT)
        }
    return {"type": "object", "properties": properties}


def _answer_values(schema: Any) -> dict[str, Any]:
    """Values for every property, nested as the groups are: a short string, 3,000 characters
    where a pattern is to match, and for an anyOf, a value that matches no branch (every one is
    tried, and the errors listed)."""
    values: dict[str, Any] = {}
    for name, spec in schema["properties"].items():
        if "properties" in spec:
            values[name] = _answer_values(spec)
        elif "anyOf" in spec:
            values[name] = -1
        else:
            values[name] = _LONG_VALUE if "pattern" in spec else "ab1"
    return values


def _shapes(caps: _Caps) -> list[tuple[str, Callable[[int], Any], Callable[[Any], Any]]]:
    """(label, count -> object schema, schema -> an answer that reaches every subschema: each
    property a short string, or 3,000 characters where a pattern is to match)."""

    def answer(schema: Any) -> Any:
        values = _answer_values(schema)
        if "patternProperties" in schema:
            values["a" * 2701] = _LONG_VALUE
        return values

    def patterned(template: str) -> Callable[[int], Any]:
        return lambda n: _properties(max(n, 1), template, caps.patterns)

    def pattern_keys(n: int) -> Any:
        schema = _properties(n, None, 0)
        keys = range(min(n, caps.patterns))
        schema["patternProperties"] = {_NEAR_LIMIT.format(i): {"type": "string"} for i in keys}
        return schema

    def any_of(branch: Callable[[int], Any]) -> Callable[[int], Any]:
        # As many branches per anyOf as the fan-out cap lets one value be checked against.
        _, per_value = _grow(
            lambda n: {"anyOf": [branch(i) for i in range(n)]}, lambda d: _within_fanout(d, caps)
        )
        return lambda n: {
            "type": "object",
            "properties": {
                f"a{start}": {"anyOf": [branch(i) for i in range(start, min(n, start + per_value))]}
                for start in range(0, max(n, 1), per_value)
            },
        }

    def refs(n: int) -> Any:
        schema = _grouped({f"p{i}": {"$ref": f"#/$defs/d{i}"} for i in range(n)})
        schema["$defs"] = {f"d{i}": {"type": "string"} for i in range(n)}
        return schema

    return [
        ("typed properties", lambda n: _properties(n, None, 0), answer),
        ("empty subschemas (anyOf)", any_of(lambda i: {}), answer),
        ("consts (anyOf)", any_of(lambda i: {"const": i}), answer),
        ("$refs to $defs", refs, answer),
        ("simple patterns", patterned(_SIMPLE), answer),
        ("lookaround patterns", patterned(_LOOKAROUND), answer),
        ("near-limit patterns", patterned(_NEAR_LIMIT), answer),
        ("near-limit patternProperties", pattern_keys, answer),
    ]


def _best(work: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs, in ms: the others lost the CPU to something else."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def _tools_body(schemas: list[Any]) -> dict[str, Any]:
    return {
        "tools": [
            {"type": "function", "function": {"name": f"t{i}", "parameters": schema}}
            for i, schema in enumerate(schemas)
        ]
    }


def _format_body(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}
    }


def _tools_cost(body: dict[str, Any], answer: dict[str, Any], caps: _Caps, repeat: int) -> str:
    def compile_() -> CompiledTools | None:
        cache = ToolsCache(max_tools=caps.tools, max_tools_bytes=caps.tools_bytes)
        return cache.compile(body, max_patterns=caps.patterns, max_nodes=caps.nodes)

    compiled = compile_()
    assert compiled is not None
    compile_ms = _best(compile_, repeat)
    validate_ms = _best(lambda: compiled.check_message(answer), repeat)
    return f"compile {compile_ms:7.1f} ms, check {validate_ms:7.1f} ms"


def _format_cost(body: dict[str, Any], content: str, caps: _Caps, repeat: int) -> str:
    def compile_() -> Any:
        cache = FormatCache(max_format_bytes=caps.format_bytes)
        return cache.compile(body, max_patterns=caps.patterns, max_nodes=caps.nodes)

    output = compile_()
    compile_ms = _best(compile_, repeat)
    validate_ms = _best(lambda: output.check(content), repeat)
    walk_ms = _best(lambda: schema_fanout(output.schema), repeat)
    return f"compile {compile_ms:7.1f} ms (walk {walk_ms:4.1f}), check {validate_ms:7.1f} ms"


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def worst_schemas(caps: _Caps, repeat: int = 3) -> None:
    """Print each shape's worst accepted tools and response_format: compile and check, in ms."""
    print(
        f"worst accepted schemas at tools {caps.tools_bytes} B / {caps.tools} tools, "
        f"response_format {caps.format_bytes} B, {caps.patterns} regular expressions, "
        f"{caps.nodes} JSON nodes, {caps.fanout} checks per value (best of {repeat}):"
    )
    for label, make, answer_of in _shapes(caps):
        schema, count = _grow(
            make,
            lambda d: _fits(d, caps.tools_bytes, caps, lambda s: [_tools_body([s])["tools"], None]),
        )
        answer = answer_of(schema)
        message = {"role": "assistant", "content": None, "tool_calls": [_call("t0", answer)]}
        tools = _tools_cost(_tools_body([schema]), message, caps, repeat)
        schema, _ = _grow(make, lambda d: _fits(d, caps.format_bytes, caps, _format_body))
        fmt = _format_cost(
            _format_body(schema), orjson.dumps(answer_of(schema)).decode(), caps, repeat
        )
        print(f"  {label:30s} {count:6d} items  tools: {tools}  response_format: {fmt}", flush=True)
    # As many tools as accepted, each as small as the bytes and nodes let them be.
    per_tool, _ = _grow(
        lambda n: [_properties(n, None, 0)] * caps.tools,
        lambda d: _fits(_tools_body(d)["tools"], caps.tools_bytes, caps, lambda t: [t, None]),
    )
    body = _tools_body(per_tool)
    calls = [
        _call(f"t{i}", {name: "ab1" for name in per_tool[i]["properties"]})
        for i in range(caps.tools)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    tools = _tools_cost(body, message, caps, repeat)
    print(f"  {caps.tools} tools, one call each{'':13s} tools: {tools}")
    fanouts(caps, repeat)


def _chain(levels: int, level: Callable[[Any], Any], leaf: Any) -> dict[str, Any]:
    """``levels`` definitions, each naming the next through ``level(ref)``, the last ``leaf``."""
    defs = {f"d{i}": level({"$ref": f"#/$defs/d{i + 1}"}) for i in range(levels)}
    defs[f"d{levels}"] = leaf
    return {"$defs": defs, "$ref": "#/$defs/d0"}


_INTEGER = {"type": "integer"}
_STRING = {"type": "string"}
# (label, a level naming the next (twice, or thrice), a valid answer, an invalid one)
_FANOUTS: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("allOf", lambda ref: {"allOf": [ref, ref]}, "1", '"x"'),
    ("anyOf", lambda ref: {"anyOf": [ref, ref]}, "1", '"x"'),
    ("oneOf", lambda ref: {"oneOf": [ref, {"allOf": [ref, _STRING]}]}, "1", '"x"'),
    ("if/then/else", lambda ref: {"if": ref, "then": ref, "else": ref}, "1", '"x"'),
    (
        "anyOf + not",
        lambda ref: {"anyOf": [ref, _STRING], "not": {"allOf": [ref, _STRING]}},
        "1",
        "1.5",
    ),
]


def _deepest(make: Callable[[int], Any], caps: _Caps) -> int:
    levels = 0
    while _within_fanout(make(levels + 1), caps):
        levels += 1
    return levels


def _check_ms(schema: Any, content: str, repeat: int) -> float:
    """A check of ``content`` as ``OutputFormat.check`` runs it, with the schema compiled
    without the caps (so a refused one can be measured too)."""
    validator = schema_validator(schema)
    value = orjson.loads(content)

    def check() -> None:
        if not validator.is_valid(value):
            for _ in zip(range(8), validator.iter_errors(value), strict=False):
                pass

    return _best(check, repeat)


def fanouts(caps: _Caps, repeat: int = 3) -> None:
    """Print the deepest accepted ``$ref`` fan-out per shape: its bound, what compiling it (the
    walk included) and checking a valid and an invalid answer cost; what refusing the next level
    costs (the walk), and what four levels past the cap would have cost to check."""
    print(f"$ref fan-outs at the fan-out cap ({caps.fanout} checks per value, best of {repeat}):")
    rows: list[tuple[str, Callable[[int], Any], int, str, str]] = []
    for label, level, good, bad in _FANOUTS:
        make: Callable[[int], Any] = functools.partial(_chain, level=level, leaf=_INTEGER)
        rows.append((label, make, _deepest(make, caps), good, bad))
    # A fan-out over a list of names the value must hold: each check compares all of them.
    names = [f"p{i}" for i in range(caps.fanout)]
    doubling = _FANOUTS[0][1]
    for levels in (0, 4):
        leaf, count = _grow(
            lambda n: {"type": "object", "required": names[:n]},
            lambda leaf: _within_fanout(_chain(levels, doubling, leaf), caps),  # noqa: B023
        )
        make = functools.partial(_chain, level=doubling, leaf=leaf)
        good = orjson.dumps(dict.fromkeys(names[:count], 1)).decode()
        rows.append((f"allOf over {count} required", make, levels, good, "{}"))
    for label, make, levels, good, bad in rows:
        schema = make(levels)
        bound = schema_fanout(schema, caps.fanout)
        body, past = _format_body(schema), _format_body(make(levels + 1))
        compile_ms = _best(lambda: FormatCache().compile(body), repeat)  # noqa: B023
        refused_ms = _best(lambda: _refused(past), repeat)  # noqa: B023
        far = make(levels + 4)
        print(
            f"  {label:24s} {levels:2d} levels, bound {bound:4d}: compile {compile_ms:5.1f} ms, "
            f"check valid {_check_ms(schema, good, repeat):5.2f} ms, "
            f"invalid {_check_ms(schema, bad, repeat):6.2f} ms; {levels + 1} levels refused in "
            f"{refused_ms:4.2f} ms; {levels + 4} levels, if compiled: valid "
            f"{_check_ms(far, good, 1):6.2f} ms, invalid {_check_ms(far, bad, 1):7.1f} ms",
            flush=True,
        )


def _refused(body: dict[str, Any]) -> None:
    try:
        FormatCache().compile(body)
    except Exception as exc:  # the fan-out cap's 400
        assert "schema fan-out limit" in str(exc), exc
    else:
        raise AssertionError("a fan-out past the cap was accepted")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=QUESTION).parse_args(argv)
    for label, first in (
        ("prose", "Sure, "),
        ("call as text", '{"name": "get_order", "arguments": "'),
    ):
        for size in (1 << 20, 4 << 20):
            chunks = _stream(size, first)
            elapsed, lag = asyncio.run(_max_lag(functools.partial(_relay, chunks)))
            print(
                f"stream {label:12s} {size >> 20} MB: relay {elapsed * 1000:8.1f} ms, "
                f"max loop lag {lag * 1000:7.1f} ms"
            )
    elapsed, lag = asyncio.run(_max_lag(lambda: _constrained(5000, 100_000)))
    print(
        f"constrained 5,000 tools x 100 KB: judge {elapsed * 1000:8.1f} ms, "
        f"max loop lag {lag * 1000:7.1f} ms"
    )
    factor, json_bytes = _compiled_factor()
    print(f"compiled tools: {factor:.1f} bytes of RSS per byte of tools JSON ({json_bytes} bytes)")
    worst_schemas(_Caps.defaults())


if __name__ == "__main__":
    raise SystemExit(run_recorded("limits", main))
