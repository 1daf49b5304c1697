"""A chat-completions upstream's stream told as another API's stream, written once.

The Responses and Messages adapters serve an upstream that speaks chat completions only (the
embedded model, llama.cpp) by asking it for a chat stream: ``ask_chat_stream`` opens it (an error
or a JSON answer is handled whole), ``ChatTextRelay`` lets its text through the chat stream gate
(prose flows; calls, text that could open a call and a structured output are held) as the
adapter's own text events, and the adapter frames the judged rest. ``keep_alive`` keeps a stream
that is under way talking while its answer is judged (a held call re-asked), so neither the
client nor a proxy in between drops a quiet connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson

from repairproxy.asgi.gate import SSEParser, ToolCallGate
from repairproxy.errors import UpstreamBadAnswerError
from repairproxy.types import HeaderList, Outcome
from repairproxy.upstream.client import UpstreamReply, chat_completion_of, timed
from repairproxy.validation import text_calls_allowed
from repairproxy.wire.openai import ChatCompletion

if TYPE_CHECKING:
    from repairproxy.asgi.call import PipelineCall
    from repairproxy.asgi.responder import Responder

__all__ = [
    "CHAT_PATH",
    "KEEP_ALIVE_SECONDS",
    "ChatTextRelay",
    "ask_chat_stream",
    "chat_text",
    "keep_alive",
    "payload_of",
]

CHAT_PATH = "/v1/chat/completions"
# While a stream under way waits for its verdict, the client hears from the proxy this often
# (Anthropic pings idle streams; an SSE comment does the same for an OpenAI client).
KEEP_ALIVE_SECONDS = 5.0
_T = TypeVar("_T")

# The bytes a released piece of text leaves as, in the adapter's API: (the piece, the upstream
# stream's metadata (id, model, ...) with the first piece, None after it).
TextFrames = Callable[[str, Mapping[str, Any] | None], bytes]


def payload_of(data: bytes | None) -> dict[str, Any]:
    """An event's JSON object; empty for a comment, ``[DONE]`` or anything not an object."""
    if not data:
        return {}
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def chat_text(chunk: Mapping[str, Any]) -> str:
    """The text a chat stream chunk adds to choice 0."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return ""
    delta = choices[0].get("delta")
    text = delta.get("content") if isinstance(delta, Mapping) else None
    return text if isinstance(text, str) else ""


async def ask_chat_stream(
    call: PipelineCall,
    responder: Responder,
    *,
    relay: Callable[[AsyncIterable[bytes]], Awaitable[None]],
    whole: Callable[[ChatCompletion], Awaitable[None]],
    error: Callable[[UpstreamReply], UpstreamReply] | None = None,
) -> None:
    """Ask the chat upstream for the request's answer as a stream (usage included): an event
    stream goes to ``relay``; a JSON answer to ``whole``; an error answer is sent on whole,
    in the adapter's shape (``error``)."""
    ex, upstream = call.ex, call.upstream
    assert call.request is not None
    forward = dict(call.request.forward or call.request.body)
    forward.update(stream=True, stream_options={"include_usage": True})
    async with upstream.stream(
        "POST", CHAT_PATH, call.out_headers, orjson.dumps(forward), ex.timer, call.query
    ) as response:
        content_type = response.header(b"content-type") or b""
        if response.status_code != 200 or b"text/event-stream" not in content_type:
            with upstream.reading():
                content = await response.read()
            if not 200 <= response.status_code < 300:
                ex.record.outcome = Outcome.UPSTREAM_ERROR
                reply = UpstreamReply(response.status_code, response.headers, content)
                reply = error(reply) if error is not None else reply
                await call.send_whole(responder, reply, reply.content)
                return
            await whole(chat_completion_of(content, response.status_code))
            return
        ex.record.status = 200
        with upstream.reading():
            await relay(timed(response.iter_body(), ex.timer))


class ChatTextRelay:
    """One chat stream through the chat stream gate: each piece of text the gate releases
    leaves at once as the adapter's events (``frames``), the first behind the stream's head
    (``headers`` and the verdict-less proxy headers); the rest is held for the verdict."""

    def __init__(
        self, call: PipelineCall, responder: Responder, headers: HeaderList, frames: TextFrames
    ) -> None:
        request = call.request
        assert request is not None
        self.gate = ToolCallGate(
            hold_text=request.tools is not None and text_calls_allowed(request.body),
            hold_all=request.output is not None,  # a structured output is held whole
            tool_names=request.tools.names if request.tools is not None else (),
        )
        self.sent: list[str] = []  # the text pieces the client has
        # The upstream's own in-band error (an object with ``error`` and no ``choices``).
        self.upstream_error: dict[str, Any] | None = None
        self._call = call
        self._responder = responder
        self._headers = headers
        self._frames = frames

    async def run(self, chunks: AsyncIterable[bytes]) -> None:
        parser = SSEParser()
        async for chunk in chunks:
            for event in parser.feed(chunk):
                payload = payload_of(event.data)
                if "error" in payload and "choices" not in payload:
                    self.upstream_error = self.upstream_error or payload
                await self._release(self.gate.feed(event))
        for event in parser.flush():
            await self._release(self.gate.feed(event))

    def completion(self) -> ChatCompletion:
        """The whole answer the stream held (raises when it held none)."""
        assembler = self.gate.assembler
        if not assembler.meta:
            raise UpstreamBadAnswerError("the upstream's chat stream held no chat completion")
        return cast(ChatCompletion, assembler.completion())

    def rest(self, text: str) -> str:
        """What of ``text`` (the judged answer's) the client does not have: the text after the
        released prose, or nothing when the answer no longer begins with it (a re-ask's)."""
        left = self.gate.unsent({"choices": [{"message": {"content": text}}]})
        more = left["choices"][0]["message"].get("content")
        return more if isinstance(more, str) else ""

    async def _release(self, raws: list[bytes]) -> None:
        responder = self._responder
        for raw in raws:
            for event in SSEParser().feed(raw):
                piece = chat_text(payload_of(event.data))
                if not piece:
                    continue
                meta: Mapping[str, Any] | None = None
                if not self.sent:
                    meta = self.gate.assembler.meta
                    if not responder.started:
                        headers = [*self._headers, *self._call.ex.proxy_headers(verdict=False)]
                        await responder.start(200, headers)
                        responder.first_byte_at = time.perf_counter()
                self.sent.append(piece)
                await responder.body(self._frames(piece, meta))


async def keep_alive(responder: Responder, work: Awaitable[_T], beat: bytes) -> _T:
    """``work``'s result; a stream already under way is sent ``beat`` every
    ``KEEP_ALIVE_SECONDS`` until it is done (one that has not started waits in silence: its
    headers carry the verdict)."""
    if not responder.started:
        return await work
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=KEEP_ALIVE_SECONDS)
            if done:
                return task.result()
            await responder.body(beat)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
