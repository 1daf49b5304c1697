"""``/v1/responses`` through the pipeline, with the official openai client's ``responses.create``
against a scripted Responses upstream that stores responses."""

from __future__ import annotations

import asyncio
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
