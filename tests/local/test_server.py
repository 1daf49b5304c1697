"""The embedded server's HTTP surface with a scripted generate function (the engine seam)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import openai
import pytest

from repairproxy.local.engine import Generation, SamplingParams, TokenLogprob
from repairproxy.local.server import create_app

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


class Scripted:
    """Replies with fixed text, cut into pieces; records what it was asked."""

    def __init__(self, pieces: list[str], finish: str = "stop") -> None:
        self.pieces = pieces
        self.finish = finish
        self.calls: list[tuple[str, SamplingParams]] = []

    def __call__(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        on_delta: Any = None,
        cancelled: threading.Event | None = None,
    ) -> Generation:
        self.calls.append((prompt, params))
        logprobs = [TokenLogprob(p, -0.5, list(p.encode())) for p in self.pieces]
        for piece, lp in zip(self.pieces, logprobs, strict=True):
            if on_delta is not None:
                on_delta(piece, [lp] if params.logprobs else [])
        return Generation(
            text="".join(self.pieces),
            finish_reason=self.finish,
            prompt_tokens=11,
            completion_tokens=len(self.pieces),
            logprobs=logprobs if params.logprobs else [],
        )


def _client(generate: Scripted) -> openai.AsyncOpenAI:
    transport = httpx.ASGITransport(app=create_app(generate, "test-model"))
    http = httpx.AsyncClient(transport=transport, base_url="http://local")
    return openai.AsyncOpenAI(base_url="http://local/v1", api_key="x", http_client=http)


CALL = [
    "Let me check. ",
    "<tool_call>",
    '\n{"name": "get_order_details", ',
    '"arguments": {"order_id": "#W1"}}',
    "\n</tool_call>",
]


@pytest.mark.anyio
async def test_tool_call_non_streaming_with_usage_and_logprobs() -> None:
    fake = Scripted(CALL)
    async with _client(fake) as client:
        reply = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            logprobs=True,
            top_logprobs=1,
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_order_details"
    assert json.loads(call.function.arguments) == {"order_id": "#W1"}
    assert reply.usage is not None and reply.usage.prompt_tokens == 11
    assert reply.usage.completion_tokens == len(CALL)
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == len(CALL)


@pytest.mark.anyio
async def test_a_text_answer_carries_no_tool_calls_field_as_openai() -> None:
    """OpenAI omits ``tool_calls`` when there are none; vLLM sends ``[]`` (the proxy reads both:
    tests/proxy)."""
    transport = httpx.ASGITransport(app=create_app(Scripted(["Hello."]), "test-model"))
    async with httpx.AsyncClient(transport=transport, base_url="http://local") as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        reply = (await http.post("/v1/chat/completions", json=body)).json()
    message = reply["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hello."}


@pytest.mark.anyio
async def test_tool_call_streaming_assembles_like_openai() -> None:
    fake = Scripted(CALL)
    async with _client(fake) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
        )
        content, names, args, finish, usage, n_logprobs = "", [], "", None, None, 0
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                n_logprobs += len((choice.logprobs.content or []) if choice.logprobs else [])
                for tc in choice.delta.tool_calls or []:
                    if tc.function and tc.function.name:
                        names.append(tc.function.name)
                    args += (tc.function.arguments or "") if tc.function else ""
                finish = choice.finish_reason or finish
    assert content == "Let me check. "
    assert names == ["get_order_details"]
    assert json.loads(args) == {"order_id": "#W1"}
    assert finish == "tool_calls"
    assert usage is not None and usage.total_tokens == 11 + len(CALL)
    assert n_logprobs == len(CALL)  # tool-call tokens carry logprobs too


@pytest.mark.anyio
async def test_broken_call_streams_back_as_text() -> None:
    pieces = ["<tool_call>", '{"name": "get_order_details", "arguments": {']
    async with _client(Scripted(pieces, finish="length")) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS, stream=True
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(pieces)
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.anyio
async def test_models_and_errors() -> None:
    app = create_app(Scripted(["x"]), "test-model")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://l"
    ) as http:
        models = (await http.get("/v1/models")).json()
        bad_json = await http.post("/v1/chat/completions", content=b"{")
        bad_field = await http.post("/v1/chat/completions", json={"messages": [], "model": "m"})
    assert [m["id"] for m in models["data"]] == ["test-model"]
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    assert bad_field.status_code == 400 and bad_field.json()["error"]["param"] == "messages"


@pytest.mark.anyio
async def test_request_parameters_reach_the_engine() -> None:
    fake = Scripted(["ok"])
    async with _client(fake) as client:
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=5,
            temperature=0,
            seed=9,
            stop=["\n\n"],
        )
    prompt, params = fake.calls[0]
    assert prompt.endswith("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    assert (params.max_tokens, params.temperature, params.seed, params.stop) == (
        5,
        0.0,
        9,
        ("\n\n",),
    )


@pytest.mark.anyio
async def test_the_answer_log_keeps_the_raw_text_streamed_or_not(tmp_path: Any) -> None:
    log = tmp_path / "answers.jsonl"
    text = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    app = create_app(Scripted([text[:10], text[10:]]), "test-model", answer_log=log)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://local")
    async with openai.AsyncOpenAI(
        base_url="http://local/v1", api_key="x", http_client=http
    ) as client:
        request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        await client.chat.completions.create(**request, tools=TOOLS)
        stream = await client.chat.completions.create(**request, stream=True)
        _ = [c async for c in stream]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["text"] for line in lines] == [text, text]
    assert lines[0]["prompt_tokens"] == 11 and lines[0]["prefix_source"] == "none"


_USER = {"role": "user", "content": "x"}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": [_USER, {"role": "assistant", "tool_calls": "call"}]}, "messages"),
        ({"messages": [_USER, {"role": "assistant", "tool_calls": [7]}]}, "messages"),
        (
            {"messages": [_USER, {"role": "assistant", "tool_calls": [{"function": "f"}]}]},
            "messages",
        ),
        ({"messages": [_USER, {"role": "assistant", "function_call": "f"}]}, "messages"),
        ({"tools": [{"type": "function", "function": "get_order_details"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": 7}}]}, "tools"),
        ({"tools": {"a": 1}}, "tools"),
        ({"functions": ["get_order_details"]}, "functions"),
        ({"functions": {"name": "f"}}, "functions"),
        ({"stream": True, "stream_options": "include_usage"}, "stream_options"),
        ({"stream_options": [1]}, "stream_options"),
    ],
)
async def test_malformed_fields_are_400_naming_them(extra: dict[str, Any], param: str) -> None:
    fake = Scripted(["x"])
    app = create_app(fake, "test-model")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://l") as http:
        body = {"model": "m", "messages": [_USER], **extra}
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake.calls == []  # nothing reached the engine
