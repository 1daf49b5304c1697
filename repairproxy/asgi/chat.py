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

from repairproxy.asgi.call import PipelineCall
from repairproxy.asgi.gate import DONE_EVENT, SSEParser, ToolCallGate, completion_to_chunks
from repairproxy.asgi.responder import Responder
from repairproxy.pipeline import ChatRequest, json_object
from repairproxy.types import HeaderList, Outcome
from repairproxy.upstream.client import chat_completion_of
from repairproxy.validation import text_calls_allowed
from repairproxy.wire.openai import ChatCompletion

__all__ = ["CHAT_PATH", "ChatCall"]

CHAT_PATH = "/v1/chat/completions"


class ChatCall(PipelineCall):
    """One chat completion in flight: forward, let the pipeline judge, frame the answer."""

    async def prepare(self, raw: bytes) -> ChatRequest:
        """Parse, admit, and build the body that goes upstream."""
        request = await self._open(json_object(raw), raw)
        self.pipeline.prepare_forward(request)
        return request

    @property
    def _chat(self) -> ChatRequest:
        assert self.request is not None  # prepare() ran
        return self.request

    async def _reask(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        return await self.upstream.complete(chat_body, self.out_headers, self.ex.timer)

    async def buffered(self, responder: Responder) -> None:
        ex = self.ex
        reply = await self.upstream.request(
            "POST", CHAT_PATH, self.out_headers, self._chat.forward_raw, ex.timer, self.query
        )
        content = reply.content
        if 200 <= reply.status_code < 300:
            outcome = await self._decide(chat_completion_of(reply.content, reply.status_code))
            if outcome.changed:
                content = orjson.dumps(outcome.answer)
        else:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        if self.pipeline.settings.log_bodies:
            ex.record.response_body = content
        await self.send_whole(responder, reply, content)

    async def stream(self, responder: Responder) -> None:
        request = self._chat
        plain = request.tools is None and request.output is None
        relay = self._relay_plain if plain else self._relay_gated
        await self._stream(CHAT_PATH, request.forward_raw, responder, relay)

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
        request = self._chat
        gate = ToolCallGate(
            hold_text=text_calls_allowed(request.body),
            hold_all=request.output is not None,
            tool_names=request.tools.names if request.tools is not None else (),
        )
        upstream_error = False
        async for chunk in chunks:
            for event in parser.feed(chunk):
                data = event.data  # the byte test inline: most events hold no '"error"'
                if not upstream_error and data is not None and b'"error"' in data:
                    upstream_error = _is_error_event(data)
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
            outcome = await self._decide(cast(ChatCompletion, gate.assembler.completion()))
            if outcome.changed:
                tail = completion_to_chunks(
                    gate.unsent(outcome.answer),  # the prose already sent is not sent again
                    gate.assembler.meta,
                    include_content=True,
                    include_role=not gate.released_content,
                    include_usage=request.include_usage,
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
