"""Anthropic's structured outputs (``output_config.format``; the beta's ``output_format``) through
``/v1/messages``: checked like chat's ``response_format``. The official ``anthropic`` client's
``messages.parse`` / ``messages.stream(output_format=...)`` gets a valid object after one re-ask,
from a native Messages upstream and from a chat-only one; with repair off the answer is unchanged
and the headers say what was wrong; nothing is charged to the episode's error budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from pydantic import BaseModel

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from repairproxy.wire.messages import to_chat_body
from tests.support.messages_upstream import MessagesUpstream, text
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion

BAD = '{"name": "Ann", "age": "forty"}'
GOOD = '{"name": "Ann", "age": 40}'
ASK: list[Any] = [{"role": "user", "content": "Who is Ann?"}]


class Person(BaseModel):
    name: str
    age: int


def _client(proxy: RunningProxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.root_url, api_key="x", max_retries=0)


def _parsed(client: anthropic.Anthropic, *, stream: bool) -> Any:
    if not stream:
        return client.messages.parse(
            model="m", max_tokens=256, messages=ASK, output_format=Person
        ).parsed_output
    with client.messages.stream(
        model="m", max_tokens=256, messages=ASK, output_format=Person
    ) as events:
        return events.get_final_message().parsed_output


@pytest.fixture
def native() -> Iterator[MessagesUpstream]:
    with MessagesUpstream() as scripted:
        yield scripted


@pytest.fixture
def chat() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


def test_both_spellings_become_a_chat_response_format() -> None:
    schema = Person.model_json_schema()
    spec = {"type": "json_schema", "schema": schema}
    for body in ({"output_config": {"format": spec}}, {"output_format": spec}):
        chat = to_chat_body({"model": "m", "messages": ASK, **body})
        assert chat["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    assert "response_format" not in to_chat_body({"model": "m", "messages": ASK})


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_native_upstream_violation_is_reasked(native: MessagesUpstream, stream: bool) -> None:
    native.push([text(BAD)], [text(GOOD)])
    settings = Settings(upstream=native.base_url, repair=RepairMode.REFLEXIVE)
    with running_proxy(settings) as proxy:
        assert _parsed(_client(proxy), stream=stream) == Person(name="Ann", age=40)
        first, reask = native.requests
        assert first.get("stream", False) is stream
        assert reask["stream"] is False
        assert reask["output_config"]["format"]["type"] == "json_schema"
        assert reask["messages"][-2]["role"] == "assistant"
        assert "$.age" in str(reask["messages"][-1]["content"])
        line = [entry for entry in proxy.log_lines() if entry.get("path")][-1]
        assert line["output_errors"] == ["output_schema_violation"]
        assert line["output_repairs"] == 1


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_chat_upstream_violation_is_reasked(chat: ScriptedUpstream, stream: bool) -> None:
    chat.push(completion(content=BAD), completion(content=GOOD))
    settings = Settings(
        upstream=chat.base_url, upstream_apis=("chat",), repair=RepairMode.REFLEXIVE
    )
    with running_proxy(settings) as proxy:
        assert _parsed(_client(proxy), stream=stream) == Person(name="Ann", age=40)
        first, reask = chat.chat_requests
        assert first["response_format"]["json_schema"]["schema"]["required"] == ["name", "age"]
        assert first.get("stream", False) is stream
        assert "$.age" in reask["messages"][-1]["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_repair_off_relays_the_answer_and_says_what_was_wrong(
    native: MessagesUpstream, stream: bool
) -> None:
    native.push([text(BAD)])
    with running_proxy(Settings(upstream=native.base_url, repair=RepairMode.OFF)) as proxy:
        body = {
            "model": "m",
            "max_tokens": 256,
            "messages": ASK,
            "output_config": {
                "format": {"type": "json_schema", "schema": Person.model_json_schema()}
            },
            "stream": stream,
        }
        reply = httpx.post(f"{proxy.root_url}/v1/messages", json=body, timeout=30)
        assert reply.headers["x-repairproxy-output-errors"] == "output_schema_violation"
        assert reply.headers["x-repairproxy-output-repairs"] == "0"
        assert reply.headers["x-repairproxy-episode-errors"] == "0"  # never charged
        assert "$.age" in reply.headers["x-repairproxy-output-error-paths"]
        if stream:
            events = [
                orjson.loads(line[6:])
                for line in reply.text.splitlines()
                if line.startswith("data: ")
            ]
            said = "".join(
                e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"
            )
            assert events[-1]["type"] == "message_stop"
        else:
            said = reply.json()["content"][0]["text"]
        assert said == BAD
        assert len(native.requests) == 1
