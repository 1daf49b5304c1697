"""The embedded model's OpenAI-compatible server: /v1/models, /v1/chat/completions, /health.

Inference runs in a worker thread (the engine holds its own lock), so the event loop keeps answering
health checks while a request decodes. Streaming relays text from that thread through a queue; a
client that disconnects stops the decode at the next token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from repairproxy.local.chat import (
    ChatPlan,
    InvalidChatRequest,
    chunk,
    completion_body,
    finish_reason,
    plan_chat,
    usage_body,
)
from repairproxy.local.engine import ContextOverflowError, Generation, SamplingParams, TokenLogprob
from repairproxy.local.grammar import SchemaToGbnf
from repairproxy.local.hermes import HermesStreamSplitter, ParsedOutput

__all__ = ["AnswerLog", "GenerateFn", "create_app"]


class GenerateFn(Protocol):
    def __call__(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        on_delta: Any = None,
        cancelled: threading.Event | None = None,
    ) -> Generation: ...


def _error(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _objects(value: Any, field: str) -> str | None:
    """Why ``value`` is not a list of objects whose ``function`` (where present) is an object."""
    if not isinstance(value, list):
        return f"{field} must be an array"
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            return f"{field}[{index}] must be an object"
        function = item.get("function", item)
        if not isinstance(function, dict):
            return f"{field}[{index}].function must be an object"
        name = function.get("name")
        if name is not None and not isinstance(name, str):
            return f"{field}[{index}].function.name must be a string"
    return None


def _shape_error(body: dict[str, Any]) -> tuple[str, str] | None:
    """(message, param) for a field whose shape the prompt renderer cannot read, else None."""
    for field in ("tools", "functions"):
        if body.get(field) is not None and (why := _objects(body[field], field)):
            return why, field
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return "stream_options must be an object", "stream_options"
    messages = body.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls is not None and (why := _objects(calls, f"messages[{index}].tool_calls")):
            return why, "messages"
        legacy = message.get("function_call") if isinstance(message, dict) else None
        if legacy and not isinstance(legacy, dict):
            return f"messages[{index}].function_call must be an object", "messages"
    return None


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class AnswerLog:
    """One JSON line per answer: the raw text the model wrote (before any parsing) and its timing.

    For demos and benchmarks that show what the model wrote before a proxy changed it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, generation: Generation) -> None:
        if generation.finish_reason == "cancelled":
            return  # the client left: nobody saw this answer
        line = orjson.dumps(
            {
                "text": generation.text,
                "finish_reason": generation.finish_reason,
                "prompt_tokens": generation.prompt_tokens,
                "cached_tokens": generation.cached_tokens,
                "completion_tokens": generation.completion_tokens,
                "prefill_seconds": round(generation.prefill_seconds, 3),
                "decode_seconds": round(generation.decode_seconds, 3),
                "prefix_source": generation.prefix_source,
            }
        )
        with self._lock, self.path.open("ab") as handle:
            handle.write(line + b"\n")


async def _stream(
    plan: ChatPlan, model: str, generate: GenerateFn, answers: AnswerLog | None
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, list[TokenLogprob]] | None] = asyncio.Queue()
    cancelled = threading.Event()

    def on_delta(text: str, logprobs: list[TokenLogprob]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (text, logprobs))

    def run() -> Generation:
        try:
            return generate(plan.prompt, plan.params, on_delta=on_delta, cancelled=cancelled)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    job = loop.run_in_executor(None, run)
    splitter = HermesStreamSplitter() if plan.parse_tools else None
    # Logprobs of unsent tokens ride on the next chunk; those of held tool-call text on the call.
    held: list[TokenLogprob] = []
    try:
        yield _sse(chunk(plan, model, {"role": "assistant", "content": ""}))
        while (item := await queue.get()) is not None:
            text, logprobs = item
            held.extend(logprobs)
            out = splitter.feed(text) if splitter else text
            if out:
                yield _sse(chunk(plan, model, {"content": out}, logprobs=held))
                held = []
        try:
            generation = await job
        except ContextOverflowError as exc:
            error = {"message": str(exc), "type": "invalid_request_error", "param": "messages"}
            yield _sse({"error": {**error, "code": "context_length_exceeded"}})
            return
        if answers is not None:
            answers.write(generation)
        rest, parsed = splitter.finish() if splitter else ("", ParsedOutput(generation.text))
        if rest:
            yield _sse(chunk(plan, model, {"content": rest}, logprobs=held))
            held = []
        for index, call in enumerate(parsed.tool_calls):
            head = {"index": index, "id": call.id, "type": "function"}
            named = {**head, "function": {"name": call.name, "arguments": ""}}
            yield _sse(chunk(plan, model, {"tool_calls": [named]}, logprobs=held))
            held = []
            args = {"index": index, "function": {"arguments": call.arguments}}
            yield _sse(chunk(plan, model, {"tool_calls": [args]}))
        finish = finish_reason(plan, parsed, generation)
        yield _sse(chunk(plan, model, {}, logprobs=held, finish=finish))
        if plan.include_usage:
            yield _sse(chunk(plan, model, None, usage=usage_body(generation)))
        yield b"data: [DONE]\n\n"
    finally:
        cancelled.set()  # the client went away (or we are done): stop decoding at the next token


async def _watch_disconnect(request: Request, cancelled: threading.Event) -> None:
    """A client that gave up (timeout, ctrl-C) frees the model instead of waiting for the answer."""
    while not cancelled.is_set():
        if await request.is_disconnected():
            cancelled.set()
            return
        await asyncio.sleep(0.25)


def create_app(
    generate: GenerateFn,
    model: str,
    schema_to_gbnf: SchemaToGbnf | None = None,
    *,
    answer_log: Path | None = None,
) -> Starlette:
    """The ASGI app around one ``generate`` function (the engine's, or a fake in unit tests).

    ``answer_log``: append each answer's raw text and timing there (``AnswerLog``).
    """
    answers = AnswerLog(answer_log) if answer_log is not None else None

    async def models(_: Request) -> Response:
        card = {"id": model, "object": "model", "created": 0, "owned_by": "repairproxy-local"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model})

    async def chat_completions(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, "the request body is not valid JSON", code="invalid_json")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        if (shape := _shape_error(body)) is not None:
            return _error(400, shape[0], param=shape[1])
        try:
            plan = plan_chat(body, schema_to_gbnf)
        except InvalidChatRequest as exc:
            return _error(400, str(exc), param=exc.param)
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
            # A shape the checks above do not name still is the client's: a 400, never a 500.
            return _error(400, f"malformed request: {type(exc).__name__}: {exc}"[:300])
        if plan.stream:
            return StreamingResponse(
                _stream(plan, model, generate, answers), media_type="text/event-stream"
            )
        cancelled = threading.Event()
        job = asyncio.get_running_loop().run_in_executor(
            None, lambda: generate(plan.prompt, plan.params, cancelled=cancelled)
        )
        watcher = asyncio.ensure_future(_watch_disconnect(request, cancelled))
        try:
            generation = await job
        except ContextOverflowError as exc:
            return _error(400, str(exc), param="messages", code="context_length_exceeded")
        finally:
            watcher.cancel()
        if answers is not None:
            answers.write(generation)
        return Response(
            orjson.dumps(completion_body(plan, model, generation)), media_type="application/json"
        )

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)
