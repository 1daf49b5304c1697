"""``/v1/responses`` on an upstream that serves chat completions only (``--upstream-apis chat``,
the embedded model's default): the request is asked in chat, the judged answer comes back in
Responses shape (JSON and event streams), and chains are served from the proxy's store. The
official openai client against a scripted chat-only upstream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import orjson
import pytest
from pydantic import BaseModel

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.servers import raw_server

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }
]
GOOD = {"order_id": "#W1"}


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture
def start(upstream: ScriptedUpstream) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields = {
                "upstream": upstream.base_url,
                "upstream_apis": ("chat",),
                "repair": "reflexive",
                **overrides,
            }
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)


def _only_chat(upstream: ScriptedUpstream) -> None:
    assert {r.path for r in upstream.requests} == {"/v1/chat/completions"}


def test_a_repaired_call_comes_back_as_a_function_call_item(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    upstream.push(
        completion(tool_calls=[tool_call("lookup_order", GOOD)]),  # invented: re-asked
        completion(tool_calls=[tool_call("get_order_details", GOOD, call_id="call_good")]),
    )
    raw = _client(proxy).responses.with_raw_response.create(
        model="m", input="Where is #W1?", tools=TOOLS, instructions="Be brief."
    )
    response = raw.parse()
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert raw.headers["x-repairproxy-repairs"] == "1"
    calls = [i for i in response.output if i.type == "function_call"]
    assert [(c.name, orjson.loads(c.arguments), c.call_id) for c in calls] == [
        ("get_order_details", GOOD, "call_good")
    ]
    assert response.status == "completed" and response.usage is not None
    _only_chat(upstream)
    sent = upstream.chat_requests[0]
    assert sent["messages"][0]["role"] == "system"
    assert sent["messages"][0]["content"].startswith("Be brief.")
    assert sent["messages"][1] == {"role": "user", "content": "Where is #W1?"}
    assert sent["tools"][0]["function"]["name"] == "get_order_details"
    assert sent["stream"] is False


def test_a_chain_is_rebuilt_from_the_store_in_chat_messages(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    upstream.push(
        completion(content="Let me check.", tool_calls=[tool_call("get_order_details", GOOD)]),
        completion(content="It was delivered."),
    )
    first = client.responses.create(
        model="m", input="Where is #W1?", tools=TOOLS, instructions="Answer in French."
    )
    call = next(i for i in first.output if i.type == "function_call")
    assert first.output_text == "Let me check."
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "delivered"}],
    )
    assert second.output_text == "It was delivered."
    assert second.previous_response_id == first.id
    messages = upstream.chat_requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert "Answer in French." not in messages[0]["content"]  # not carried over
    assert messages[2]["content"] == "Let me check."
    assert messages[2]["tool_calls"][0]["id"] == call.call_id
    assert messages[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "delivered"}
    items = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
    ]
    _only_chat(upstream)


def test_the_official_client_streams_a_translated_answer(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    upstream.push(
        completion(content="Checking.", tool_calls=[tool_call("lookup_order", GOOD)]),
        completion(content="Checking.", tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    with _client(proxy).responses.stream(model="m", input="Where?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == "Checking."
    assert [i.name for i in final.output if i.type == "function_call"] == ["get_order_details"]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created = events[0].response
    assert created.id == final.id
    _only_chat(upstream)


def test_unknown_chain_ids_are_404s_and_never_reach_the_upstream(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="m", previous_response_id="resp_nope", input="and?")
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    assert upstream.requests == []


def test_an_upstream_error_is_passed_on(start: Any, upstream: ScriptedUpstream) -> None:
    from tests.support.scripted_upstream import error_reply

    proxy = start()
    upstream.push(error_reply(400, "model 'm' does not exist"))
    sent = httpx.post(proxy.base_url + "/responses", json={"model": "m", "input": "hi"}, timeout=30)
    assert sent.status_code == 400
    assert sent.json()["error"]["message"] == "model 'm' does not exist"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    frame = b"data: " + orjson.dumps({**body, **extra}) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(frame), frame)


def test_a_translated_stream_flows_as_the_chat_stream_arrives() -> None:
    """Prose reaches the client while the chat upstream is still answering (the upstream waits
    until the client saw it; an answer judged whole never would); the invented call after it is
    held, repaired, and framed as a function_call item: one id, sequence 0, 1, 2, ..."""
    seen = threading.Event()
    waited: list[bool] = []
    requests: list[dict[str, Any]] = []
    prose = "Checking the order. "

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> None:
        request = orjson.loads(raw.split(b"\r\n\r\n", 1)[1])
        requests.append(request)
        if not request.get("stream"):  # the re-ask
            reply = completion(
                content=prose, tool_calls=[tool_call("get_order_details", GOOD, "call_2")]
            )
            payload = orjson.dumps(reply.body)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
            writer.write(b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        writer.write(_chunk({"role": "assistant", "content": prose}))
        await writer.drain()
        waited.append(await asyncio.get_running_loop().run_in_executor(None, seen.wait, 10))
        call = {"index": 0, "id": "call_1", "type": "function"}
        call["function"] = {"name": "lookup_order", "arguments": orjson.dumps(GOOD).decode()}
        writer.write(_chunk({"tool_calls": [call]}))
        writer.write(_chunk({}, "tool_calls"))
        usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
        writer.write(_chunk({}, None, choices=[], usage=usage))
        frame = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(frame), frame))

    with raw_server(handle) as url:
        settings = Settings(
            upstream=url + "/v1", upstream_apis=("chat",), repair=RepairMode.REFLEXIVE
        )
        with running_proxy(settings) as proxy:
            events = []
            with _client(proxy).responses.stream(model="m", input="Where?", tools=TOOLS) as stream:
                for event in stream:
                    events.append(event)
                    if event.type == "response.output_text.delta":
                        seen.set()
                final = stream.get_final_response()
    assert waited == [True]
    assert final.output_text == prose
    assert [i.name for i in final.output if i.type == "function_call"] == ["get_order_details"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    ids = {e.response.id for e in events if hasattr(e, "response")}
    assert ids == {final.id}
    assert final.usage is not None and final.usage.total_tokens > 13  # both attempts counted
    assert [r.get("stream") for r in requests] == [True, False]
    assert requests[0]["stream_options"] == {"include_usage": True}


class Person(BaseModel):
    name: str
    age: int


def test_a_translated_stream_with_a_text_format_is_held_and_reasked(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start()
    upstream.push(
        completion(content='{"name": "Ann", "age": "forty"}'),
        completion(content='{"name": "Ann", "age": 40}'),
    )
    with _client(proxy).responses.stream(
        model="m", input="Who is Ann?", text_format=Person
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_parsed == Person(name="Ann", age=40)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == '{"name": "Ann", "age": 40}'  # the bad answer never left
    assert [e.sequence_number for e in events] == list(range(len(events)))
    first, reask = upstream.chat_requests
    assert first["stream"] is True and reask["stream"] is False
    assert first["response_format"]["type"] == "json_schema"
    assert "$.age" in reask["messages"][-1]["content"]
    _only_chat(upstream)


def test_a_translated_stream_with_repair_off_says_what_was_wrong(
    start: Any, upstream: ScriptedUpstream
) -> None:
    proxy = start(repair="off")
    upstream.push(completion(content='{"name": "Ann"}'))
    body = {
        "model": "m",
        "input": "Who is Ann?",
        "stream": True,
        "text": {
            "format": {"type": "json_schema", "name": "P", "schema": Person.model_json_schema()}
        },
    }
    reply = httpx.post(proxy.base_url + "/responses", json=body, timeout=30)
    assert reply.headers["x-repairproxy-output-errors"] == "output_schema_violation"
    events = [
        orjson.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == '{"name": "Ann"}'
    assert events[-1]["type"] == "response.completed"
    assert len(upstream.chat_requests) == 1


def test_a_translated_stream_keeps_alive_while_a_held_call_is_re_asked(
    start: Any, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prose went out, the invented call after it is re-asked slower than the keep-alive
    interval: the client hears SSE comments meanwhile (as a Messages stream hears pings), and
    the official client still parses the stream into the repaired answer."""
    import repairproxy.asgi.chat_upstream as framing

    monkeypatch.setattr(framing, "KEEP_ALIVE_SECONDS", 0.02)
    proxy = start()
    for _ in range(2):  # once read raw, once through the official client
        upstream.push(
            completion(content="Checking.", tool_calls=[tool_call("lookup_order", GOOD)]),
            completion(tool_calls=[tool_call("get_order_details", GOOD)], delay=0.5),
        )
    body = {"model": "m", "input": "Where?", "tools": TOOLS, "stream": True}
    lines = httpx.post(proxy.base_url + "/responses", json=body, timeout=30).text.splitlines()
    kinds = [line[7:] if line.startswith("event: ") else line for line in lines]
    text = kinds.index("response.output_text.delta")  # the prose, released before the verdict
    call = kinds.index("response.output_item.added", text)  # the repaired call
    assert ": keep-alive" in kinds[text:call]
    with _client(proxy).responses.stream(model="m", input="Where?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == "Checking."
    assert [i.name for i in final.output if i.type == "function_call"] == ["get_order_details"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    _only_chat(upstream)
