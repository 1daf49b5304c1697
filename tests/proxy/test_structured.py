"""Structured outputs (``response_format``) checked and re-asked: openai's ``.parse()`` gets a valid
object after one re-ask, streamed and not; with repair off the answer is unchanged and the headers
say what was wrong; nothing is charged to the episode's error budget; metrics count both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from pydantic import BaseModel

from repairproxy.errors import BadRequestError
from repairproxy.settings import Settings
from repairproxy.structured import FormatCache, OutputChannel
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, message
from tests.support.scripted_upstream import ScriptedUpstream, completion

BAD = '{"name": "Ann", "age": "forty"}'
GOOD = '{"name": "Ann", "age": 40}'


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


def _proxy(upstream_url: str, repair: str) -> Any:
    return running_proxy(Settings(upstream=upstream_url, repair=RepairMode(repair)))


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)


def _metric(proxy: RunningProxy, name: str, **labels: str) -> float:
    text = httpx.get(f"{proxy.root_url}/metrics").text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"repairproxy_{name}{{"):
            head, _, value = line.rpartition(" ")
            found = head[head.index("{") + 1 : -1].split(",")
            if ",".join(sorted(found)) == wanted:
                return float(value)
    return 0.0


# -- the checks themselves ------------------------------------------------------------------------


def test_channels_of_a_schema_and_of_json_object() -> None:
    cache = FormatCache()
    schema = Person.model_json_schema()
    person = cache.compile(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "P", "schema": schema}}}
    )
    assert person is not None
    assert person.check(GOOD).ok
    violation = person.check(BAD)
    assert violation.channel is OutputChannel.SCHEMA_VIOLATION
    assert violation.error_paths and violation.error_paths[0].startswith("$.age:")
    assert person.check("Sure! " + GOOD).channel is OutputChannel.NOT_JSON
    assert person.check(None).channel is OutputChannel.NOT_JSON
    # A message that calls tools or refuses has no output to check.
    assert person.check_message({"content": None, "tool_calls": [{"id": "c"}]}) is None
    assert person.check_message({"content": None, "refusal": "no"}) is None

    anything = cache.compile({"response_format": {"type": "json_object"}})
    assert anything is not None
    assert anything.check(BAD).ok
    assert anything.check("[1, 2]").channel is OutputChannel.NOT_JSON
    assert cache.compile({"response_format": {"type": "text"}}) is None
    assert cache.compile({}) is None


def test_formats_are_compiled_once_and_bad_schemas_refused() -> None:
    cache = FormatCache(max_entries=2)
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}}
    with pytest.raises(BadRequestError, match="not a valid JSON Schema"):
        cache.compile(body)
    first = {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}
    assert cache.compile(first) is cache.compile(dict(first))
    with pytest.raises(BadRequestError):
        cache.compile({"response_format": "json"})


# -- through the proxy ----------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_parse_gets_a_valid_object_after_one_reask(
    upstream: ScriptedUpstream, streamed: bool
) -> None:
    upstream.push(completion(content=BAD), completion(content=GOOD))
    with _proxy(upstream.base_url, "reflexive") as proxy:
        client = _client(proxy)
        messages: Any = [{"role": "user", "content": "Who is Ann?"}]
        if streamed:
            with client.chat.completions.stream(
                model="m", messages=messages, response_format=Person
            ) as stream:
                for _ in stream:
                    pass
                parsed = stream.get_final_completion().choices[0].message.parsed
        else:
            raw = client.chat.completions.with_raw_response.parse(
                model="m", messages=messages, response_format=Person
            )
            parsed = raw.parse().choices[0].message.parsed
            assert raw.headers["x-repairproxy-output-errors"] == "output_schema_violation"
            assert raw.headers["x-repairproxy-output-repairs"] == "1"
            assert raw.headers["x-repairproxy-episode-errors"] == "0"  # never charged
        assert parsed == Person(name="Ann", age=40)
        reask = upstream.chat_requests[1]
        assert reask["stream"] is False
        assert reask["response_format"]["type"] == "json_schema"
        assert "$.age" in reask["messages"][-1]["content"]
        assert reask["messages"][-2] == {"role": "assistant", "content": BAD}
        line = [entry for entry in proxy.log_lines() if entry.get("path")][-1]
        assert line["output_errors"] == ["output_schema_violation"]
        assert line["output_repairs"] == 1
        assert line["channels"] == []
        assert _metric(
            proxy,
            "structured_output_errors_total",
            model="m",
            channel="output_schema_violation",
        ) == pytest.approx(1.0)
        assert _metric(
            proxy, "structured_output_repairs_total", model="m", result="fixed"
        ) == pytest.approx(1.0)
        assert _metric(
            proxy,
            "tool_call_errors_total",
            model="m",
            channel="schema_violation",
            source="answer",
        ) == pytest.approx(0.0)


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_repair_off_passes_the_answer_and_says_what_was_wrong(
    upstream: ScriptedUpstream, streamed: bool
) -> None:
    upstream.push(completion(content=BAD))
    with _proxy(upstream.base_url, "off") as proxy:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Who is Ann?"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "Person", "schema": Person.model_json_schema()},
            },
            "stream": streamed,
        }
        reply = httpx.post(f"{proxy.base_url}/chat/completions", json=body)
        assert reply.headers["x-repairproxy-output-errors"] == "output_schema_violation"
        assert reply.headers["x-repairproxy-output-repairs"] == "0"
        assert "$.age" in reply.headers["x-repairproxy-output-error-paths"]
        if streamed:
            text = "".join(
                orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                for line in reply.text.splitlines()
                if line.startswith("data: {") and orjson.loads(line[6:])["choices"]
            )
        else:
            text = reply.json()["choices"][0]["message"]["content"]
        assert text == BAD
        assert len(upstream.chat_requests) == 1


def test_json_object_prose_is_reasked(upstream: ScriptedUpstream) -> None:
    upstream.push(completion(content="Here you go: " + GOOD), completion(content=GOOD))
    with _proxy(upstream.base_url, "reflexive") as proxy:
        reply = _client(proxy).chat.completions.with_raw_response.create(
            model="m",
            messages=[{"role": "user", "content": "Ann as JSON"}],
            response_format={"type": "json_object"},
        )
        assert reply.parse().choices[0].message.content == GOOD
        assert reply.headers["x-repairproxy-output-errors"] == "output_not_json"
        assert "JSON" in upstream.chat_requests[1]["messages"][-1]["content"]


def test_without_a_format_nothing_changes(upstream: ScriptedUpstream) -> None:
    upstream.push(completion(content="Here you go: " + BAD))
    with _proxy(upstream.base_url, "reflexive") as proxy:
        reply = _client(proxy).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.parse().choices[0].message.content == "Here you go: " + BAD
        assert "x-repairproxy-output-errors" not in reply.headers
        assert len(upstream.chat_requests) == 1


def test_responses_text_format_is_checked_and_reasked() -> None:
    with ResponsesUpstream() as upstream:
        upstream.push([message(BAD)], [message(GOOD)])
        with _proxy(upstream.base_url, "reflexive") as proxy:
            client = _client(proxy)
            raw = client.responses.with_raw_response.parse(
                model="m", input="Who is Ann?", text_format=Person
            )
            assert raw.parse().output_parsed == Person(name="Ann", age=40)
            assert raw.headers["x-repairproxy-output-errors"] == "output_schema_violation"
            reask = upstream.requests[1]
            assert reask["text"]["format"]["type"] == "json_schema"
            assert "$.age" in str(reask["input"][-1])


def _events(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_a_streamed_responses_text_format_is_held_and_reasked() -> None:
    with ResponsesUpstream() as upstream:
        upstream.push([message(BAD)], [message(GOOD)])
        with _proxy(upstream.base_url, "reflexive") as proxy:
            with _client(proxy).responses.stream(
                model="m", input="Who is Ann?", text_format=Person
            ) as stream:
                events = list(stream)
                final = stream.get_final_response()
            assert final.output_parsed == Person(name="Ann", age=40)
            # Nothing of the invalid answer reached the client: it was held whole.
            deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
            assert "".join(deltas) == GOOD
            assert [e.sequence_number for e in events] == list(range(len(events)))
            assert events[0].type == "response.created"
            assert events[-1].type == "response.completed"
            ids = {e.response.id for e in events if hasattr(e, "response")}
            assert ids == {final.id}
            first, reask = upstream.requests
            assert first["stream"] is True and reask["stream"] is False
            assert reask["text"]["format"]["type"] == "json_schema"
            assert "$.age" in str(reask["input"][-1])
            line = [entry for entry in proxy.log_lines() if entry.get("path")][-1]
            assert line["output_errors"] == ["output_schema_violation"]
            assert line["output_repairs"] == 1


def test_a_streamed_responses_text_format_with_repair_off_is_relayed_and_reported() -> None:
    with ResponsesUpstream() as upstream:
        upstream.push([message(BAD)])
        with _proxy(upstream.base_url, "off") as proxy:
            body = {
                "model": "m",
                "input": "Who is Ann?",
                "stream": True,
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "Person",
                        "schema": Person.model_json_schema(),
                    }
                },
            }
            reply = httpx.post(f"{proxy.base_url}/responses", json=body)
            assert reply.headers["x-repairproxy-output-errors"] == "output_schema_violation"
            assert reply.headers["x-repairproxy-output-repairs"] == "0"
            assert "$.age" in reply.headers["x-repairproxy-output-error-paths"]
            events = _events(reply.text)
            deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
            assert "".join(deltas) == BAD
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            assert events[-1]["type"] == "response.completed"
            assert len(upstream.requests) == 1
