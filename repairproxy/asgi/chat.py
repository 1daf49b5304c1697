"""A chat completion framed over HTTP: one JSON body, or an SSE stream whose tool-call events are
held by the gate until the pipeline has judged the assembled answer.

Both shapes hand the pipeline the same thing (a whole ``chat.completion``) and send back what it
decides; a stream whose prose already left gets the verdict as an SSE comment before ``[DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, cast

import orjson

from repairproxy.asgi.exchange import Exchange
from repairproxy.asgi.gate import DONE_EVENT, SSEParser, ToolCallGate, completion_to_chunks
from repairproxy.asgi.responder import Responder
from repairproxy.pipeline import ChatOutcome, ChatPipeline, ChatRequest
from repairproxy.types import HeaderList, Outcome, Scope
from repairproxy.upstream.client import (
    Upstream,
    chat_completion_of,
    response_headers,
    timed,
)
from repairproxy.validation import text_calls_allowed
from repairproxy.wire.openai import ChatCompletion

__all__ = ["CHAT_PATH", "ChatCall"]

CHAT_PATH = "/v1/chat/completions"


def _choice_channels(request: ChatRequest, outcome: ChatOutcome) -> tuple[tuple[str, ...], ...]:
    """Each choice's error channels when the answer has several (``n > 1``): choice 0 as judged,
    the others checked as they are (only choice 0 is repaired)."""
    choices = outcome.answer.get("choices") if isinstance(outcome.answer, dict) else None
    if request.tools is None or not isinstance(choices, list) or len(choices) < 2:
        return ()
    found = [outcome.caught]
    for choice in choices[1:]:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            found.append(())
            continue
        verdict = request.tools.check_message(message)
        found.append(tuple(channel.value for channel in verdict.error_channels))
    return tuple(found)


class ChatCall:
    """One chat completion in flight: forward, let the pipeline judge, frame the answer."""

    def __init__(
        self,
        upstream: Upstream,
        pipeline: ChatPipeline,
        ex: Exchange,
        request: ChatRequest,
        scope: Scope,
        log_bodies: bool,
    ) -> None:
        self.upstream = upstream
        self.pipeline = pipeline
        self.ex = ex
        self.request = request
        self.log_bodies = log_bodies
        self.query: bytes = scope["query_string"]
        self.out_headers = upstream.outbound_headers(scope["headers"], keep_encoding=False)

    async def _reask(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.upstream.complete(body, self.out_headers, self.ex.timer)

    async def _judge(self, completion: ChatCompletion) -> ChatOutcome:
        ex = self.ex
        outcome = await self.pipeline.judge(self.request, completion, self._reask, ex.record)
        ex.choice_channels = _choice_channels(self.request, outcome)
        await self.pipeline.remember(self.request, outcome.answer)
        return outcome

    async def buffered(self, responder: Responder) -> None:
        ex = self.ex
        reply = await self.upstream.request(
            "POST", CHAT_PATH, self.out_headers, self.request.forward_raw, ex.timer, self.query
        )
        content = reply.content
        if 200 <= reply.status_code < 300:
            outcome = await self._judge(chat_completion_of(reply.content, reply.status_code))
            if outcome.changed:
                content = orjson.dumps(outcome.answer)
        else:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        ex.status = reply.status_code
        ex.response_body = content if self.log_bodies else None
        headers = response_headers(reply.headers)
        headers.extend(ex.proxy_headers())
        responder.first_byte_at = time.perf_counter()
        await responder.whole(reply.status_code, headers, content)

    async def stream(self, responder: Responder) -> None:
        ex = self.ex
        upstream = self.upstream
        async with upstream.stream(
            "POST", CHAT_PATH, self.out_headers, self.request.forward_raw, ex.timer, self.query
        ) as response:
            base_headers = response_headers(response.headers)
            content_type = response.header(b"content-type") or b""
            if response.status_code != 200 or b"text/event-stream" not in content_type:
                with upstream.reading():
                    content = await response.read()
                ex.status = response.status_code
                if response.status_code >= 300:
                    ex.record.outcome = Outcome.UPSTREAM_ERROR
                base_headers.extend(ex.proxy_headers())
                await responder.whole(response.status_code, base_headers, content)
                return
            ex.status = 200
            with upstream.reading():
                chunks = timed(response.iter_body(), ex.timer)
                if self.request.tools is None and self.request.output is None:
                    await self._relay_plain(chunks, responder, base_headers)
                else:
                    await self._relay_gated(chunks, responder, base_headers)

    async def _relay_plain(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        headers.extend(self.ex.proxy_headers(verdict=False))
        await responder.start(200, headers)
        async for chunk in chunks:
            if responder.first_byte_at is None:
                responder.first_byte_at = time.perf_counter()
            await responder.body(chunk)
        await responder.body(b"", more=False)

    async def _relay_gated(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        ex = self.ex
        parser = SSEParser()
        # tool_choice none: text is text, so nothing is held for a possible text call
        gate = ToolCallGate(
            hold_text=text_calls_allowed(self.request.body),
            hold_all=self.request.output is not None,
        )
        upstream_error = False
        async for chunk in chunks:
            for event in parser.feed(chunk):
                upstream_error = upstream_error or _is_error_event(event.data)
                released = gate.feed(event)
                if released:
                    if not responder.started:
                        await responder.start(200, [*headers, *ex.proxy_headers(verdict=False)])
                        responder.first_byte_at = time.perf_counter()
                    await responder.body(b"".join(released))
        for event in parser.flush():
            upstream_error = upstream_error or _is_error_event(event.data)
            gate.feed(event)
        tail = list(gate.held)
        if upstream_error:  # the upstream's own in-band error: passed through, not "repaired"
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        else:
            outcome = await self._judge(cast(ChatCompletion, gate.assembler.completion()))
            if outcome.changed:
                tail = completion_to_chunks(
                    gate.unsent(outcome.answer),  # the prose already sent is not sent again
                    gate.assembler.meta,
                    include_content=True,
                    include_role=not gate.released_content,
                    include_usage=self.request.include_usage,
                )
        if not responder.started:
            await responder.start(200, [*headers, *ex.proxy_headers()])
            responder.first_byte_at = time.perf_counter()
        else:
            trailer = ex.trailer_comment()
            if tail and tail[-1].strip() == DONE_EVENT.strip():
                tail.insert(len(tail) - 1, trailer)
            else:
                tail.append(trailer)
        await responder.body(b"".join(tail), more=False)


def _is_error_event(data: bytes | None) -> bool:
    if not data or b'"error"' not in data:
        return False
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and "error" in parsed and "choices" not in parsed
