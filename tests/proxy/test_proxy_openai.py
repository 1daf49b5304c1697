"""The proxy observes (repair off): the official openai client gets the upstream's answers
unchanged, with ``X-Repairproxy-Tool-Errors`` naming the channel of every call."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

# (answer the upstream gives, channels the header must name)
CASES: dict[str, tuple[Reply, str]] = {
    "valid": (completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]), ""),
    "hallucinated_name": (
        completion(tool_calls=[tool_call("get_order_status", {"order_id": "#W1"})]),
        "unknown_tool",
    ),
    "broken_json": (
        completion(tool_calls=[tool_call("get_order_details", '{"order_id": "#W1"')]),
        "invalid_json",
    ),
    "schema_violation": (
        completion(tool_calls=[tool_call("exchange_items", {"order_id": "#W1", "item_ids": "x"})]),
        "schema_violation",
    ),
    "enum_violation": (
        completion(
            tool_calls=[
                tool_call(
                    "exchange_items", {"order_id": "#W1", "item_ids": ["1"], "reason": "mood"}
                )
            ]
        ),
        "schema_violation",
    ),
    "call_in_text": (
        completion(
            content="<tool_call>"
            '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
            "</tool_call>"
        ),
        "tool_call_in_content",
    ),
    "empty_output": (completion(content=""), "empty_output"),
    "plain_text": (completion(content="Your order ships tomorrow."), ""),
    "parallel_mixed": (
        completion(
            tool_calls=[
                tool_call("get_order_details", {"order_id": "#W1"}),
                tool_call("cancel_order", {"order_id": "#W1"}),
                tool_call("find_user_id_by_email", "{bad"),
            ]
        ),
        "unknown_tool,invalid_json",
    ),
}


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="sk-client", max_retries=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sync_answer_unchanged_with_channel_header(
    case: str, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    reply, expected = CASES[case]
    upstream.push(reply)
    with _client(proxy) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="scripted-model", messages=MESSAGES, tools=TOOLS
        )
    assert raw.headers["x-repairproxy-tool-errors"] == expected
    assert raw.headers["x-repairproxy-repairs"] == "0"
    assert float(raw.headers["x-repairproxy-overhead-ms"]) >= 0
    # Byte for byte what the upstream sent.
    assert raw.http_response.content == orjson.dumps(reply.body)
    parsed = raw.parse()
    assert parsed.id == reply.body["id"]
    assert parsed.choices[0].message.content == reply.body["choices"][0]["message"]["content"]


def test_request_body_forwarded_byte_for_byte(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    """Unknown fields, key order and spacing survive: repair off sends the original bytes."""
    reply, _ = CASES["valid"]
    upstream.push(reply)
    body = (
        b'{"model": "scripted-model",  "messages": [{"role": "user", "content": "hi"}],'
        b' "tools": ' + orjson.dumps(TOOLS) + b', "vendor_extension": {"top_k": 7}, "min_p": 0.1}'
    )
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        content=body,
        headers={"content-type": "application/json", "x-custom": "kept"},
    )
    assert response.status_code == 200
    received = upstream.requests[-1]
    assert received.body == body
    assert received.headers["x-custom"] == "kept"
    assert response.content == orjson.dumps(reply.body)


def test_request_without_tools_is_not_validated(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(completion(content=""))
    with _client(proxy) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="scripted-model", messages=MESSAGES
        )
    assert raw.headers["x-repairproxy-tool-errors"] == ""


def test_legacy_functions_are_validated(upstream: ScriptedUpstream, proxy: RunningProxy) -> None:
    body = completion(finish_reason="function_call").body
    body["choices"][0]["message"]["function_call"] = {"name": "get_order", "arguments": "{}"}
    upstream.push(Reply(body=body))
    functions = [t["function"] for t in TOOLS]
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES, "functions": functions},
    )
    assert response.status_code == 200
    assert response.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert response.json()["choices"][0]["message"]["function_call"]["name"] == "get_order"


@pytest.mark.anyio
async def test_async_client_parallel_tool_calls(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    calls = [
        tool_call("get_order_details", {"order_id": "#W1"}),
        tool_call("find_user_id_by_email", {"email": "a@b.c"}),
    ]
    upstream.push(completion(tool_calls=calls))
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="scripted-model", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=True
        )
    assert raw.headers["x-repairproxy-tool-errors"] == ""
    message = raw.parse().choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls
    ]
    assert upstream.chat_requests[-1]["parallel_tool_calls"] is True


def _collect_stream(chunks: Any) -> tuple[str, dict[int, dict[str, str]], str | None, Any]:
    content, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += part.id or ""
                if part.function is not None:
                    call["name"] += part.function.name or ""
                    call["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish, usage


@pytest.mark.parametrize("case", ["valid", "hallucinated_name", "parallel_mixed", "plain_text"])
def test_streaming_passes_calls_through(
    case: str, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    reply, expected = CASES[case]
    upstream.push(reply)
    message = reply.body["choices"][0]["message"]
    with (
        _client(proxy) as client,
        client.chat.completions.with_streaming_response.create(
            model="scripted-model",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        ) as raw,
    ):
        headers = raw.headers
        content, calls, finish, usage = _collect_stream(raw.parse())
    assert content == (message["content"] or "")
    assert [calls[i] for i in sorted(calls)] == [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]
    assert finish == reply.body["choices"][0]["finish_reason"]
    assert usage is not None and usage.total_tokens == reply.body["usage"]["total_tokens"]
    if case == "plain_text":
        # Prose streams at once, so the verdict rides in a trailing SSE comment, not a header.
        assert "x-repairproxy-tool-errors" not in headers
    else:
        assert headers["x-repairproxy-tool-errors"] == expected


def test_streaming_plain_text_trailer_carries_the_verdict(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(completion(content="Your order ships tomorrow."))
    with httpx.stream(
        "POST",
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True},
    ) as response:
        body = response.read()
    assert b": x-repairproxy tool-errors= repairs=0" in body
    assert body.rstrip().endswith(b"data: [DONE]")


def test_streaming_without_tools_is_relayed_raw(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(completion(content="hello there, streaming"))
    with _client(proxy) as client:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        content, calls, finish, _ = _collect_stream(stream)
    assert (content, calls, finish) == ("hello there, streaming", {}, "stop")


def test_one_log_line_per_request_without_prompt_text(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    reply, _ = CASES["hallucinated_name"]
    upstream.push(reply)
    with _client(proxy) as client:
        client.chat.completions.create(
            model="scripted-model",
            messages=MESSAGES,
            tools=TOOLS,
            extra_headers={"X-Episode-ID": "ep-7"},
        )
    lines = proxy.log_lines()
    assert len(lines) == 1
    line = lines[0]
    assert line["model"] == "scripted-model"
    assert line["episode_id"] == "ep-7"
    assert line["channels"] == ["unknown_tool"]
    assert line["status"] == 200
    assert line["latency_ms"] >= line["overhead_ms"] >= 0
    assert "retail support agent" not in orjson.dumps(line).decode()


def test_log_bodies_flag_logs_prompt_text(upstream: ScriptedUpstream, start_proxy: Any) -> None:
    proxy = start_proxy(log_bodies=True)
    upstream.push(completion(content="ok"))
    with _client(proxy) as client:
        client.chat.completions.create(model="scripted-model", messages=MESSAGES)
    assert "retail support agent" in proxy.log_lines()[0]["request_body"]


def test_proxy_in_front_of_a_uvicorn_upstream(upstream: ScriptedUpstream, start_proxy: Any) -> None:
    """Chained proxies: the upstream pool speaks to uvicorn (keep-alive, chunked SSE) too."""
    inner = start_proxy()
    outer = start_proxy(upstream=inner.base_url)
    reply, expected = CASES["hallucinated_name"]
    for _ in range(2):
        upstream.push(reply)
        with _client(outer) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="scripted-model", messages=MESSAGES, tools=TOOLS
            )
        assert raw.http_response.content == orjson.dumps(reply.body)
        assert raw.headers["x-repairproxy-tool-errors"] == expected
    upstream.push(reply)
    with _client(outer) as client:
        stream = client.chat.completions.create(
            model="scripted-model", messages=MESSAGES, tools=TOOLS, stream=True
        )
        _, calls, finish, _ = _collect_stream(stream)
    assert calls[0]["name"] == "get_order_status"
    assert finish == "tool_calls"
