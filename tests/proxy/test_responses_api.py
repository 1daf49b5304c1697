"""``/v1/responses`` through the pipeline, with the official openai client's ``responses.create``
against a scripted Responses upstream that stores responses."""

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

from repairproxy.settings import Settings
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call, message
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
        "strict": True,
    }
]
GOOD = {"order_id": "#W1"}


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as scripted:
        yield scripted


@pytest.fixture
def start(upstream: ResponsesUpstream) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields = {"upstream": upstream.base_url, "repair": "reflexive", **overrides}
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)


def _calls(response: Any) -> list[tuple[str, dict[str, Any]]]:
    return [
        (item.name, orjson.loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    ]


def test_plain_text_passes_through(start: Any, upstream: ResponsesUpstream) -> None:
    proxy = start()
    upstream.push([message("hello")])
    response = _client(proxy).responses.create(model="m", input="hi")
    assert response.output_text == "hello"
    assert len(upstream.requests) == 1


def test_hallucinated_name_is_repaired_before_the_client_sees_it(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start()
    upstream.push([function_call("lookup_order", GOOD)], [function_call("get_order_details", GOOD)])
    raw = _client(proxy).responses.with_raw_response.create(
        model="m", input="Where is #W1?", tools=TOOLS, extra_headers={"X-Episode-ID": "ep-r"}
    )
    response = raw.parse()
    assert _calls(response) == [("get_order_details", GOOD)]
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert raw.headers["x-repairproxy-repairs"] == "1"
    assert raw.headers["x-repairproxy-unknown-tools"] == "lookup_order"
    # charged as tau2-bench would have: the invented name would have failed once
    assert raw.headers["x-repairproxy-episode-errors"] == "1"
    reask = upstream.requests[1]
    outputs = [i for i in reask["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and "lookup_order" in outputs[0]["output"]
    assert "get_order_details" in outputs[0]["output"]  # the diagnosis names the declared tool
    # a changed answer has an id of the proxy's own (the upstream's holds the repair turns)
    assert response.id not in upstream.stored_ids
    assert _client(proxy).responses.retrieve(response.id).output[0].name == "get_order_details"


def test_chained_turns_continue_the_episode_and_the_upstream_chain(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    upstream.push([function_call("lookup_order", GOOD)], [function_call("get_order_details", GOOD)])
    first = client.responses.with_raw_response.create(model="m", input="Where?", tools=TOOLS)
    turn1 = first.parse()
    episode = first.headers["x-repairproxy-episode-id"]
    call = next(i for i in turn1.output if i.type == "function_call")
    upstream.push([message("It is on its way.")])
    second = client.responses.with_raw_response.create(
        model="m",
        previous_response_id=turn1.id,
        tools=TOOLS,
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "Error: Order #W1 not found",
            }
        ],
    )
    assert second.parse().output_text == "It is on its way."  # the upstream knew the id
    assert second.headers["x-repairproxy-episode-id"] == episode  # same episode, no header
    # 1 for the caught invented name + 1 for the environment's error result
    assert second.headers["x-repairproxy-episode-errors"] == "2"


def test_streaming_text_flows_and_repaired_calls_arrive_whole(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    upstream.push([message("Plain prose answer.")])
    with client.responses.stream(model="m", input="hi", tools=TOOLS) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == "Plain prose answer."

    upstream.push([function_call("lookup_order", GOOD)], [function_call("get_order_details", GOOD)])
    events = list(client.responses.create(model="m", input="Where?", tools=TOOLS, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [orjson.loads(e.arguments) for e in done] == [GOOD]
    added = [e.item.name for e in events if e.type == "response.output_item.added"]
    assert added == ["get_order_details"]  # the invented name never reached the client
    assert _calls(events[-1].response) == [("get_order_details", GOOD)]
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_promote_turns_a_text_call_into_a_function_call_item(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start(repair="promote")
    text = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    upstream.push([message(text)])
    raw = _client(proxy).responses.with_raw_response.create(model="m", input="?", tools=TOOLS)
    assert _calls(raw.parse()) == [("get_order_details", GOOD)]
    assert raw.headers["x-repairproxy-promoted"] == "1"
    assert len(upstream.requests) == 1  # promotion costs no upstream call


def test_instruction_goes_into_instructions_and_the_log_says_responses(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start()
    upstream.push([message("ok")])
    _client(proxy).responses.create(model="m", input="hi", tools=TOOLS, instructions="Be brief.")
    sent = upstream.requests[0]["instructions"]
    assert sent.startswith("Be brief.\n\n") and len(sent) > len("Be brief.\n\n")
    line = proxy.log_lines()[-1]
    assert (line["api"], line["path"], line["model"], line["stream"]) == (
        "responses",
        "/v1/responses",
        "m",
        False,
    )


def test_bad_input_is_an_openai_error(start: Any) -> None:
    proxy = start()
    with pytest.raises(openai.BadRequestError) as caught:
        _client(proxy).responses.create(model="m", input=5)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "input"  # type: ignore[index]


@pytest.mark.parametrize("bad_id", [["resp", 1], {"id": "resp"}, 7, None])
def test_a_non_string_upstream_response_id_is_not_a_500(bad_id: Any) -> None:
    """An upstream answering with a list, object, number or null id: the proxy still judges
    (and repairs) the answer, never a server error."""
    answers = iter(
        [
            [function_call("lookup_order", GOOD)],  # an invented name: the proxy re-asks
            [function_call("get_order_details", GOOD)],
        ]
    )

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _q: bytes) -> None:
        body = orjson.dumps({"id": bad_id, "object": "response", "output": next(answers)})
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )

    with raw_server(handle) as url, running_proxy(Settings(upstream=url + "/v1")) as proxy:
        sent = httpx.post(
            proxy.base_url + "/responses",
            json={"model": "m", "input": "Where?", "tools": TOOLS},
            timeout=30,
        )
        assert sent.status_code == 200, sent.text
        assert sent.json()["output"][0]["name"] == "get_order_details"


def test_an_error_after_a_stream_started_is_a_responses_error_event(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """Prose already streamed, then repairs run out with ``--on-exhausted error``: the stream
    ends with one Responses ``error`` event, not a chat-shaped ``data: {"error"}`` + ``[DONE]``."""
    proxy = start(on_exhausted="error", max_repairs=1)
    upstream.push(
        [message("Let me look that up."), function_call("lookup_order", GOOD)],
        [function_call("lookup_order", GOOD)],  # the re-ask invents the name again
    )
    with httpx.stream(
        "POST",
        proxy.base_url + "/responses",
        json={"model": "m", "input": "Where?", "tools": TOOLS, "stream": True},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        text = response.read().decode()
    assert "[DONE]" not in text
    frames = [frame for frame in text.split("\n\n") if frame.strip()]
    assert frames[0].startswith("event: response.created")
    last = frames[-1].split("\n")
    assert last[0] == "event: error"
    error = orjson.loads(last[1].removeprefix("data: "))
    assert error["type"] == "error" and error["message"] and error["code"]


def test_a_stream_whose_headers_left_early_carries_the_verdict_before_its_terminal_event(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """Prose streamed first (headers say errors 0), then a repaired call: the verdict follows
    as one ``: x-repairproxy ...`` comment just before ``response.completed``, the last frame."""
    proxy = start()
    upstream.push(
        [message("Let me look that up."), function_call("lookup_order", GOOD)],
        [function_call("get_order_details", GOOD)],
    )
    with httpx.stream(
        "POST",
        proxy.base_url + "/responses",
        json={"model": "m", "input": "Where?", "tools": TOOLS, "stream": True},
        timeout=30,
    ) as response:
        assert response.headers["x-repairproxy-episode-errors"] == "0"  # before the verdict
        text = response.read().decode()
    frames = [frame for frame in text.split("\n\n") if frame.strip()]
    assert frames[-1].startswith("event: response.completed")
    comment = frames[-2]
    assert comment.startswith(": x-repairproxy ")
    assert "tool-errors=unknown_tool" in comment and "repairs=1" in comment
    assert "episode-errors=1" in comment


def _frames(proxy: RunningProxy, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """A raw Responses stream: its events in order (comments dropped) and every frame's text."""
    with httpx.stream("POST", proxy.base_url + "/responses", json=body, timeout=30) as response:
        assert response.status_code == 200
        text = response.read().decode()
    frames = [frame for frame in text.split("\n\n") if frame.strip()]
    events = []
    for frame in frames:
        data = [line[6:] for line in frame.split("\n") if line.startswith("data: ")]
        if data:
            events.append(orjson.loads("".join(data)))
    return events, frames


def _streamed_output(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as the events built them (what a client accumulates)."""
    items: dict[int, dict[str, Any]] = {}
    for event in events:
        if event["type"] == "response.output_item.done":
            items[event["output_index"]] = event["item"]
    return [items[index] for index in sorted(items)]


def _item_view(item: dict[str, Any]) -> tuple[Any, ...]:
    if item["type"] == "message":
        return ("message", "".join(part["text"] for part in item["content"]))
    return (item["type"], item.get("call_id"), item.get("name"), item.get("arguments"))


def test_a_repaired_stream_keeps_one_id_and_counts_its_sequence_by_one(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """Prose, then an invented call repaired by a re-ask: the client sees one response id from
    ``response.created`` to ``response.completed``, sequence numbers 0, 1, 2, ..., the terminal
    event last, and a completed output equal to the items it was streamed."""
    proxy = start()
    upstream.push(
        [message("Let me look that up."), function_call("lookup_order", GOOD)],
        [function_call("get_order_details", GOOD)],
    )
    body = {"model": "m", "input": "Where?", "tools": TOOLS, "stream": True}
    events, frames = _frames(proxy, body)
    ids = {e["response"]["id"] for e in events if isinstance(e.get("response"), dict)}
    assert len(ids) == 1, ids
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert frames[-1].startswith("event: response.completed")
    completed = events[-1]["response"]
    assert [_item_view(i) for i in completed["output"]] == [
        _item_view(i) for i in _streamed_output(events)
    ]
    assert [_item_view(i)[0] for i in completed["output"]] == ["message", "function_call"]
    assert completed["output"][0]["content"][0]["text"] == "Let me look that up."
    assert completed["output"][1]["name"] == "get_order_details"
    # the id continues the chain the client saw
    retrieved = _client(proxy).responses.retrieve(ids.pop())
    assert [i.type for i in retrieved.output] == ["message", "function_call"]


def test_the_official_client_streams_a_repaired_answer_with_one_identity(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start()
    upstream.push(
        [message("Checking."), function_call("lookup_order", GOOD)],
        [function_call("get_order_details", GOOD)],
    )
    with _client(proxy).responses.stream(model="m", input="Where?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    created = next(e for e in events if e.type == "response.created")
    assert final.id == created.response.id
    assert final.output_text == "Checking."
    assert _calls(final) == [("get_order_details", GOOD)]
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))


def test_an_incomplete_stream_ends_with_its_terminal_event(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """The upstream stops at max_output_tokens after a call: held call events go out before
    ``response.incomplete``, never after it."""
    proxy = start()
    upstream.push([function_call("get_order_details", GOOD)])
    upstream.end_stream_with("response.incomplete")
    body = {"model": "m", "input": "Where?", "tools": TOOLS, "stream": True}
    events, frames = _frames(proxy, body)
    assert events[-1]["type"] == "response.incomplete"
    assert frames[-1].startswith("event: response.incomplete")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_json_looking_text_is_released_after_16_kib_as_chat_does() -> None:
    """Text that opens like a call but runs past 16 KiB is prose after all: it reaches the
    client while the upstream is still answering (the upstream waits until the client saw it;
    held to the end, it never would)."""
    seen = threading.Event()
    waited: list[bool] = []
    text = '{"report": "' + "x" * 20_000

    def sse(kind: str, **fields: Any) -> bytes:
        frame = b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))
        return b"%x\r\n%s\r\n" % (len(frame), frame)

    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _q: bytes) -> None:
        started = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
        item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
        ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        writer.write(sse("response.created", response=started, sequence_number=0))
        writer.write(sse("response.output_item.added", output_index=0, item=item))
        writer.write(sse("response.output_text.delta", delta=text, **ids))
        await writer.drain()
        waited.append(await asyncio.get_running_loop().run_in_executor(None, seen.wait, 10))
        part = {"type": "output_text", "text": text + '"}', "annotations": []}
        done = {**item, "status": "completed", "content": [part]}
        writer.write(sse("response.output_text.delta", delta='"}', **ids))
        writer.write(sse("response.output_item.done", output_index=0, item=done))
        final = {**started, "status": "completed", "output": [done]}
        writer.write(sse("response.completed", response=final))
        writer.write(b"0\r\n\r\n")

    body = {"model": "m", "input": "Report?", "tools": TOOLS, "stream": True}
    with raw_server(handle) as url, running_proxy(Settings(upstream=url + "/v1")) as proxy:
        received = b""
        with httpx.stream("POST", proxy.base_url + "/responses", json=body, timeout=30) as reply:
            for chunk in reply.iter_bytes():
                received += chunk
                if b"x" * 1000 in received:
                    seen.set()
    assert waited == [True]
    frames = [frame for frame in received.decode().split("\n\n") if frame.strip()]
    assert frames[-1].startswith("event: response.completed")


# The prose is longer than the call, so the upstream's first text delta (half the text) is
# prose alone and the second holds the call.
PROSE = "Let me look that order up for you right away, it will only take a moment, thank you."
TEXT_CALL = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'


@pytest.mark.parametrize("api", ["stream", "create"])
def test_prose_flows_and_a_text_call_after_it_is_held_until_promoted(
    start: Any, upstream: ResponsesUpstream, api: str
) -> None:
    """As on a chat stream: the prose item's text flows; from the call opener on it is held
    until the verdict, so the promoted call's text never leaves as text, and the streamed
    answer is the buffered one (the prose as a message, the call as a function_call item)."""
    proxy = start(repair="promote")
    text = PROSE + "\n" + TEXT_CALL
    upstream.push([message(text)], [message(text)])
    with _client(proxy) as client:
        buffered = client.responses.create(model="m", input="Where?", tools=TOOLS)
        if api == "stream":
            with client.responses.stream(model="m", input="Where?", tools=TOOLS) as stream:
                events = list(stream)
                final = stream.get_final_response()
        else:
            asked = client.responses.create(model="m", input="Where?", tools=TOOLS, stream=True)
            events = list(asked)
            final = events[-1].response
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas[0] == text[: len(text) // 2]  # the prose flowed as the upstream sent it
    assert "".join(deltas) == PROSE and "get_order_details" not in "".join(deltas)
    assert final.output_text == buffered.output_text == PROSE
    assert _calls(final) == _calls(buffered) == [("get_order_details", GOOD)]
    assert [i.type for i in final.output] == [i.type for i in buffered.output]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_prose_with_a_call_it_declines_keeps_its_text_on_a_stream(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """A call opener in prose holds the text; the verdict (not promoted: the prose declines
    it) lets the held text go as it came."""
    proxy = start(repair="promote")
    text = PROSE + " I will not run " + TEXT_CALL + " until you confirm."
    upstream.push([message(text)])
    with _client(proxy) as client:
        events = list(client.responses.create(model="m", input="Where?", tools=TOOLS, stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == text and events[-1].response.output_text == text
    assert _calls(events[-1].response) == []


@pytest.mark.parametrize("body", [b"[]", b'{"output": "none"}', b"not json"])
def test_a_2xx_that_is_not_a_responses_answer_is_a_502(body: bytes) -> None:
    async def handle(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _q: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )

    with raw_server(handle) as url, running_proxy(Settings(upstream=url + "/v1")) as proxy:
        sent = httpx.post(proxy.base_url + "/responses", json={"model": "m", "input": "hi"})
    assert sent.status_code == 502
    error = sent.json()["error"]
    assert (
        error["message"] == "the upstream answered 200 with a body that is not a Responses answer"
    )
