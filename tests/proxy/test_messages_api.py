"""``/v1/messages`` through the pipeline, with the official ``anthropic`` client against a scripted
native Messages upstream (re-asks in Messages' own shape) and a chat-only upstream (translated)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from repairproxy.settings import Settings
from tests.support.messages_upstream import (
    COUNTED_TOKENS,
    MessagesUpstream,
    text,
    thinking,
    tool_use,
)
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, error_reply, tool_call

TOOLS: list[Any] = [
    {
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "input_schema": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }
]
GOOD = {"order_id": "#W1"}
ASK: list[Any] = [{"role": "user", "content": "Where is my order #W1?"}]
TEXT_CALL = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>'


@pytest.fixture
def upstream() -> Iterator[MessagesUpstream]:
    with MessagesUpstream() as scripted:
        yield scripted


@pytest.fixture
def start(upstream: MessagesUpstream) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields = {"upstream": upstream.base_url, "repair": "reflexive", **overrides}
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


def _client(proxy: RunningProxy, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=proxy.root_url, api_key=options.pop("api_key", "x"), max_retries=0, **options
    )


def _calls(message: Any) -> list[tuple[str, Any]]:
    return [(block.name, block.input) for block in message.content if block.type == "tool_use"]


def _create(client: anthropic.Anthropic, *, stream: bool, **kwargs: Any) -> Any:
    """One answer, buffered or streamed (the SDK's stream helper assembles the final message)."""
    arguments = {"model": "m", "max_tokens": 256, "messages": ASK, "tools": TOOLS, **kwargs}
    if not stream:
        return client.messages.create(**arguments)
    with client.messages.stream(**arguments) as events:
        return events.get_final_message()


def _last_user_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    last = request["messages"][-1]
    assert last["role"] == "user"
    return list(last["content"])


# --- native upstream -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_valid_call_passes_with_one_upstream_request(
    start: Any, upstream: MessagesUpstream, stream: bool
) -> None:
    proxy = start()
    upstream.push([text("Let me look that up."), tool_use("get_order_details", GOOD)])
    message = _create(_client(proxy), stream=stream)
    assert _calls(message) == [("get_order_details", GOOD)]
    assert message.content[0].type == "text" and message.content[0].text == "Let me look that up."
    assert message.stop_reason == "tool_use"
    assert len(upstream.requests) == 1
    # the repair instruction went into the top-level system field, not a message
    assert "tool" in upstream.requests[0]["system"].lower()
    assert all(m["role"] in ("user", "assistant") for m in upstream.requests[0]["messages"])


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_an_invented_name_is_re_asked_with_an_error_tool_result(
    start: Any, upstream: MessagesUpstream, stream: bool
) -> None:
    proxy = start()
    bad = tool_use("lookup_order", GOOD)
    upstream.push([bad], [tool_use("get_order_details", GOOD)])
    headers = {"X-Episode-ID": f"ep-invented-{stream}"}
    if stream:
        message = _create(_client(proxy), stream=True, extra_headers=headers)
    else:
        raw = _client(proxy).messages.with_raw_response.create(
            model="m", max_tokens=256, messages=ASK, tools=TOOLS, extra_headers=headers
        )
        message = raw.parse()
        assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
        assert raw.headers["x-repairproxy-repairs"] == "1"
        assert raw.headers["x-repairproxy-episode-errors"] == "1"  # charged as τ²-bench would
    assert _calls(message) == [("get_order_details", GOOD)]
    assert message.stop_reason == "tool_use"
    reask = upstream.requests[1]
    assert reask["messages"][-2] == {"role": "assistant", "content": [bad]}
    result = _last_user_blocks(reask)[0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == bad["id"]
    assert result["is_error"] is True
    assert "lookup_order" in result["content"] and "get_order_details" in result["content"]
    assert reask["stream"] is False


def test_one_message_id_and_usage_summed_over_the_re_ask(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push([tool_use("lookup_order", GOOD)], [tool_use("get_order_details", GOOD)])
    message = _create(_client(proxy), stream=False)
    first, second = upstream.answered
    assert message.id == first != second
    assert message.usage.input_tokens == 40 and message.usage.output_tokens == 10


def test_a_streamed_repair_keeps_the_first_message_id_and_sums_usage(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push([tool_use("lookup_order", GOOD)], [tool_use("get_order_details", GOOD)])
    body = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": TOOLS, "stream": True}
    response = httpx.post(proxy.base_url + "/messages", json=body, timeout=30)
    events = [
        orjson.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("message_start") == 1 and kinds.count("message_delta") == 1
    assert events[0]["message"]["id"] == upstream.answered[0]
    assert "event: message_start\n" in response.text  # the event: lines Anthropic's SDKs read
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["name"] for s in starts] == ["get_order_details"]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] == 10 and delta["usage"]["input_tokens"] == 40
    assert ": x-repairproxy tool-errors=unknown_tool" in response.text


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_schema_violation_is_repaired(
    start: Any, upstream: MessagesUpstream, stream: bool
) -> None:
    proxy = start()
    upstream.push(
        [tool_use("get_order_details", {"order_id": 1})], [tool_use("get_order_details", GOOD)]
    )
    message = _create(_client(proxy), stream=stream)
    assert _calls(message) == [("get_order_details", GOOD)]
    result = _last_user_blocks(upstream.requests[1])[0]
    assert result["type"] == "tool_result" and result["is_error"] is True


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_call_written_as_text_is_promoted_and_stop_reason_follows(
    start: Any, upstream: MessagesUpstream, stream: bool
) -> None:
    proxy = start(repair="promote")
    upstream.push([text(TEXT_CALL)])
    message = _create(_client(proxy), stream=stream)
    assert _calls(message) == [("get_order_details", GOOD)]
    assert message.stop_reason == "tool_use"  # the upstream said end_turn
    assert len(upstream.requests) == 1


def test_broken_json_is_re_asked_in_a_user_turn_without_the_broken_tool_use(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push(
        [tool_use("get_order_details", '{"order_id": ')], [tool_use("get_order_details", GOOD)]
    )
    message = _create(_client(proxy), stream=True)
    assert _calls(message) == [("get_order_details", GOOD)]
    reask = upstream.requests[1]
    assistant = reask["messages"][-2]
    assert assistant["role"] == "assistant"
    assert not [
        b for b in assistant["content"] if b["type"] == "tool_use"
    ]  # input must be an object
    blocks = _last_user_blocks(reask)
    assert [b["type"] for b in blocks] == ["text"]


def test_thinking_and_prose_stream_before_a_held_call(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push(
        [thinking("Order lookup."), text("Checking."), tool_use("get_order_details", GOOD)]
    )
    message = _create(_client(proxy), stream=True)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "Order lookup." and message.content[0].signature


def test_tool_choice_none_leaves_a_text_call_as_text(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push([text(TEXT_CALL)])
    message = _create(_client(proxy), stream=False, tool_choice={"type": "none"})
    assert _calls(message) == [] and message.stop_reason == "end_turn"
    assert len(upstream.requests) == 1
    assert upstream.requests[0]["tool_choice"] == {"type": "none"}


def test_a_forced_tool_and_disable_parallel_tool_use_reach_the_re_ask(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push([tool_use("lookup_order", GOOD)], [tool_use("get_order_details", GOOD)])
    choice = {"type": "any", "disable_parallel_tool_use": True}
    message = _create(_client(proxy), stream=False, tool_choice=choice)
    assert _calls(message) == [("get_order_details", GOOD)]
    assert upstream.requests[0]["tool_choice"] == choice
    assert upstream.requests[1]["tool_choice"]["disable_parallel_tool_use"] is True


def test_the_budget_is_charged_once_and_an_error_tool_result_counts(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    headers = {"X-Episode-ID": "ep-budget"}
    upstream.push([tool_use("lookup_order", GOOD)], [tool_use("get_order_details", GOOD)])
    first = client.messages.with_raw_response.create(
        model="m", max_tokens=64, messages=ASK, tools=TOOLS, extra_headers=headers
    )
    call: Any = first.parse().content[0]
    assert first.headers["x-repairproxy-episode-errors"] == "1"
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [call.model_dump()]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": "order #W1 not found",
                    "is_error": True,
                }
            ],
        },
    ]
    for expected in ("2", "2"):  # the failed result counts once, however often it is resent
        upstream.push([text("Sorry, I cannot find it.")])
        raw = client.messages.with_raw_response.create(
            model="m", max_tokens=64, messages=history, tools=TOOLS, extra_headers=headers
        )
        assert raw.headers["x-repairproxy-episode-errors"] == expected
    # the result went upstream as the client wrote it
    sent = upstream.requests[-1]["messages"][-1]["content"][0]
    assert sent["content"] == "order #W1 not found" and sent["is_error"] is True


def test_anthropic_headers_pass_through_and_count_tokens_is_relayed(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    client = _client(proxy, default_headers={"anthropic-beta": "tools-2024-05-16"})
    upstream.push([text("hello")])
    client.messages.create(model="m", max_tokens=16, messages=ASK)
    assert upstream.headers[0]["anthropic-version"]  # the SDK's own version header
    assert upstream.headers[0]["anthropic-beta"] == "tools-2024-05-16"
    counted = client.messages.count_tokens(model="m", messages=ASK, tools=TOOLS)
    assert counted.input_tokens == COUNTED_TOKENS
    assert upstream.paths[-1].startswith("/v1/messages/count_tokens")


def test_the_proxy_key_is_accepted_as_x_api_key_and_never_forwarded(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start(api_keys=("secret-1",))
    upstream.push([text("hello")])
    message: Any = _client(proxy, api_key="secret-1").messages.create(
        model="m", max_tokens=16, messages=ASK
    )
    assert message.content[0].text == "hello"
    # this SDK sends the key as a Bearer token; older ones and other tools send x-api-key
    upstream.push([text("hello again")])
    body = {"model": "m", "max_tokens": 16, "messages": ASK}
    response = httpx.post(
        proxy.base_url + "/messages", json=body, headers={"x-api-key": "secret-1"}, timeout=10
    )
    assert response.status_code == 200, response.text
    assert response.json()["content"][0]["text"] == "hello again"
    assert all("x-api-key" not in sent for sent in upstream.headers)
    refused = httpx.post(
        proxy.base_url + "/messages", json=body, headers={"x-api-key": "wrong"}, timeout=10
    )
    assert refused.status_code == 401 and refused.json()["type"] == "error"
    with pytest.raises(anthropic.AuthenticationError) as caught:
        _client(proxy, api_key="wrong").messages.create(model="m", max_tokens=16, messages=ASK)
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "message": "missing or invalid API key for the proxy",
        },
    }


def test_proxy_errors_are_anthropic_shaped(start: Any, upstream: MessagesUpstream) -> None:
    proxy = start(max_body_bytes=2048)
    client = _client(proxy)
    with pytest.raises(anthropic.APIStatusError) as too_large:
        client.messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "x" * 4096}]
        )
    assert too_large.value.status_code == 413
    body = too_large.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "request_too_large"
    response = httpx.post(proxy.base_url + "/messages", content=b"{not json", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["type"] == "error"
    assert upstream.requests == []


def test_an_upstream_error_passes_through(start: Any, upstream: MessagesUpstream) -> None:
    proxy = start()
    error = {"type": "error", "error": {"type": "not_found_error", "message": "model: nope"}}
    upstream.push_error(404, error)
    with pytest.raises(anthropic.NotFoundError) as caught:
        _client(proxy).messages.create(model="nope", max_tokens=16, messages=ASK, tools=TOOLS)
    assert caught.value.body == error


# --- chat-only upstream (translated) -------------------------------------------------------------


@pytest.fixture
def chat_upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture
def start_chat(chat_upstream: ScriptedUpstream) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields = {
                "upstream": chat_upstream.base_url,
                "upstream_apis": ("chat",),
                "repair": "reflexive",
                **overrides,
            }
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_chat_upstream_answers_messages_with_a_repaired_call(
    start_chat: Any, chat_upstream: ScriptedUpstream, stream: bool
) -> None:
    proxy = start_chat()
    chat_upstream.push(
        completion(tool_calls=[tool_call("lookup_order", GOOD)]),
        completion(content="On it.", tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    message = _create(_client(proxy), stream=stream, system="You are a support agent.")
    assert _calls(message) == [("get_order_details", GOOD)]
    assert message.content[0].type == "text" and message.content[0].text == "On it."
    assert message.stop_reason == "tool_use"
    assert message.id.startswith("msg_")
    assert message.usage.input_tokens == 22 and message.usage.output_tokens == 14
    first, reask = chat_upstream.chat_requests
    assert first["messages"][0]["role"] == "system"
    assert first["messages"][0]["content"].startswith("You are a support agent.")
    assert first["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"]
    assert first["max_tokens"] == 256
    assert first.get("stream", False) is stream  # a streamed request streams from the upstream
    assert reask.get("stream", False) is False  # re-asks are answered whole
    assert reask["messages"][-1]["role"] == "tool"  # the chat re-ask, as for chat clients


def test_a_chat_upstream_promotes_a_text_call_and_maps_tool_choice(
    start_chat: Any, chat_upstream: ScriptedUpstream
) -> None:
    proxy = start_chat(repair="promote")
    chat_upstream.push(completion(content=TEXT_CALL))
    choice = {"type": "tool", "name": "get_order_details", "disable_parallel_tool_use": True}
    message = _create(_client(proxy), stream=True, tool_choice=choice)
    assert _calls(message) == [("get_order_details", GOOD)]
    assert message.stop_reason == "tool_use"
    sent = chat_upstream.chat_requests[0]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_order_details"}}
    assert sent["parallel_tool_calls"] is False


def test_a_chat_upstream_error_is_anthropic_shaped(
    start_chat: Any, chat_upstream: ScriptedUpstream
) -> None:
    proxy = start_chat()
    chat_upstream.push(error_reply(400, "max_tokens is too large"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        _create(_client(proxy), stream=False)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens is too large"},
    }


def test_oversized_headers_get_a_431_the_anthropic_client_reads(upstream: MessagesUpstream) -> None:
    """The 431 is written by the HTTP protocol before any route is known: its one JSON body is
    Anthropic-shaped (and OpenAI-shaped) at once."""
    import socket
    import threading
    import time

    import uvicorn

    from repairproxy.app import create_app
    from repairproxy.server import server_options

    settings = Settings(upstream=upstream.base_url, max_header_bytes=4096)
    app = create_app(settings, log_stream=io.BytesIO())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    options = {k: v for k, v in server_options(settings).items() if k not in ("host", "port")}
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        client = anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", api_key="x", max_retries=0
        )
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(
                model="m", max_tokens=16, messages=ASK, extra_headers={"x-big": "a" * 8192}
            )
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert caught.value.status_code == 431
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == "request line and headers too large"
    assert upstream.requests == []


def test_a_stream_gets_pings_while_a_held_call_is_re_asked(
    start: Any, upstream: MessagesUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    import repairproxy.asgi.chat_upstream as framing

    monkeypatch.setattr(framing, "KEEP_ALIVE_SECONDS", 0.02)
    proxy = start()
    upstream.slow_re_asks(0.5)
    upstream.push(
        [text("Checking."), tool_use("lookup_order", GOOD)], [tool_use("get_order_details", GOOD)]
    )
    body = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": TOOLS, "stream": True}
    response = httpx.post(proxy.base_url + "/messages", json=body, timeout=30)
    kinds = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    text_stop = kinds.index("content_block_stop")  # the prose block, released before the verdict
    call_start = kinds.index("content_block_start", text_stop)
    assert "ping" in kinds[text_stop:call_start]  # the client heard from us while we re-asked
    assert kinds[-1] == "message_stop"


def test_prose_then_a_text_call_streams_as_the_buffered_answer(
    start: Any, upstream: MessagesUpstream
) -> None:
    """The prose flows; from where the text opens a call it is held, so the streamed message
    the SDK assembles is the buffered one: no call markup in the text, the promoted tool_use."""
    proxy = start(repair="promote")
    answer = [text("Let me look that up.\n" + TEXT_CALL)]
    upstream.push(answer, answer)
    buffered = _create(_client(proxy), stream=False)
    streamed = _create(_client(proxy), stream=True)
    assert _calls(buffered) == _calls(streamed) == [("get_order_details", GOOD)]
    assert [b.type for b in streamed.content] == [b.type for b in buffered.content]
    texts = [b.text for b in streamed.content if b.type == "text"]
    assert texts == [b.text for b in buffered.content if b.type == "text"]
    assert all("tool_call" not in t for t in texts)
    assert streamed.stop_reason == buffered.stop_reason == "tool_use"


def test_messages_requests_are_counted_under_their_own_api_label(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start()
    upstream.push([tool_use("lookup_order", GOOD)], [tool_use("get_order_details", GOOD)])
    _create(_client(proxy), stream=False)
    exposition = httpx.get(proxy.root_url + "/metrics", timeout=10).text
    counted = [
        line
        for line in exposition.splitlines()
        if line.startswith("repairproxy_requests_total{") and 'api="messages"' in line
    ]
    assert any('outcome="repaired"' in line and line.endswith(" 1.0") for line in counted), counted
    [logged] = [line for line in proxy.log_lines() if line.get("path") == "/v1/messages"]
    assert logged["api"] == "messages" and logged["channels"] == ["unknown_tool"]
    assert "validated" not in logged  # judged, not relayed


def test_an_error_after_the_stream_started_is_one_anthropic_error_event(
    start: Any, upstream: MessagesUpstream
) -> None:
    proxy = start(on_exhausted="error", max_repairs=1)
    bad = [text("Checking."), tool_use("lookup_order", GOOD)]
    upstream.push(bad, [tool_use("lookup_order", GOOD)])
    body = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": TOOLS, "stream": True}
    response = httpx.post(proxy.base_url + "/messages", json=body, timeout=30)
    assert response.status_code == 200  # the headers left with the prose
    lines = response.text.rstrip().splitlines()
    assert lines[-2] == "event: error"
    error = orjson.loads(lines[-1][6:])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "lookup_order" not in response.text  # the invalid call never reached the client
    upstream.push(bad, [tool_use("lookup_order", GOOD)])
    with pytest.raises(anthropic.APIStatusError) as caught:  # the SDK raises it as an error
        _create(_client(proxy), stream=True)
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "error"


@pytest.mark.parametrize(
    "content",
    [5, [{"text": "a block without a type"}, 3, None], [{"type": "image", "source": {}}]],
    ids=["a-number", "odd-blocks", "image-only"],
)
def test_odd_content_is_judged_and_forwarded_never_a_500(
    start: Any, upstream: MessagesUpstream, content: Any
) -> None:
    """Content the adapter cannot read is no text to it; the upstream answers it as it would
    without the proxy (here the invented call is re-asked, so the re-ask carries it too)."""
    proxy = start()
    upstream.push([tool_use("lookup_order", GOOD)], [text("ok")])
    body = {"model": "m", "max_tokens": 16, "tools": TOOLS}
    body["messages"] = [{"role": "user", "content": content}]
    response = httpx.post(proxy.base_url + "/messages", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "ok"}]
    assert upstream.requests[0]["messages"][0]["content"] == content


def test_a_chat_upstream_stream_lets_prose_flow_before_the_verdict(
    start_chat: Any, chat_upstream: ScriptedUpstream
) -> None:
    proxy = start_chat()
    chat_upstream.push(
        completion(content="Let me check.", tool_calls=[tool_call("lookup_order", GOOD)]),
        completion(tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    body = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": TOOLS, "stream": True}
    response = httpx.post(proxy.base_url + "/messages", json=body, timeout=30)
    events = [
        orjson.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    texts = [
        e["delta"]["text"]
        for e in events
        if e["type"] == "content_block_delta" and "text" in e["delta"]
    ]
    assert "".join(texts) == "Let me check."
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1]["name"] == "get_order_details"
    # the headers left with the prose: the verdict comes as the comment before message_stop
    assert ": x-repairproxy tool-errors=unknown_tool" in response.text
    assert kinds[-1] == "message_stop"


def test_a_chat_upstream_stream_gets_pings_while_a_held_call_is_re_asked(
    start_chat: Any, chat_upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The translated stream keeps talking as the native one does: prose out, a re-ask slower
    than the interval, pings meanwhile; the Anthropic SDK still assembles the repaired call."""
    import repairproxy.asgi.chat_upstream as framing

    monkeypatch.setattr(framing, "KEEP_ALIVE_SECONDS", 0.02)
    proxy = start_chat()
    for _ in range(2):  # once read raw, once through the SDK
        chat_upstream.push(
            completion(content="Let me check.", tool_calls=[tool_call("lookup_order", GOOD)]),
            completion(tool_calls=[tool_call("get_order_details", GOOD)], delay=0.5),
        )
    body = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": TOOLS, "stream": True}
    response = httpx.post(proxy.base_url + "/messages", json=body, timeout=30)
    kinds = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    text = kinds.index("content_block_delta")  # the prose, released before the verdict
    call = kinds.index("content_block_start", text)  # the repaired call
    assert "ping" in kinds[text:call]
    streamed = _create(_client(proxy), stream=True)
    assert _calls(streamed) == [("get_order_details", GOOD)]
